"""The course text's checkable figures, held against the notebooks' stored outputs.

The course text (three seed files, named here by their number) shows outputs and states facts that a learner can
compare against a run. Each row names one: the seed, the figure as the text states it (a verbatim quote, typography
aside), the notebook, and a regex (re.MULTILINE) that must match the text outputs of one *compared* code cell on the
notebook's core path: before the Markdown heading "Going deeper", and not tagged nbval-ignore-output or nbval-skip,
so that nbval holds the figure on every run.

- FIGURES: the cell computes the figure with the course's code (course_utils) or torch, so the row checks code.
- LITERAL_FIGURES: the cell only does arithmetic on numbers typed into it (``4 + 4 + 8``, ``7e9 * 4``, a datasheet
  constant, a table of literals). Its output shows the sum the text makes; it is not a check of any code.
- NOT_COMPARED: figures no compared core-path output holds, with where they are instead.

Which figures the text states is derived from the text itself, not typed (see :func:`course_figures`): every line it
shows a program printing, and every number it states with a unit. The text lives beside the repository
(``../shared/seeds``), not in it: where it is absent, only the tests that need it are skipped.

Seeds: 000 = "Pack the bag smarter: single-GPU tricks" (Module 4), 002 = "Memory, quantization and other
methods", 004 = "Mixed Precision, Gradient Accumulation, and Memory".
"""

import json
import re
from pathlib import Path

import pytest
from test_memory import LESSON_TABLE_TOP

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COURSE_TEXT = ROOT.parent / "shared" / "seeds"
SEEDS = ("000", "002", "004")
QUANT, QLORA, PRECISION = "01_quantization.ipynb", "01b_real_models_qlora.ipynb", "02_mixed_precision.ipynb"
ACCUM, BUDGET, TRICKS = "03_gradient_accumulation.ipynb", "04_memory_budget.ipynb", "05_memory_tricks.ipynb"

#: The estimator's printed table in 002 ("python -m adapt memory"), line by line as the text shows it.
MEMORY_TABLE = LESSON_TABLE_TOP.splitlines()
#: The regex of the estimator table's line for one model and method (its GB figure and its verdicts).
_TABLE_ROW = r"^{}\s+{}\s+{}\s"

