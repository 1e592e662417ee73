"""Three more memory tricks, measured: gradient checkpointing, 8-bit AdamW, torch.compile (and 16-bit autocast,
accumulation).

* :data:`TRICKS` - each trick as one change to a training step, next to the lesson's claim about it.
* :func:`measure_tricks` - one measured training step per trick (each in its own bounded child process on a
  CPU, see :mod:`course_utils.measure`), compared with a baseline step and with the step estimate of
  :mod:`course_utils.step_memory` *for the same device*; :func:`verdict` says whether this machine bears the
  claim out, and if not, why.
* :func:`memory_efficient_training_arguments` - the lesson's ``TrainingArguments``, built for this machine,
  with every line explained and every change from the lesson's listed. Its 16-bit choice (bf16 or fp16) comes
  from :mod:`course_utils.hardware`, like every dtype and device decision in this module.
* :data:`COMPARISON` - the module's closing table (the helper that names what does not fit a memory budget,
  and which trick moves it under, is :func:`course_utils.bottleneck.what_is_my_bottleneck`).
* :func:`saved_for_backward` - what a forward pass keeps for backward, eager or compiled (it lives in
  :mod:`course_utils.measure`, which counts a measured step's activations the same way).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import torch

from course_utils import checks, measure, training_step
from course_utils.configs import read_config
from course_utils.hardware import as_device
from course_utils.training_step import saved_for_backward as saved_for_backward  # notebook 05 calls it from here
from course_utils.peak import measure_peak
from course_utils.precision import training_arguments_kwargs
from course_utils.quiet import import_bitsandbytes, quiet_libraries
from course_utils.step_memory import estimate_device_for, estimate_step
from course_utils.units import GB, format_seconds

#: Seconds ``torch.compile`` gets to compile and run its first steps (on a GPU; a CPU skips it by default). The
#: compiling runs on the CPU cores, and a Colab T4 comes with two: a minute is too short there.
COMPILE_TIMEOUT_S = 300.0


# --------------------------------------------------------------------------------------------
# The tricks and the lesson's claims
# --------------------------------------------------------------------------------------------
class Trick(NamedTuple):
    """One trick: what it changes in a step, and the lesson's claim about it."""

    label: str
    change: Mapping[str, Any]
    claim: str


TRICKS: dict[str, Trick] = {
    "baseline": Trick("baseline (float32)", {}, "the reference step"),
    "checkpointing": Trick("gradient checkpointing", {"checkpointing": True},
                           "~50 % memory reduction at ~30 % speed cost"),
    # The key keeps the claim's name; the dtype is the device's ("auto": bfloat16 on a CPU or Ampere+, float16
    # with loss scaling on a T4, which has no native bfloat16) - see course_utils.training_step._step_precision. Labels
    # stay short: every table of notebook 05 prints them. The baseline trains with AdamW, like the other rows.
    "bf16": Trick("16-bit autocast", {"autocast": "auto"},
                  "roughly 2x speed on hardware that supports it (Ampere+), almost no quality cost"),
    "adamw8bit": Trick("8-bit AdamW", {"optimizer": "adamw8bit"},
                       "8-bit Adam state; saves a lot when training big models"),
    "compile": Trick("torch.compile", {"compile": True},
                     "1.2-1.5x speed-up on stable shapes; sometimes hurts on dynamic shapes"),
    "accumulation": Trick("accumulation (4 micro-batches)", {"accumulation": 4},
                          "big-batch gradients with small-batch memory; the cost is time"),
}

