"""The course text's checkable figures, held against the notebooks' stored outputs.

The course text (three seed files, named here by their number) shows outputs and states facts that a
learner can compare against a run. Each FIGURES row names one: the seed, the figure as the text states it,
the notebook, and a regex (re.MULTILINE) that must match the text outputs of one *compared* code cell on the
notebook's core path: before the Markdown heading "Going deeper", and not tagged nbval-ignore-output or
nbval-skip, so that nbval holds the figure on every run. Figures without such an output are in NOT_COMPARED,
with where they are instead.

Seeds: 000 = "Pack the bag smarter: single-GPU tricks" (Module 4), 002 = "Memory, quantization and other
methods", 004 = "Mixed Precision, Gradient Accumulation, and Memory".
"""
import json
import re
from pathlib import Path

import pytest
from test_memory import LESSON_TABLE_TOP

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SEEDS = ("000", "002", "004")
QUANT, QLORA, PRECISION = "01_quantization.ipynb", "01b_real_models_qlora.ipynb", "02_mixed_precision.ipynb"
ACCUM, BUDGET, TRICKS = "03_gradient_accumulation.ipynb", "04_memory_budget.ipynb", "05_memory_tricks.ipynb"

# The estimator's printed table in 002 ("python -m adapt memory"), line by line as the text shows it.
MEMORY_TABLE = LESSON_TABLE_TOP

FIGURES = [
    # 000, quantization
    ("000", "Prints both sizes and a short answer (the answer is right)", QLORA, r"every answer names Paris: True"),
    ("000", "4-bit weights need about a quarter of the memory of 16-bit ones", QUANT,
     r"16 bits:\s+14\.0 GB[\s\S]*4 bits:\s+3\.5 GB"),
    ("000", "int8, z = 0: the biggest number lands exactly on 127", QUANT, r"stored \[50, -127, 2, 100\]"),
    ("000", "float32: 67 MB", QUANT, r"^float32: 67 MB$"),
    ("000", "int8:    17 MB, average error 0.010", QUANT, r"^int8:\s+17 MB, average error 0\.010$"),
    ("000", "int4:    8 MB, average error 0.189", QUANT, r"^int4:\s+8 MB, average error 0\.189$"),
    ("000", "Prints both sizes: 16-bit (Qwen2.5-1.5B-Instruct)", QLORA, r"16-bit 3\.09 GB"),
    ("000", "Prints both sizes: 4-bit (Qwen2.5-1.5B-Instruct)", QLORA, r"4-bit 1\.12 GB"),
    ("000", "The 4-bit model is about a third of the 16-bit size, not a quarter", QLORA,
                 r"1\.12 GB \(36 % of 16-bit"),
    ("000", "Prints how many parameters you will train: under 1% of the model (Qwen3-4B, r=16)", QLORA,
                 r"Qwen3-4B\S*: trainable params: .*trainable%: 0\.81\b"),
    # 000, mixed precision
    ("000", "an H100 does about 990 TFLOPS in bfloat16, against 67 in float32", PRECISION,
     r"H100 SXM\s+16-bit tensor cores\s+989 TFLOP/s, float32 67\.0"),
    ("000", "16-bit activations take half the memory", PRECISION,
     r"torch\.float32 : 128 MiB\n.*torch\.bfloat16: 64 MiB"),
    ("000", "weights, gradients and Adam still need about 16 bytes per parameter", PRECISION,
     r"model state with Adam: 16 bytes per parameter"),
    ("000", "float16 overflows above 65,504", PRECISION,
     r"1e\+05 \|\s+1e\+05 \|\s+99840 \|\s+inf\n\s+65504 \|\s+65504 \|\s+65536 \|\s+65504$"),
    ("000", "weights:  torch.float32", PRECISION, r"^weights:\s+torch\.float32$"),
    ("000", "output:   torch.bfloat16", PRECISION, r"^output:\s+torch\.bfloat16$"),
    ("000", "loss:     torch.float32", PRECISION, r"^loss:\s+torch\.float32$"),
    ("000", "gradient: torch.float32", PRECISION, r"^gradient:\s+torch\.float32$"),
    ("000", "With float16, the loss scale starts at 65,536", PRECISION, r"^step\s+1: loss scale 65,536$"),
    ("000", "With bfloat16 it stays at 1", PRECISION,
     r"autocast dtype: torch\.bfloat16[\s\S]*loss scaling on: False, loss scale at the end: 1$"),
    # 000, gradient accumulation
    ("000", "a batch of 64 becomes 4 micro-batches of 16", ACCUM, r"^steps for 64 in micro-batches of 16: 4$"),
    ("000", "same gradient: True", ACCUM, r"^same gradient: True$"),
    # 002, the sums
    ("002", "four numbers of 4 bytes ... That is 16 bytes per parameter", BUDGET,
     r"^per trained parameter\s+16 bytes$"),
    ("002", "134,515,008 × 16 bytes = 2.15 GB", BUDGET, r"134,515,008 x 16 bytes =\s+2\.15 GB"),
    ("002", "7,000,000,000 × 16 bytes = 112 GB", BUDGET, r"7,000,000,000 x 16 bytes =\s+112\.00 GB"),
    ("002", "134,515,008 × 4 + 460,800 × 12 bytes = 0.54 GB", BUDGET,
     r"134,515,008 x\s+4 bytes[\s\S]*460,800 x 12 bytes[\s\S]*LoRA on SmolLM2-135M\s+= 0\.54\d* GB"),
    ("002", "For a 7B model, the frozen weights alone are 28 GB", BUDGET, r"7e9 x 4 bytes = 28 GB$"),
    # 002, the 4-bit example and QLoRA
    ("002", "Stored step  2 −1 6 −4 0 −7 4 1", BUDGET, r"^Stored step \(4-bit\)\s+2\s+-1\s+6\s+-4\s+0\s+-7\s+4\s+1$"),
    ("002", "Read back (step × 0.05)  0.10 −0.05 0.30 −0.20 0.00 −0.35 0.20 0.05", BUDGET,
     r"^Read back \(step x 0\.05\)\s+0\.10\s+-0\.05\s+0\.30\s+-0\.20\s+0\.00\s+-0\.35\s+0\.20\s+0\.05$"),
    ("002", "Error  −0.02 0 −0.01 +0.02 −0.02 0 +0.02 −0.02", BUDGET,
     r"^Error\s+-0\.02\s+0\s+-0\.01\s+\+0\.02\s+-0\.02\s+0\s+\+0\.02\s+-0\.02$"),
    ("002", "32 bytes in float32. In 4 bits, they take 4 bytes, plus 4 bytes for the step size", BUDGET,
     r"float32: 32 bytes\. 4 bits: 4 \+ 4 for the step size = 8 bytes"),
    ("002", "QLoRA: For a 7B model, that is 3.79 GB", BUDGET, r"^QLoRA on a 7B model:\s+3\.79 GB$"),
    # 002, the estimator's table (one row per printed line) and the budgets
    *[("002", line, BUDGET, "^" + re.escape(line) + "$") for line in MEMORY_TABLE.splitlines()],
    ("002", "70% of a 16 GB laptop is 11.2 GB; of a 24 GB GPU, 16.8 GB; of an 80 GB GPU, 56 GB", BUDGET,
     r"laptop 16 GB \(70 % line 11\.2 GB\)[\s\S]*GPU 24 GB \(70 % line 16\.8 GB\)[\s\S]*GPU 80 GB \(70 % line 56 GB\)"),
    # 004
    ("004", "batch_size=4 and gradient_accumulation_steps=16: a 64-example gradient", ACCUM, r"^\s+4\s+16\s+1\s+64$"),
    ("004", "gradient_accumulation_steps=8,   # effective batch = 16 (single GPU)", TRICKS, r"effective batch:? 16\b"),
]