FIGURES = [
    # 000, quantization
    (
        "000",
        "For int8 with z = 0, the scale is the largest |x| ÷ 127, so the biggest number lands exactly on 127.",
        QUANT,
        r"stored \[50, -127, 2, 100\]",
    ),
    ("000", "float32: 67 MB", QUANT, r"^float32: 67 MB$"),
    ("000", "int8:    17 MB, average error 0.010", QUANT, r"^int8:\s+17 MB, average error 0\.010$"),
    ("000", "int4:    8 MB, average error 0.189", QUANT, r"^int4:\s+8 MB, average error 0\.189$"),
    ("000", "Prints both sizes and a short answer.", QLORA, r"every answer names Paris: True"),
    (
        "000",
        "The 4-bit model is about a third of the 16-bit size, not a quarter",
        QLORA,
        r"16-bit 3\.09 GB[\s\S]*4-bit 1\.12 GB \(36 % of 16-bit",
    ),
    (
        "000",
        "Prints how many parameters you will train: under 1% of the model.",
        QLORA,
        r"Qwen3-4B\S*: trainable params: .*trainable%: 0\.81\b",
    ),
    # 000, mixed precision
    (
        "000",
        "float16 overflows above 65,504",
        PRECISION,
        r"1e\+05 \|\s+1e\+05 \|\s+99840 \|\s+inf\n\s+65504 \|\s+65504 \|\s+65536 \|\s+65504$",
    ),
    ("000", "weights:  torch.float32", PRECISION, r"^weights:\s+torch\.float32$"),
    ("000", "output:   torch.bfloat16", PRECISION, r"^output:\s+torch\.bfloat16$"),
    ("000", "loss:     torch.float32", PRECISION, r"^loss:\s+torch\.float32$"),
    ("000", "gradient: torch.float32", PRECISION, r"^gradient:\s+torch\.float32$"),
    ("000", "With float16, the loss scale starts at 65,536", PRECISION, r"^step\s+1: loss scale 65,536$"),
    (
        "000",
        "With bfloat16 it stays at 1",
        PRECISION,
        r"autocast dtype: torch\.bfloat16[\s\S]*loss scaling on: False, loss scale at the end: 1$",
    ),
    # 000, gradient accumulation
    ("000", "a batch of 64 becomes 4 micro-batches of 16", ACCUM, r"^steps for 64 in micro-batches of 16: 4$"),
    ("000", "same gradient: True", ACCUM, r"^same gradient: True$"),
    # 002, the 4-bit example
    ("002", "Stored step 2 −1 6 −4 0 −7 4 1", BUDGET, r"^Stored step \(4-bit\)\s+2\s+-1\s+6\s+-4\s+0\s+-7\s+4\s+1$"),
    (
        "002",
        "Read back (step × 0.05) 0.10 −0.05 0.30 −0.20 0.00 −0.35 0.20 0.05",
        BUDGET,
        r"^Read back \(step x 0\.05\)\s+0\.10\s+-0\.05\s+0\.30\s+-0\.20\s+0\.00\s+-0\.35\s+0\.20\s+0\.05$",
    ),
    (
        "002",
        "Error −0.02 0 −0.01 +0.02 −0.02 0 +0.02 −0.02",
        BUDGET,
        r"^Error\s+-0\.02\s+0\s+-0\.01\s+\+0\.02\s+-0\.02\s+0\s+\+0\.02\s+-0\.02$",
    ),
    (
        "002",
        "The 8 weights took 32 bytes in float32. In 4 bits, they take 4 bytes, plus 4 bytes for the step size.",
        BUDGET,
        r"float32: 32 bytes\. 4 bits: 4 \+ 4 for the step size = 8 bytes",
    ),
    # 002, the estimator's table (one row per printed line), the figures quoted from it, and the budgets
    *[("002", line, BUDGET, "^" + re.escape(line) + "$") for line in MEMORY_TABLE],
    (
        "002",
        "Full tuning in float32: 112.0 GB. LoRA with the base in float32: 28.3 GB. LoRA with the base in "
        "bfloat16: 14.3 GB. QLoRA with the base in 4 bits: 3.8 GB.",
        BUDGET,
        _TABLE_ROW.format("a 7B model", r"full fine-tuning \(float32\)", r"112\.00")
        + r"[\s\S]*"
        + _TABLE_ROW.format("a 7B model", "LoRA, base in float32", r"28\.29")
        + r"[\s\S]*"
        + _TABLE_ROW.format("a 7B model", "LoRA, base in bfloat16", r"14\.29")
        + r"[\s\S]*"
        + _TABLE_ROW.format("a 7B model", "QLoRA, base in 4 bits", r"3\.79"),
    ),
    (
        "002",
        "LoRA on a 7B model in bfloat16 needs 14.29 GB.",
        BUDGET,
        _TABLE_ROW.format("a 7B model", "LoRA, base in bfloat16", r"14\.29"),
    ),
    (
        "002",
        "then a larger model with LoRA in bfloat16 (1.7B: 3.47 GB)",
        BUDGET,
        _TABLE_ROW.format("a 1.7B model", "LoRA, base in bfloat16", r"3\.47"),
    ),
    (
        "002",
        "70% of a 16 GB laptop is 11.2 GB; of a 24 GB GPU, 16.8 GB; of an 80 GB GPU, 56 GB.",
        BUDGET,
        r"laptop 16 GB \(70 % line 11\.2 GB\)[\s\S]*GPU 24 GB \(70 % line 16\.8 GB\)[\s\S]*"
        r"GPU 80 GB \(70 % line 56 GB\)",
    ),
    # 004
    (
        "004",
        "gradient_accumulation_steps=8, # effective batch = 16 (single GPU)",
        TRICKS,
        r"^effective batch 16, checkpointing=",
    ),
]

