"""The lesson's memory-efficient ``TrainingArguments``, built for this machine and the installed transformers.

:data:`LESSON_TRAINING_ARGUMENTS` is the lesson's listing, line by line. :func:`training_arguments_plan` decides what
changes on this device and this version of transformers (and says why, change by change);
:func:`memory_efficient_training_arguments` builds them. Whether this CPU does bfloat16 in hardware
(:func:`cpu_bf16_fast`) decides its 16-bit line.
"""

import contextlib
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from course_utils import checks
from course_utils.hardware import as_device
from course_utils.precision import training_arguments_kwargs
from course_utils.quiet import import_bitsandbytes, quiet_libraries
from course_utils.step_model import adamw8bit_available

#: The lesson's arguments, line by line, with what each line does.
LESSON_TRAINING_ARGUMENTS: dict[str, Any] = {
    "output_dir": "./out",  # where checkpoints and logs go
    "per_device_train_batch_size": 2,  # examples per micro-batch: what must fit in memory at once
    "gradient_accumulation_steps": 8,  # micro-batches per optimizer step: effective batch 2 x 8 = 16 on one GPU
    "bf16": True,  # autocast to bfloat16 (float32 master weights); needs Ampere+ or a CPU with bf16 support
    "gradient_checkpointing": True,  # keep only each layer's input; recompute the rest in backward
    "optim": "adamw_8bit",  # bitsandbytes' 8-bit AdamW: 2 instead of 8 bytes of state per trained number
    "num_train_epochs": 3,  # passes over the training data
    "learning_rate": 2e-4,  # peak learning rate (a LoRA-style value)
    "warmup_ratio": 0.03,  # ramp the learning rate up over the first 3 % of steps
    "lr_scheduler_type": "cosine",  # then let it fall along a cosine
    "save_steps": 500,  # write a checkpoint every 500 optimizer steps
    "eval_steps": 500,  # evaluate every 500 steps (only if an evaluation strategy is switched on)
    "logging_steps": 50,  # log the loss every 50 steps
    "torch_compile": False,  # compile the model with torch.compile: try True once a baseline works
}
#: CPU flags that give bfloat16 matrix maths in hardware: x86 AVX-512-BF16 and AMX-BF16, ARM's BF16 extension.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


#: Why a line differs from the lesson's, by the argument that changed (or was added).
_WHY = {
    "warmup_steps": "the lesson's warmup_ratio=0.03, spelled as the installed transformers reads it (5 removed it)",
    "activation_checkpointing": "gradient_checkpointing=True under its name since transformers 5",
    "optim": "no bitsandbytes 8-bit AdamW for this device here (not installed, or a version without a CPU one)",
    "report_to": "no experiment tracker (Colab has wandb, which would stop at a login prompt)",
    "fp16": "this GPU has no native bfloat16: float16 autocast, with the loss scaling the Trainer adds",
    "bf16": "no fast bfloat16 here (a GPU below compute capability 8.0, or a CPU without bfloat16 instructions)",
    "use_cpu": "no GPU",
    "disable_tqdm": "no progress bar on stderr",
    "max_steps": "a short demo run",
    "save_strategy": "the demo writes no checkpoint",
    "logging_steps": "the demo logs every step",
}