#: The closing table of the module: the lesson's three tricks, then this notebook's three, same columns.
COMPARISON: tuple[tuple[str, str, str, str], ...] = (
    ("Quantization", "How numbers are stored", "Less memory, faster inference", "Some quality loss"),
    ("Mixed precision", "The precision of the maths", "Faster training, less activation memory",
     "Numerical care: loss scaling and the right GPU"),
    ("Gradient accumulation", "When the weights are updated", "Big batches on a small GPU",
     "Slower than a real big batch"),
    ("Gradient checkpointing", "What is kept for backward", "Each layer keeps only its input",
     "One extra forward (~30 % slower)"),
    ("8-bit optimizer", "How optimizer states are stored", "2 instead of 8 bytes per trained number",
     "Needs bitsandbytes; small gain for LoRA"),
    ("torch.compile", "How the step runs", "Faster steps on stable shapes", "Compile time; new shapes recompile"),
)


def comparison_table() -> str:
    """:data:`COMPARISON` as a Markdown table (first three rows: the lesson's)."""
    rows = [("Technique", "What changes?", "Main benefit", "Main trade-off"), ("---",) * 4, *COMPARISON]
    return "\n".join(f"| {' | '.join(row)} |" for row in rows)


# --------------------------------------------------------------------------------------------
# Measuring them
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TrickResult:
    """One trick measured (or skipped, with the reason)."""

    key: str
    label: str
    claim: str
    peak_bytes: int | None = None
    step_seconds: float | None = None
    first_step_seconds: float | None = None
    compile_seconds: float | None = None
    optimizer_bytes: int | None = None
    saved_activations_bytes: int | None = None
    trained_params: int | None = None
    estimate_bytes: int | None = None
    estimate_moment: str | None = None
    estimate_attention: str | None = None  # the SDPA backend the estimate assumes (extra["attention"]: what ran)
    estimate_device: str | None = None  # the counter the estimate predicts: "cpu" (process) or "cuda" (allocator)
    device: str | None = None  # the device the step was measured on (or would have been, when skipped)
    skipped: str | None = None
    measurement: Any = None


#: What a row copies from its measurement: the fields both have (peak, times, counted bytes, the device).
_MEASURED = tuple(TrickResult.__dataclass_fields__.keys() & measure.StepMeasurement.__dataclass_fields__.keys())