LITERAL_FIGURES = [
    (
        "000",
        "4-bit weights need about a quarter of the memory of 16-bit ones.",
        QUANT,
        r"16 bits:\s+14\.0 GB[\s\S]*4 bits:\s+3\.5 GB",
    ),  # 7e9 * bits / 8
    (
        "000",
        "Faster maths: an H100 does about 990 TFLOPS in bfloat16, against 67 in float32.",
        PRECISION,
        r"H100 SXM\s+16-bit tensor cores\s+989 TFLOP/s, float32 67\.0",
    ),  # datasheet constants
    (
        "000",
        "16-bit activations take half the memory",
        PRECISION,
        r"torch\.float32 : 128 MiB\n.*torch\.bfloat16: 64 MiB",
    ),  # 8 x 1024 x 4096 x bits / 8
    (
        "000",
        "weights, gradients and Adam still need about 16 bytes per parameter",
        PRECISION,
        r"model state with Adam: 16 bytes per parameter",
    ),  # 4 + 4 + 8
    (
        "002",
        "Training with the Adam optimizer in float32 keeps four numbers of 4 bytes for each trained weight.",
        BUDGET,
        r"^per trained parameter\s+16 bytes$",
    ),  # a table of four literal 4s
    ("002", "For SmolLM2, 134,515,008 × 16 bytes = 2.15 GB.", BUDGET, r"134,515,008 x 16 bytes =\s+2\.15 GB"),
    ("002", "For a 7B model, 7,000,000,000 × 16 bytes = 112 GB.", BUDGET, r"7,000,000,000 x 16 bytes =\s+112\.00 GB"),
    (
        "002",
        "But gradients and Adam's numbers exist only for the adapter: 12 bytes for each of its numbers. For "
        "SmolLM2: 134,515,008 × 4 + 460,800 × 12 bytes = 0.54 GB.",
        BUDGET,
        r"134,515,008 x\s+4 bytes[\s\S]*460,800 x 12 bytes[\s\S]*LoRA on SmolLM2-135M\s+= 0\.54\d* GB",
    ),
    ("002", "For a 7B model, the frozen weights alone are 28 GB.", BUDGET, r"7e9 x 4 bytes = 28 GB$"),
    ("002", "For a 7B model, that is 3.79 GB.", BUDGET, r"^QLoRA on a 7B model:\s+3\.79 GB$"),  # 7e9 x 0.5 + ...
    (
        "004",
        "set per_device_train_batch_size=4 and gradient_accumulation_steps=16. The optimizer sees a 64-example "
        "gradient",
        ACCUM,
        r"^\s+4\s+16\s+1\s+64$",  # micro x steps x GPUs over a table of literals
    ),
]