def training_arguments_plan(
    output_dir: str | Path,
    *,
    max_steps: int | None = None,
    device: Any = None,
    bitsandbytes: bool = True,
    cpu_bf16: bool = True,
    fields: set[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of the lesson's ``TrainingArguments`` for ``device``, and each change from the lesson's
    (``"name=value: why"``).

    Decides only (nothing is built or allocated), so every branch can be tested on any machine:

    * 16-bit: :func:`course_utils.precision.training_arguments_kwargs` decides. CUDA with native bfloat16 (compute
      capability >= 8.0): ``bf16=True`` as in the lesson. A T4 (7.5, bfloat16 only emulated): ``bf16=False,
      fp16=True`` (float16 autocast; the Trainer adds loss scaling). CPU: ``bf16`` stays when the CPU does
      bfloat16 in hardware (``cpu_bf16``, see :func:`cpu_bf16_fast`), plus ``use_cpu=True`` and
      ``disable_tqdm=True``.
    * ``report_to="none"`` on every device: before transformers 5 the default is ``"all"``, and Colab ships wandb,
      whose login prompt would stop the Trainer.
    * Warm-up: transformers 4 has ``warmup_ratio`` and wants an *integer* ``warmup_steps``; transformers 5
      removed ``warmup_ratio`` and reads a float below 1 in ``warmup_steps`` as a ratio. With ``max_steps``
      the count ``ceil(0.03 x max_steps)`` is written, valid in both; without it, the ratio in the spelling the
      installed version accepts.
    * ``gradient_checkpointing`` is spelled ``activation_checkpointing`` where transformers has the new name.
    * ``optim="adamw_8bit"`` becomes ``"adamw_torch"`` without a working bitsandbytes 8-bit AdamW
      (``bitsandbytes=False``: not installed, or a version with no CPU optimizer).
    * With ``max_steps`` (a short demo): no checkpoint saved, the loss logged every step.

    ``fields`` are the accepted names (default: the installed ``TrainingArguments``'s).
    """
    if fields is None:  # the names the installed TrainingArguments accepts (nothing is built)
        from transformers import TrainingArguments

        fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    kwargs = {**LESSON_TRAINING_ARGUMENTS, "output_dir": str(output_dir), "report_to": "none"}
    if max_steps is not None:  # the first use of max_steps: checked here, once
        steps = math.ceil(kwargs.pop("warmup_ratio") * checks.integer(max_steps, "max_steps", 1))
        kwargs.update(warmup_steps=steps, max_steps=max_steps, save_strategy="no", logging_steps=1)
    elif "warmup_ratio" not in fields:  # transformers 5 reads a float below 1 in warmup_steps as a share of the steps
        kwargs["warmup_steps"] = kwargs.pop("warmup_ratio")
    if "activation_checkpointing" in fields:
        kwargs["activation_checkpointing"] = kwargs.pop("gradient_checkpointing")
    if not bitsandbytes:
        kwargs["optim"] = "adamw_torch"
    kwargs.update({"bf16": False, **training_arguments_kwargs(device, cpu_bf16=cpu_bf16)})  # the one 16-bit rule
    if kwargs.get("use_cpu"):
        kwargs["disable_tqdm"] = True
    # the changed lines, in _WHY's order
    changed = [name for name in _WHY if name in kwargs and LESSON_TRAINING_ARGUMENTS.get(name) != kwargs[name]]
    return kwargs, [f"{name}={kwargs[name]!r}: {_WHY[name]}" for name in changed]


def memory_efficient_training_arguments(
    output_dir: str | Path, *, max_steps: int | None = None, device: Any = None
) -> tuple[Any, list[str]]:
    """The lesson's memory-efficient ``TrainingArguments`` for this machine, and the list of what was changed.

    ``device`` None means :func:`course_utils.hardware.pick_device`. Every decision is
    :func:`training_arguments_plan`'s: ``bf16`` on a CPU (where supported) and on Ampere-or-newer GPUs, ``fp16`` on
    a T4; warm-up and checkpointing spelled for the installed transformers; for a short demo (``max_steps`` given)
    no checkpoints are saved.
    """
    with quiet_libraries():  # it imports bitsandbytes first: transformers may import it, and its CPU notice is stderr
        from transformers import TrainingArguments

        dev = as_device(device)  # decided once, for the plan and the optimizer check
        # on a CUDA GPU bitsandbytes has its fused kernel; elsewhere (CPU) try one 8-bit step first
        eight_bit = import_bitsandbytes() is not None and (dev.type == "cuda" or adamw8bit_available(dev))
        # bfloat16 autocast on a CPU unless it would be emulated (unknown flags: try it)
        kwargs, changes = training_arguments_plan(
            output_dir, max_steps=max_steps, device=dev, bitsandbytes=eight_bit, cpu_bf16=cpu_bf16_fast() is not False
        )
        return TrainingArguments(**kwargs), changes


def checkpointing_enabled(args: Any) -> bool:
    """Whether ``TrainingArguments`` switch activation (gradient) checkpointing on, in transformers 4 or 5."""
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False))


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM); None where there is
    no such file (macOS, Windows). ``cpuinfo``: the file's text, for tests."""
    if cpuinfo is None:
        cpuinfo = ""  # no such file (macOS, Windows): no flags
        with contextlib.suppress(OSError):
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    line = re.search(r"^\s*(?:flags|features)\s*:(.*)$", cpuinfo, re.IGNORECASE | re.MULTILINE)
    return frozenset(line.group(1).split()) if line else None


def cpu_bf16_fast(flags: frozenset[str] | set[str] | None = None) -> bool | None:
    """Whether this CPU does bfloat16 matrix maths in hardware (AVX-512-BF16, AMX or ARM BF16): True or False; None
    where the flags cannot be read. Without them PyTorch emulates 16-bit matrix multiplies, many times slower
    than float32. ``flags``: a CPU's flags (default: :func:`cpu_flags`)."""
    flags = cpu_flags() if flags is None else flags
    return None if flags is None else bool(BF16_CPU_FLAGS & set(flags))
