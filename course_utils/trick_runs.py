"""Measure notebook 05's tricks: one training step per trick, next to the step estimate for the same device.

:func:`measure_tricks` measures each trick of :data:`course_utils.trick_claims.TRICKS` as a change to a baseline step
(on a CPU each in its own fresh process, see :mod:`course_utils.measure`) and returns one :class:`TrickResult` per
trick: the measured peak, time and counted bytes, the estimate of :mod:`course_utils.step_memory` for the device
measured (with its breakdown), or why the trick was skipped.
"""

import contextlib
import dataclasses
from typing import Any, Mapping, Sequence

from course_utils import checks, measure
from course_utils.hardware import as_device
from course_utils.step_memory import estimate_device_for, estimate_step_for
from course_utils.trick_claims import TRICKS
from course_utils.training_arguments import cpu_bf16_fast

#: Seconds ``torch.compile`` gets to compile and run its first steps (on a GPU; a CPU skips it by default). The
#: compiling runs on the CPU cores, and a Colab T4 comes with two: a minute is too short there.
COMPILE_TIMEOUT_S = 300.0
#: Why a trick is not run on a CPU (a table cell says it in a few words: see course_utils.trick_verdicts).
_SLOW_BF16 = "skipped on this CPU: no bfloat16 instructions, 16-bit maths is emulated (skip_slow_bf16=False runs it)"
_CPU_COMPILE = "skipped on a CPU: compiling the forward and backward takes minutes here (compile_on_cpu=True tries it)"


@dataclasses.dataclass
class TrickResult:
    """One trick measured (or skipped, with the reason), and its estimate.

    ``estimate_saved`` is the estimate's activations saved for backward, by kind (plain data: the verdicts cite a
    part only where its total matches the bytes the step counted).
    """

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
    estimate_saved: dict[str, int] | None = None
    device: str | None = None  # the device the step was measured on (or would have been, when skipped)
    skipped: str | None = None
    measurement: Any = None


#: What a row copies from its measurement: the fields both have (peak, times, counted bytes, the device).
_MEASURED = tuple(TrickResult.__dataclass_fields__.keys() & measure.StepMeasurement.__dataclass_fields__.keys())


def trick_kwargs(key: str, base: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`~course_utils.measure.measure_training_step` for one trick."""
    kwargs = {**base, **TRICKS[checks.choice(key, "trick", TRICKS)].change}
    if key == "accumulation":  # same examples per optimizer step, in micro-batches
        k, batch = kwargs["accumulation"], int(base.get("batch", 8))
        if batch % k:
            raise ValueError(f"batch must be divisible by the {k} micro-batches of the accumulation trick, got {batch}")
        kwargs["batch"] = batch // k
    return kwargs


def measure_tricks(
    config: Any,
    base: Mapping[str, Any],
    keys: Sequence[str] = tuple(TRICKS),
    *,
    timeout_s: float = 300.0,
    compile_timeout_s: float = COMPILE_TIMEOUT_S,
    device: Any = None,
    compile_on_cpu: bool = False,
    skip_slow_bf16: bool = False,
) -> list[TrickResult]:
    """Measure one training step per trick (``baseline`` first) on ``device``, next to its estimate for that same
    device; ``base`` is the step every trick changes (see :func:`trick_kwargs`). ``device`` None means
    :func:`course_utils.hardware.pick_device`, decided once for the estimates and the measurements. On a CPU each
    step runs in a fresh child process bounded by ``timeout_s``; on a GPU in this process, its peak counted above
    the memory already allocated (see :func:`course_utils.measure.measure_training_step`). A trick that fails (any
    error, out of memory included) or runs past its time limit (``compile_timeout_s`` for ``torch.compile``, which
    always gets a child process) is returned with ``skipped`` set to the reason instead of stopping the others. On a
    CPU, ``torch.compile`` is tried only with ``compile_on_cpu=True``: building the compiled C++ takes minutes on a
    laptop, so by default its row says it was skipped, and why. With ``skip_slow_bf16=True`` the 16-bit row is
    skipped (and says why) on a CPU without bfloat16 instructions (``cpu_bf16_fast()`` False), where 16-bit matrix
    multiplies are emulated, many times slower than float32: a notebook need not wait minutes for a known answer."""
    dev = as_device(device)  # the one device decision: estimates below are for the device measured
    rows = {key: _estimated_row(key, base, config, dev) for key in keys}  # each key is checked there
    if "bf16" in rows and dev.type == "cpu" and skip_slow_bf16 and cpu_bf16_fast() is False:
        rows["bf16"].skipped = _SLOW_BF16
    if "compile" in rows and dev.type == "cpu" and not compile_on_cpu:
        rows["compile"].skipped = _CPU_COMPILE
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
        row.estimate_bytes, row.estimate_moment = est.peak_bytes, est.peak_moment
        row.estimate_attention, row.estimate_saved = est.attention.backend, dict(est.activations.by_kind)
    return row


def _record(row: TrickResult, m: Any, limit: float) -> None:
    """Put a measurement (or the reason there is none: a :class:`~course_utils.measure.Skipped`) into ``row``."""
    if isinstance(m, measure.Skipped) and m.reason.startswith("TimeoutError"):
        row.skipped = f"skipped: did not finish within its {limit:g} s budget on this machine"
    elif isinstance(m, measure.Skipped):
        row.skipped = f"skipped: the step failed ({m.reason.strip().splitlines()[-1][:160]})"
    else:
        row.measurement = m
        for name in _MEASURED:
            setattr(row, name, getattr(m, name))