# Course figures that no compared core-path output holds (seed, figure, notebook, where it is instead).
GOING_DEEPER_BUDGETS = "Going deeper (the estimator's table for budgets of 8, 48 and 64 GB)"
NOT_COMPARED = [
    ("000", "Real training often runs 2 to 3 times faster.", PRECISION, "prose only (hardware-dependent)"),
    ("000", "largest difference: 6.7e-08", ACCUM, "ignored cell (its digits vary by processor)"),
    ("002", "python -m pytest gives 19 passed.", None, "missing: the learner's own project, not a notebook"),
    (
        "002",
        "QLoRA needs a GPU library (bitsandbytes); on a laptop CPU it is not an option.",
        BUDGET,
        "differs: the estimator prints that bitsandbytes 0.50 runs on x86 CPUs too",
    ),
    ("002", "The last line says 21 passed.", None, "missing: the learner's own project"),
    (
        "002",
        "The estimator also assumes that LoRA trains 0.34% of any model",
        BUDGET,
        "Going deeper; prose only in the core path",
    ),
    (
        "002",
        "The laptop has room: the run's measured peak is 1.88 GB",
        BUDGET,
        "ignored cells measure it (machine-dependent); 1.88 GB in prose",
    ),
    ("002", "the training process measured a peak of 1,882 MB.", BUDGET, "ignored cells measure it"),
    ("002", "keep 30% free", BUDGET, "prose only (the estimator's verdicts use the 70 % line)"),
    ("002", "Usable memory is 70%: 5.6 GB, 33.6 GB and 44.8 GB.", BUDGET, "prose only (worked solution)"),
    (
        "002",
        "8 GB laptop: LoRA on SmolLM2 (estimate 0.54 GB). Full tuning (2.15 GB) also fits, but the 900 records "
        "argue for an adapter. A 1.7B model in float32 (6.87 GB) does not fit",
        BUDGET,
        GOING_DEEPER_BUDGETS,
    ),
    ("002", "48 GB GPU: LoRA or QLoRA on a 7B model fits (28.29, 14.29 and 3.79 GB).", BUDGET, GOING_DEEPER_BUDGETS),
    ("002", "The 70B model (37.88 GB) does not fit.", BUDGET, GOING_DEEPER_BUDGETS),
    ("002", "64 GB server, no GPU: 7B LoRA in float32 (28.29 GB) fits in memory.", BUDGET, GOING_DEEPER_BUDGETS),
    ("002", "a 7B model has about 52 times the weights of SmolLM2", BUDGET, "prose only (worked solution)"),
    ("002", "9 GB is more than 70% of 12 GB (8.4 GB)", BUDGET, "prose only (knowledge check)"),
    ("004", "roughly 2x speed", TRICKS, "claim printed as text; measured only in ignored cells, Going deeper"),
    ("004", "The cost: 16x compute time per optimizer step.", ACCUM, "prose only, which disputes it"),
    (
        "004",
        "~50% memory reduction at ~30% speed cost",
        TRICKS,
        "claim printed as text; measured only in ignored cells, Going deeper",
    ),
    ("004", "1.2-1.5x speedup on stable shapes", TRICKS, "claim printed as text; measured in an ignored cell"),
]

ROWS = FIGURES + LITERAL_FIGURES + NOT_COMPARED


# --------------------------------------------------------------------------------------------
# What the course text states (derived from it, where it is beside the checkout)
# --------------------------------------------------------------------------------------------
#: A figure in a sentence: a number with a unit of size, speed, share or count, or a batch size.
QUANTITY = re.compile(
    r"\d[\d,]*(?:\.\d+)?(?: ?(?:GB|MB|bytes|TFLOPS|times|passed)\b|%|x(?! ?\d))|(?:micro-batches|batch) (?:of|=) \d+"
    r"|\d+-example"
)
#: A line of code (not prose): a statement, an assignment, a call, or a line that continues a call.
CODE = re.compile(r"^(import|from|for|if|with|print|return)\b|^[\w.]+ ?=[^=]|^[\w.]+\(|[,(]$")
needs_course_text = pytest.mark.skipif(not COURSE_TEXT.is_dir(), reason=f"the course text is not in {COURSE_TEXT}")


def normalize(text: str) -> str:
    """``text`` with the course text's typography made plain (×, −, curly quotes, ~) and its spaces collapsed."""
    for fancy, plain in (("×", "x"), ("−", "-"), ("’", "'"), ("“", '"'), ("”", '"'), ("~", "")):
        text = text.replace(fancy, plain)
    return re.sub(r"\s+", " ", text).strip()


def course_lines(seed: str) -> list[str]:
    """The seed's lines, normalized."""
    path = next(COURSE_TEXT.glob(f"{seed}_*.txt"))
    return [normalize(line) for line in path.read_text(encoding="utf-8").splitlines()]