# Course figures that no compared core-path output holds (seed, figure, notebook, where it is instead).
NOT_COMPARED = [
    ("000", "Real training often runs 2 to 3 times faster", PRECISION, "prose only (hardware-dependent)"),
    ("000", "largest difference: 6.7e-08", ACCUM, "ignored cell (its digits vary by processor)"),
    ("002", "python -m pytest gives 19 passed", None, "missing: the learner's own project, not a notebook"),
    ("002", "QLoRA needs a GPU library (bitsandbytes); on a laptop CPU it is not an option.", BUDGET,
     "differs: the estimator prints that bitsandbytes 0.50 runs on x86 CPUs too"),
    ("002", "Run the tests. The last line says 21 passed.", None, "missing: the learner's own project"),
    ("002", "LoRA trains 0.34% of any model, as in SmolLM2", BUDGET, "Going deeper; prose only in the core path"),
    ("002", "the run's measured peak is 1.88 GB (1,882 MB), about three and a half times the estimate", BUDGET,
     "ignored cells measure it (machine-dependent); 1.88 GB in prose"),
    ("002", "Usable memory is 70%: 5.6 GB, 33.6 GB and 44.8 GB", BUDGET, "prose only (worked solution)"),
    ("002", "8 GB: a 1.7B model in float32 (6.87 GB) does not fit; 48 GB: the 70B (37.88 GB) does not fit; "
     "64 GB: 7B LoRA in float32 (28.29 GB) fits", BUDGET, "Going deeper (the table for budgets 8, 48, 64)"),
    ("002", "a 7B model has about 52 times the weights of SmolLM2", BUDGET, "prose only (worked solution)"),
    ("002", "9 GB is more than 70% of 12 GB (8.4 GB)", BUDGET, "prose only (knowledge check)"),
    ("004", "bf16: roughly 2x speed", TRICKS, "claim printed as text; measured only in ignored cells, Going deeper"),
    ("004", "The cost: 16x compute time per optimizer step", ACCUM, "prose only, which disputes it"),
    ("004", "gradient_checkpointing: ~50% memory reduction at ~30% speed cost", TRICKS,
     "claim printed as text; measured only in ignored cells, Going deeper"),
    ("004", "torch.compile: 1.2-1.5x speedup on stable shapes", TRICKS,
     "claim printed as text; measured in an ignored cell"),
]

