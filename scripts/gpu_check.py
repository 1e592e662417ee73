"""Check the course's GPU paths on a real NVIDIA GPU, in one command, offline, within a 300 s budget.

No development machine of this course has a GPU, so every CUDA branch of ``course_utils`` is proven here,
on whatever NVIDIA GPU is lent (a Colab T4, an L4, an A100, an H100, an H200...). Run from the repository root::

    python scripts/gpu_check.py                      # all sections, results in ./gpu_check_out/
    python scripts/gpu_check.py --strict             # also fail on estimate errors over 10 % and on skips
    python scripts/gpu_check.py --dry-run            # print the plan for this GPU; nothing runs on it
    python scripts/gpu_check.py --out /tmp/check --sections matmul,qlora --budget-s 200

Sections, in order (``--sections`` takes their names or numbers):

1. ``environment`` - versions, GPU name, compute capability, memory; ``hardware.setup_report()`` and the
   dtype decisions (``autocast_dtype``, ``bf16_native``, ``needs_loss_scaling``).
2. ``matmul`` - 4096x4096 and 8192x8192 matmuls in float32 / float16 / bfloat16, each timed with
   ``torch.utils.benchmark.Timer(...).blocked_autorange(...)``: median, spread (IQR and min-max over the
   measurements), TFLOP/s and % of the datasheet peak (``hardware.datasheet_for``); the lessons'
   ``precision.time_matmul`` once at 4096 in float16.
3. ``mixed_precision`` - notebook 02's loop (``precision.train_mixed_precision``) with float16 + GradScaler
   and a forced overflow (the scaler must skip that step and lower its scale), and with bfloat16 (Ampere+).
4. ``microbatch_sweep`` - notebook 03's micro-batch sweep (``accumulation.sweep_micro_batches``) on CUDA.
5. ``step_memory`` - the whole-step estimate (``step_memory.estimate_step``, with the attention backend this GPU
   gets) against the allocator peak of ``measure.measure_training_step`` (3 timed steps each): LoRA and full x
   batch 1/4/8, float16 autocast with GradScaler (``autocast="fp16"``) on every GPU, full-bf16, lora-bf16, qlora,
   and LoRA at 1,024 tokens (batch: the largest a T4 fits by the estimate); each row shows the attention backend
   that ran next to the one the estimate assumed. Then notebook 05's tricks (``tricks.measure_tricks``, 3 timed
   steps each: gradient checkpointing, 16-bit autocast, 8-bit AdamW, accumulation), then torch.compile in a
   bounded child process, after the in-process cases (its compiler workers would compete for the CPU while eager
   steps are timed). Full tuning and the tricks need torch and transformers only; a case that needs peft or
   bitsandbytes is "not checked: <package> missing" without it.
6. ``qlora`` - the offline stand-in loaded in 4 bits, LoRA added (notebook 01b's recipe), 8 AdamW steps on 01b's
   tickets with 01b's GradScaler (on for float16 compute), 10 generated tokens; with the GPU's own compute dtype
   and, on Ampere or newer, again with float16 compute (the T4 branch).
7. ``ddp`` - notebook 03's 2-process gloo DDP check, started after CUDA is initialised.
8. ``trainer`` - notebook 05's memory-efficient ``TrainingArguments`` for 2 Trainer steps, and on Ampere or
   newer the same arguments with ``fp16=True`` forced (the T4 branch: float16 + the Trainer's loss scaling).
9. ``timeline`` - notebook 05's baseline step over time (``timeline_measure.measure_timeline``: the profiler's
   memory timeline, and the CUDA allocator's history saved as ``timeline/step_snapshot.pickle`` for
   https://pytorch.org/memory_viz) against ``timeline.predicted_timeline``: tensor peaks within 5 %, the same
   phase, each kind's most bytes alive side by side.

So the T4 branch (float16 + loss scaling) runs on any card: forced on Ampere-or-newer ones, the default on a T4.

This file is the entry point and the table of sections (``SECTIONS`` below); the rest lives in the package
``scripts/gpucheck/``, one part per module (its ``__init__`` lists them): plan and budget, the sections by lesson,
the runner, child processes and the watchdog, the report.

The script never contacts the Hugging Face Hub (it sets ``HF_HUB_OFFLINE=1``): the model is the course's
stand-in, the SmolLM2-135M architecture from ``data/configs`` with random weights. It puts the repository
root on ``sys.path`` itself, so ``course_utils`` need not be installed, and it does not assume this
project's pinned versions. A section whose optional library (transformers, peft, accelerate, bitsandbytes)
is missing is listed as "not checked: no <library>" (never as passed); every section runs inside
try/except, so one failure is recorded (type, message, end of the traceback) and the others still run.

Budget: ``--budget-s`` (default 300 s, so that a lent GPU's 15 minutes leave room for a rerun) is planned
ahead: each section has a cap, and the caps (scaled down for a smaller budget) fit in the budget less 8 s kept
for writing the results; a section may also use what the sections before it left unused, as long as the
sections after it keep their caps. Inside a section every case checks the time left before it starts, and a
section is skipped, with the reason, when the time left is below its minimum. A watchdog stops the run at
the budget in any case. Child processes (the torch.compile child and its compilers, the DDP ranks and their
fork server) are ended with the run: at its end, and when the watchdog fires (see ``gpucheck/children.py``).
``--dry-run`` prints the plan for the GPU found (sections, caps, cases) and runs nothing on it.

Output: ``gpu_check.json`` and ``gpu_check.md`` (a table per section) in ``--out``; every other file the check
writes goes there too (the stand-in model, the Trainer's folders, temporary files, torch.compile's and Triton's
caches: see ``gpucheck/cli.py``). The markdown is also printed, then one summary line (``gpu_check:
PASSED|INCOMPLETE|FAILED ...``). Exit status: 0 when no section failed (sections and cases skipped or not checked
are listed; PASSED only when every section passed in full); 1 when a section failed or the watchdog stopped the run;
2 when there is no CUDA GPU (one line on stderr, nothing run); 3 with ``--strict`` when nothing failed but an
estimate error (step_memory: estimate vs measured peak) is over 10 %, no estimate was checked at all (step_memory
requested: a missing library counts here), an estimate assumed another attention backend than the one that ran, or a
section or case was skipped for a reason other than a missing optional library (sections not checked for a missing
library do not fail ``--strict`` otherwise).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the check's package, gpucheck/, beside this file
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # course_utils from this clone, installed or not
from gpucheck.cli import main
from gpucheck.runner import Section
from gpucheck.sections.loops import section_microbatch_sweep, section_mixed_precision
from gpucheck.sections.machine import section_environment, section_matmul
from gpucheck.sections.memory import section_step_memory
from gpucheck.sections.models import section_ddp, section_qlora, section_trainer
from gpucheck.sections.timeline import section_timeline

#: The sections, in order: number, name, title, function, the optional libraries they need, the least time worth
#: starting them with, and their cap (the caps of all nine fit the default 300 s budget less the 8 s reserve).
SECTIONS: tuple[Section, ...] = (
    Section(1, "environment", "Environment and the hardware decisions", section_environment, min_s=3, cap_s=5),
    Section(
        2, "matmul", "Matmul speed: 4096² and 8192², float32, float16, bfloat16", section_matmul, min_s=10, cap_s=20
    ),
    Section(
        3, "mixed_precision", "Mixed-precision training loop (notebook 02)", section_mixed_precision, min_s=8, cap_s=15
    ),
    Section(
        4, "microbatch_sweep", "Micro-batch sweep on CUDA (notebook 03)", section_microbatch_sweep, min_s=5, cap_s=10
    ),
    Section(
        5,
        "step_memory",
        "Whole-step estimate vs measured peak, fp16 and attention included; notebook 05's tricks",
        section_step_memory,
        needs=("transformers",),
        min_s=40,
        cap_s=167,
    ),
    Section(
        6,
        "qlora",
        "QLoRA on the offline stand-in (notebook 01b's loop), float16 compute included",
        section_qlora,
        needs=("transformers", "peft", "accelerate", "bitsandbytes"),
        min_s=20,
        cap_s=30,
    ),
    Section(7, "ddp", "gloo DDP after CUDA is initialised (notebook 03)", section_ddp, min_s=15, cap_s=15),
    Section(
        8,
        "trainer",
        "Memory-efficient TrainingArguments with the Trainer, fp16 included (notebook 05)",
        section_trainer,
        needs=("transformers", "accelerate"),
        min_s=15,
        cap_s=20,
    ),
    Section(
        9,
        "timeline",
        "One step's memory over time, measured against predicted (notebook 05); the allocator's history saved for "
        "pytorch.org/memory_viz",
        section_timeline,
        needs=("transformers",),
        min_s=10,
        cap_s=10,
    ),
)

if __name__ == "__main__":
    sys.exit(main(SECTIONS))