def printed_lines(seed: str) -> list[str]:
    """The lines the text shows a program printing: each block after a line "Output" or "The output:"."""
    lines, printed = course_lines(seed), []
    for i in (i for i, line in enumerate(lines) if line in ("Output", "The output:")):
        block = lines[i + 1 :]
        start = next(j for j, line in enumerate(block) if line)
        end = block.index("", start)
        printed += block[start:end]
    return printed


def prose(seed: str) -> list[str]:
    """The text's sentences outside its printed outputs: prose lines, and the comments of its code."""
    printed, found = set(printed_lines(seed)), []
    for line in course_lines(seed):
        if " — " not in line and CODE.search(line):
            line = line.partition("# ")[2]  # code: its comment, if any, is prose
        if line and line not in printed:
            found.append(line)
    return found


def course_figures(seed: str) -> tuple[list[str], set[str]]:
    """What the text states: the lines it shows printed, and the quantities of its prose."""
    return printed_lines(seed), {q for line in prose(seed) for q in QUANTITY.findall(line)}


# --------------------------------------------------------------------------------------------
# The notebooks' compared outputs
# --------------------------------------------------------------------------------------------
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
    seed, figure, notebook, _ = row
    return f"{seed}-{(notebook or 'none').split('_')[0]}-" + re.sub(r"[^A-Za-z0-9.%]+", "-", figure)[:40].strip("-")


@pytest.mark.parametrize(
    ("seed", "figure", "notebook", "pattern"),
    FIGURES + LITERAL_FIGURES,
    ids=[_id(r) for r in FIGURES + LITERAL_FIGURES],
)
def test_figure_in_a_compared_output(seed, figure, notebook, pattern):
    """The figure appears in a compared core-path output of its notebook."""
    outputs = compared_core_outputs(notebook)
    assert any(re.search(pattern, text, re.MULTILINE) for text in outputs), (
        f"course figure {figure!r} (seed {seed}) is in no compared core-path output of notebooks/{notebook} "
        f"(pattern {pattern!r})"
    )


def test_every_seed_has_a_figure_checked_by_code():
    """Every seed file contributes a row that checks code, and every notebook named exists."""
    assert {seed for seed, *_ in FIGURES} == set(SEEDS)
    assert all(notebook is None or (NOTEBOOKS / notebook).exists() for _, _, notebook, _ in ROWS)


@needs_course_text
@pytest.mark.parametrize("row", ROWS, ids=[_id(row) for row in ROWS])
def test_each_row_quotes_the_course_text(row):
    """A row's figure is the text's own words (typography aside), not a paraphrase."""
    seed, figure, *_ = row
    assert normalize(figure) in " ".join(course_lines(seed)), f"not in seed {seed}: {figure!r}"


@needs_course_text
def test_the_closing_table_carries_the_course_texts_rows():
    """05's closing table starts with the text's own three rows (tab-separated there), word for word."""
    from course_utils.trick_claims import COMPARISON

    lines = course_lines("000")
    header = lines.index(normalize("Technique\tWhat changes?\tMain benefit\tMain trade-off"))
    assert [normalize(" ".join(row)) for row in COMPARISON[:3]] == lines[header + 1 : header + 4]


@needs_course_text
@pytest.mark.parametrize("seed", SEEDS)
def test_the_rows_hold_every_figure_of_the_course_text(seed):
    """The rows quote exactly what the text states: every line it shows printed, and every quantity of its prose."""
    printed, quantities = course_figures(seed)
    quotes = [normalize(figure) for row_seed, figure, *_ in ROWS if row_seed == seed]
    assert [line for line in printed if line in quotes] == printed, "printed lines without a row"
    quoted = {q for quote in quotes if quote not in printed for q in QUANTITY.findall(quote)}
    assert sorted(quoted) == sorted(quantities)