# Checkable figures found in the course text: 66, each a row of FIGURES or NOT_COMPARED.
#   000 (21): quantization 7 (a quarter; 127; the three printed lines float32/int8/int4; Qwen2.5-1.5B 4-bit about
#             a third; QLoRA trains under 1%), mixed precision 11 (990 vs 67 TFLOPS; 2 to 3 times faster; half the
#             activation memory; 16 bytes per parameter; 65,504; the four printed dtype lines; loss scale 65,536;
#             stays at 1), gradient accumulation 3 (64 = 4 x 16; the two printed lines).
#   002 (39): the sums 6 (19 passed; 16 bytes; 2.15 GB; 112 GB; 0.54 GB; 28 GB), the 4-bit example 4 (three table
#             rows; 32 bytes vs 4 + 4), QLoRA 3.79 GB 1, the estimator's output 21 (its 20 printed lines; 21 passed),
#             after it 2 (0.34%; 11.2/16.8/56 GB), the common mistake 1 (1.88 GB measured), the worked solution 3
#             (5.6/33.6/44.8 GB; the three budgets' verdicts; 52 times), the knowledge check 1 (8.4 GB).
#   004 (6): bf16 2x; 4 x 16 = 64; 16x compute; checkpointing ~50 %/~30 %; compile 1.2-1.5x; effective batch 16.
# FIGURES has two more rows than figures: the Qwen2.5-1.5B sizes behind "about a third" (16-bit and 4-bit).
COURSE_FIGURE_COUNT = 66


def _fields(row):
    """A FIGURES row's four fields, whether a tuple or a pytest.param."""
    return tuple(getattr(row, "values", row))


def compared_core_outputs(notebook: str) -> list[str]:
    """The text outputs of each compared code cell before the "Going deeper" heading, one string per cell."""
    cells = json.loads((NOTEBOOKS / notebook).read_text(encoding="utf-8"))["cells"]
    texts = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"^\s*#+.*Going deeper", source, re.MULTILINE):
            break
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "nbval-ignore-output" in tags or "nbval-skip" in tags:
            continue
        parts = []
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                parts.append("".join(out["text"]))
            elif out["output_type"] in ("execute_result", "display_data"):
                parts += ["".join(out["data"][kind]) for kind in ("text/plain", "text/markdown") if kind in out["data"]]
        texts.append("".join(parts))
    return texts


def _id(row) -> str:
    """A short ASCII test id: seed, notebook number, the figure's start."""
    seed, figure, notebook, _ = _fields(row)
    return f"{seed}-{notebook.split('_')[0]}-" + re.sub(r"[^A-Za-z0-9.%]+", "-", figure)[:40].strip("-")


@pytest.mark.parametrize(("seed", "figure", "notebook", "pattern"), FIGURES, ids=[_id(row) for row in FIGURES])
def test_figure_in_a_compared_output(seed, figure, notebook, pattern):
    """The figure appears in a compared core-path output of its notebook."""
    outputs = compared_core_outputs(notebook)
    assert any(re.search(pattern, text, re.MULTILINE) for text in outputs), (
        f"course figure {figure!r} (seed {seed}) is in no compared core-path output of notebooks/{notebook} "
        f"(pattern {pattern!r})")


def test_table_covers_every_course_figure():
    """Every figure found in the course text has a row, and every seed file contributes to FIGURES."""
    assert len(FIGURES) + len(NOT_COMPARED) >= COURSE_FIGURE_COUNT
    seeds = {_fields(row)[0] for row in FIGURES}
    assert seeds == set(SEEDS), f"seed files without a figure: {sorted(set(SEEDS) - seeds)}"
    assert all(notebook is None or (NOTEBOOKS / notebook).exists() for _, _, notebook, _ in NOT_COMPARED)