def trick_kwargs(key: str, base: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`~course_utils.measure.measure_training_step` for one trick."""
    checks.choice(key, "trick", TRICKS)
    kwargs = {**base, **TRICKS[key].change}
    if key == "accumulation":  # same examples per optimizer step, in micro-batches
        k, batch = kwargs["accumulation"], int(base.get("batch", 8))
        if batch % k:
            raise ValueError(f"batch must be divisible by the {k} micro-batches of the accumulation trick, got {batch}")
        kwargs["batch"] = batch // k
    return kwargs


def estimate_step_for(kwargs: Mapping[str, Any], config: Any, device: Any = None) -> Any:
    """The :class:`~course_utils.step_memory.StepEstimate` for the same keyword arguments as a measurement.

    ``device`` is the device the step is (or would be) measured on: a CUDA device gives the allocator
    counter's estimate (no process baseline), anything else the CPU process's; None means
    :func:`course_utils.hardware.pick_device`, the device :func:`measure_tricks` measures on by default.
    """
    keys = ("method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer", "accumulation")
    return estimate_step(config, autocast=bool(kwargs.get("autocast")), device=estimate_device_for(device),
                         **{k: kwargs[k] for k in keys if k in kwargs})


def measure_tricks(config: Any, base: Mapping[str, Any], keys: Sequence[str] = tuple(TRICKS), *,
                   timeout_s: float = 300.0, compile_timeout_s: float = COMPILE_TIMEOUT_S, device: Any = None,
                   compile_on_cpu: bool = False, skip_slow_bf16: bool = False) -> list[TrickResult]:
    """Measure one training step per trick (``baseline`` first) on ``device``, next to its estimate for that same
    device; ``base`` is the step every trick changes (see :func:`trick_kwargs`). ``device`` None means
    :func:`course_utils.hardware.pick_device`, decided once for the estimates and the measurements. On a CPU each
    step runs in a fresh child process bounded by ``timeout_s``; on a GPU in this process, its peak counted above
    the memory already allocated (see :func:`course_utils.measure.measure_training_step`). A trick that fails (any
    error, out of memory included) or runs past its time limit (``compile_timeout_s`` for ``torch.compile``, which
    always gets a child process) is returned with ``skipped`` set to the reason instead of stopping the others. On a
    CPU, ``torch.compile`` is tried only with ``compile_on_cpu=True``: building the compiled C++ takes minutes on a
    laptop, so by default its row says it was skipped, and why. With ``skip_slow_bf16=True`` the 16-bit row is
    skipped (and says why) on a CPU without bfloat16 instructions (:func:`cpu_bf16_fast` False), where 16-bit matrix
    multiplies are emulated, many times slower than float32: a notebook need not wait minutes for a known answer."""
    dev = as_device(device)  # the one device decision: estimates below are for the device measured
    rows = {key: _estimated_row(key, base, config, dev) for key in keys}  # each key is checked there
    if "bf16" in rows and dev.type == "cpu" and skip_slow_bf16 and cpu_bf16_fast() is False:
        rows["bf16"].skipped = ("skipped on this CPU: it has no bfloat16 instructions (AVX-512-BF16 or AMX), so 16-bit "
                                "matrix multiplies are emulated, many times slower than float32 (skip_slow_bf16=False "
                                "measures it anyway)")
    if "compile" in rows and dev.type == "cpu" and not compile_on_cpu:
        rows["compile"].skipped = ("skipped on a CPU: compiling the forward and backward takes minutes here "
                                   "(compile_on_cpu=True tries it, within compile_timeout_s)")
    for compiled, limit in ((False, timeout_s), (True, compile_timeout_s)):  # compile has a time limit of its own
        group = [k for k in keys if not rows[k].skipped and (k == "compile") == compiled]
        if group:  # on a CPU one bounded child forks a fresh process per case (see measure_training_steps)
            cases = [trick_kwargs(k, base) for k in group]
            for key, m in zip(group, measure.measure_training_steps(config, cases, timeout_s=limit, device=dev)):
                _record(rows[key], m, limit)
    return [rows[k] for k in keys]


def _estimated_row(key: str, base: Mapping[str, Any], config: Any, dev: Any) -> TrickResult:
    """A trick's row before measuring: its label, claim and the estimate for ``dev`` (``key`` checked here, once)."""
    trick = TRICKS[checks.choice(key, "keys", TRICKS)]
    row = TrickResult(key, trick.label, trick.claim, device=str(dev), estimate_device=estimate_device_for(dev))
    with contextlib.suppress(ValueError, TypeError):  # a combination the estimator does not model: no estimate
        est = estimate_step_for(trick_kwargs(key, base), config, dev)
        row.estimate_bytes, row.estimate_moment, row.estimate_attention = (est.peak_bytes, est.peak_moment,
                                                                           est.attention.backend)
    return row


def _record(row: TrickResult, m: Any, limit: float) -> None:
    """Put a measurement (or the reason there is none: a :class:`~course_utils.measure.Skipped`) into ``row``."""
    if isinstance(m, measure.Skipped) and m.timed_out:
        row.skipped = f"skipped: did not finish within its {limit:g} s budget on this machine"
    elif isinstance(m, measure.Skipped):
        row.skipped = f"skipped: the step failed ({m.reason.strip().splitlines()[-1][:160]})"
    else:
        row.measurement = m
        for name in _MEASURED:
            setattr(row, name, getattr(m, name))


def _change(memory: float, speed: float, time_word: str) -> str:
    """``peak -16 %, step time +25 %`` (no "-0 %")."""
    return f"peak {round(100 * (memory - 1)):+d} %, {time_word} {round(100 * (speed - 1)):+d} %"


#: The first words of each kind of skip reason, and how a table cell says it.
_SKIPS_SHORT = (("skipped on a CPU", "skipped on a CPU: compiling takes minutes"),
                ("skipped on this CPU", "skipped: no fast bfloat16 on this CPU"),
                ("skipped: did not finish", "skipped: ran out of time"),
                ("skipped: the step failed", "skipped: the step failed"))


def results_text(rows: Sequence[TrickResult]) -> str:
    """One compact table: trick | estimate GB | peak GB | step time | against the baseline (see
    :func:`results_table`)."""
    table = results_table(rows)
    width = max(len(r["trick"]) for r in table)
    lines = [f"{'trick':<{width}}  estimate GB  peak GB  step time  vs baseline"]
    for r in table:
        est, peak = ("-" if r[c] is None else f"{r[c]:.2f}" for c in ("estimate GB", "peak GB"))
        lines.append(f"{r['trick']:<{width}}  {est:>11}  {peak:>7}  {r['step time'] or '-':>9}  {r['vs baseline']}")
    return "\n".join(lines)


def verdict(row: TrickResult, baseline: TrickResult | None, short: bool = False) -> str:
    """One sentence: the claim next to what this machine measured, and why they differ when they do. With
    ``short``, a table cell: ``peak -16 %, time +25 %`` against the baseline, ``reference``, or why it was
    skipped in a few words."""
    if row.key == "baseline":
        return "reference"
    if row.skipped:
        cell = next((cell for start, cell in _SKIPS_SHORT if row.skipped.startswith(start)), "skipped")
        return cell if short else row.skipped
    if baseline is None or baseline.peak_bytes is None or baseline.step_seconds is None:
        return "no baseline to compare with"
    memory, speed = row.peak_bytes / baseline.peak_bytes, row.step_seconds / baseline.step_seconds
    change = _change(memory, speed, "time" if short else "step time")
    return change if short else change + _EXPLANATIONS[row.key](row, baseline, memory, speed)


# Each explanation is the rest of a verdict's sentence, after the measured change ("peak -16 %, step time +25 %").
def _checkpointing_verdict(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    if memory <= 0.6:
        return ""
    share = (baseline.saved_activations_bytes or 0) / baseline.peak_bytes
    process = "" if _on_gpu(row) else ", the process baseline"  # a CPU measurement counts it
    return (f"; not -50 % here: the layers' saved activations are {100 * share:.0f} % of the baseline peak, and with "
            f"checkpointing the predicted peak comes at the {_moment(row, baseline)}; checkpointing removes only the "
            f"layers' activations (weights, gradients, optimizer states{process} and the float32 logits path stay)")


def _adamw8bit_verdict(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    base_per, per = ((r.optimizer_bytes or 0) / max(1, r.trained_params or 1) for r in (baseline, row))
    counted = f"; optimizer states {base_per:.2f} -> {per:.2f} bytes per trained number (counted)"
    if _on_gpu(row):
        return counted + ": bitsandbytes' fused GPU kernel updates the 8-bit states in place"
    return (counted + ". On a CPU bitsandbytes unpacks each tensor's states to float32 for its update, which needs "
            "scratch memory the size of 5 float32 copies of the largest tensor; a GPU's fused kernel works in place")


def _compile_verdict(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    once = f"; compile {row.compile_seconds:.0f} s once" if row.compile_seconds is not None else ""
    ratio = 1 / speed
    where = ("on this GPU the step may already be bound by its matrix multiplies, or too small to fill the card"
             if _on_gpu(row) else "on a CPU most of a step's time is in matrix multiplies")
    why = "" if ratio >= 1.1 else (
        f"; no 1.2-1.5x here: {where}, which compiled code leaves to the same libraries (compiling fuses the "
        "small element-wise operations); noisy timings can also hide a gain")
    return f" ({ratio:.2f}x speed){once}{why}"


def _bf16_verdict(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    dtype = getattr(row.measurement, "autocast", None) or "bfloat16"
    if not _on_gpu(row):
        where = "on a CPU, bf16 speeds up matrix multiplies only where the CPU has bfloat16 instructions"
    elif dtype == "float16":
        where = "float16 with loss scaling: this GPU has no native bfloat16; its fp16 tensor cores give the speed"
    else:
        where = "on a GPU, the 2x needs bfloat16 tensor cores (Ampere+)"
    if memory <= 0.9:
        return f" ({where}); activations are stored in {dtype}"
    return (f" ({where}). The peak did not halve: autocast keeps a {dtype} copy of every weight on the "
            "gradient's path until backward, and the loss is still computed in float32 over the vocabulary")


def _accumulation_verdict(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    k = TRICKS["accumulation"].change["accumulation"]
    if speed >= 1.05:
        time = (f"; slower: the same arithmetic runs as {k} smaller steps, each with its own fixed work, and "
                "smaller matrix multiplies use the hardware less well")
    elif speed <= 0.95:
        time = (f"; not slower here, although the same arithmetic runs as {k} smaller steps: time several steps "
                "on a quiet machine before counting on it (on a GPU small micro-batches usually cost time)")
    else:
        time = f"; about the same time: the same arithmetic, as {k} smaller steps"
    if memory < 0.97:
        return f" for the same examples per optimizer step: each micro-batch saves fewer activations{time}"
    return (" for the same examples per optimizer step. The peak did not fall: the predicted peak comes at the "
            f"{_moment(row, baseline)}, and accumulation keeps every gradient from one micro-batch to the next{time}")


def _on_gpu(row: TrickResult) -> bool:
    """Whether ``row`` was measured (or would have been) on a CUDA GPU."""
    return str(row.device or "cpu").startswith("cuda")


def _moment(row: TrickResult, baseline: TrickResult) -> str:
    """The moment of the step where the estimate puts the peak."""
    return row.estimate_moment or baseline.estimate_moment or "peak moment"


#: Why a trick's measurement looks the way it does, by trick (every trick but the baseline).
_EXPLANATIONS = {"checkpointing": _checkpointing_verdict, "adamw8bit": _adamw8bit_verdict,
                 "compile": _compile_verdict, "bf16": _bf16_verdict, "accumulation": _accumulation_verdict}


def results_table(rows: Sequence[TrickResult]) -> list[dict[str, Any]]:
    """Rows for display: trick, claim, measured peak (GB) and step time (in s or ms: never "0.0"), estimate,
    the short verdict (``vs baseline``) and the long one (``measured``)."""
    base = next((r for r in rows if r.key == "baseline"), None)
    return [{"trick": r.label, "claim": r.claim,
             "estimate GB": None if r.estimate_bytes is None else round(r.estimate_bytes / GB, 2),
             "peak GB": None if r.peak_bytes is None else round(r.peak_bytes / GB, 2),
             "step time": None if r.step_seconds is None else format_seconds(r.step_seconds),
             "vs baseline": verdict(r, base, short=True), "measured": verdict(r, base) if base else ""} for r in rows]


# --------------------------------------------------------------------------------------------
# The lesson's memory-efficient TrainingArguments
# --------------------------------------------------------------------------------------------
#: The lesson's arguments, line by line: (name, lesson's value, what the line does).
LESSON_TRAINING_ARGUMENTS: tuple[tuple[str, Any, str], ...] = (
    ("output_dir", "./out", "where checkpoints and logs go"),
    ("per_device_train_batch_size", 2, "examples per micro-batch: what must fit in memory at once"),
    ("gradient_accumulation_steps", 8, "micro-batches per optimizer step: effective batch 2 x 8 = 16 on one GPU"),
    ("bf16", True, "autocast to bfloat16 (float32 master weights); needs Ampere+ or a CPU with bf16 support"),
    ("gradient_checkpointing", True, "keep only each layer's input; recompute the rest in backward"),
    ("optim", "adamw_8bit", "bitsandbytes' 8-bit AdamW: 2 instead of 8 bytes of state per trained number"),
    ("num_train_epochs", 3, "passes over the training data"),
    ("learning_rate", 2e-4, "peak learning rate (a LoRA-style value)"),
    ("warmup_ratio", 0.03, "ramp the learning rate up over the first 3 % of steps"),
    ("lr_scheduler_type", "cosine", "then let it fall along a cosine"),
    ("save_steps", 500, "write a checkpoint every 500 optimizer steps"),
    ("eval_steps", 500, "evaluate every 500 steps (only if an evaluation strategy is switched on)"),
    ("logging_steps", 50, "log the loss every 50 steps"),
    ("torch_compile", False, "compile the model with torch.compile: try True once a baseline works"),
)


def training_arguments_plan(output_dir: str | Path, *, max_steps: int | None = None, device: Any = None,
                            bitsandbytes: bool = True, cpu_bf16: bool = True,
                            fields: set[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of the lesson's ``TrainingArguments`` for ``device``, and the list of changes.

    Decides only (nothing is built or allocated), so every branch can be tested on any machine:

    * 16-bit: :func:`course_utils.hardware.autocast_dtype` decides. CUDA with native bfloat16 (compute
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

    ``fields`` are the accepted names (default: the installed ``TrainingArguments``'s).
    """
    if fields is None:  # the names the installed TrainingArguments accepts (nothing is built)
        from transformers import TrainingArguments

        fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    kwargs = {**{name: value for name, value, _ in LESSON_TRAINING_ARGUMENTS}, "output_dir": str(output_dir)}
    changes = []

    def change(why: str, **updates: Any) -> None:
        kwargs.update(updates)
        changes.append(why)

    ratio = kwargs.pop("warmup_ratio")
    if max_steps is not None:  # the first use of max_steps: checked here, once
        steps = math.ceil(ratio * checks.integer(max_steps, "max_steps", 1))
        change(f"warmup_ratio={ratio} -> warmup_steps={steps}: 3 % of {max_steps} steps, rounded up; an integer count "
               "means the same in transformers 4 and 5 (5 removed warmup_ratio)", warmup_steps=steps)
    elif "warmup_ratio" in fields:
        kwargs["warmup_ratio"] = ratio
    else:
        change(f"warmup_ratio={ratio} -> warmup_steps={ratio}: transformers 5 removed warmup_ratio (a float below 1 "
               "is read as a share of the steps)", warmup_steps=ratio)
    if "activation_checkpointing" in fields:
        change("gradient_checkpointing=True -> activation_checkpointing=True: the new name in transformers 5 (the "
               "old one still works until v6, with a FutureWarning)",
               activation_checkpointing=kwargs.pop("gradient_checkpointing"))
    if not bitsandbytes:
        change("optim='adamw_8bit' -> 'adamw_torch': no bitsandbytes 8-bit AdamW for this device here (not "
               "installed, or a version without a CPU optimizer)", optim="adamw_torch")
    change("report_to='none': no experiment tracker (transformers 4 reports to every tracker it finds, and Colab "
           "has wandb, which would stop at a login prompt)", report_to="none")
    rule = training_arguments_kwargs(device, cpu_bf16=cpu_bf16)  # the one 16-bit rule
    if rule.get("fp16"):
        change("bf16=True -> fp16=True: this GPU has no native bfloat16 (compute capability below 8.0, e.g. a T4); "
               "float16 autocast, with the loss scaling the Trainer adds", bf16=False, fp16=True)
    if rule.get("use_cpu"):
        change("use_cpu=True, disable_tqdm=True: no GPU; no progress bar on stderr", use_cpu=True, disable_tqdm=True)
        if not rule["bf16"]:
            change("bf16=True -> False: this CPU has no bfloat16 instructions (AVX-512-BF16 or AMX), so 16-bit "
                   "matrix multiplies would be emulated, many times slower than float32", bf16=False)
    if max_steps is not None:
        change(f"max_steps={max_steps}, save_strategy='no', logging_steps=1: a short demo run that writes no "
               "checkpoint and logs every step", max_steps=max_steps, save_strategy="no", logging_steps=1)
    return kwargs, changes


def memory_efficient_training_arguments(output_dir: str | Path, *, max_steps: int | None = None,
                                        device: Any = None) -> tuple[Any, list[str]]:
    """The lesson's memory-efficient ``TrainingArguments`` for this machine, and the list of what was changed.

    ``device`` None means :func:`course_utils.hardware.pick_device`. Every decision is
    :func:`training_arguments_plan`'s: ``bf16`` on a CPU (where supported) and on Ampere-or-newer GPUs, ``fp16`` on
    a T4; warm-up and checkpointing spelled for the installed transformers; for a short demo (``max_steps`` given)
    no checkpoints are saved.
    """
    with quiet_libraries():  # bitsandbytes first: transformers may import it, and its CPU notice reaches stderr
        bnb = import_bitsandbytes()
        from transformers import TrainingArguments

        dev = as_device(device)  # decided once, for the plan and the optimizer check
        # on a CUDA GPU bitsandbytes has its fused kernel; elsewhere (CPU) try one 8-bit step first
        eight_bit = bnb is not None and (dev.type == "cuda" or training_step.adamw8bit_available(dev))
        # bfloat16 autocast on a CPU unless it would be emulated (every torch 2 supports it; unknown flags: try it)
        kwargs, changes = training_arguments_plan(output_dir, max_steps=max_steps, device=dev,
                                                  bitsandbytes=eight_bit, cpu_bf16=cpu_bf16_fast() is not False)
        return TrainingArguments(**kwargs), changes


def checkpointing_enabled(args: Any) -> bool:
    """Whether ``TrainingArguments`` switch activation (gradient) checkpointing on, in transformers 4 or 5."""
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False))


#: CPU flags that give bfloat16 matrix maths in hardware: x86 AVX-512-BF16 and AMX-BF16, ARM's BF16 extension.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


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


def run_trainer_steps(config: Any, args: Any, *, batch_examples: int = 32, seq: int = 64) -> dict[str, Any]:
    """Train a randomly initialised model of ``config`` with ``args`` on random tokens; return the log.

    Runs in this process: returns the losses, the steps done, the wall time and the peak memory of the run
    (see :func:`course_utils.peak.measure_peak`).
    """
    trainer = demo_trainer(config, args, batch_examples=batch_examples, seq=seq)
    with quiet_libraries():  # silences bitsandbytes and transformers while they work; restored afterwards
        result, peak = measure_peak(trainer.train, args.device)
    return {"losses": trainer_losses(trainer), "steps": result.global_step, "seconds": peak.seconds, "peak": peak}


def demo_trainer(config: Any, args: Any, *, batch_examples: int = 32, seq: int = 64) -> Any:
    """A Hugging Face ``Trainer`` for a randomly initialised model of ``config`` (seed 0) on ``batch_examples``
    random sequences of ``seq`` tokens (seed 1), ready to ``train()``. Built with the libraries' chatter silenced,
    and without the callback that prints every log line (the losses stay in ``trainer.state.log_history``)."""
    with quiet_libraries():
        from transformers import Trainer
        from transformers.trainer_callback import PrinterCallback
        cfg = read_config(config)
        model = training_step.build_model({"config": cfg, "method": "full", "checkpointing": False, "seed": 0})
        ids = torch.randint(0, cfg["vocab_size"], (batch_examples, seq), generator=torch.Generator().manual_seed(1))
        trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": row, "labels": row} for row in ids])
        trainer.remove_callback(PrinterCallback)
    return trainer


def trainer_losses(trainer: Any) -> list[float]:
    """The training losses a ``Trainer`` logged, one per logging step, rounded to 4 digits."""
    return [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]
