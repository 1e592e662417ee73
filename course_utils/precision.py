"""Mixed precision: what 16-bit numbers can and cannot hold, what autocast does, how fast it is.

The notebook ``02_mixed_precision`` and its widgets call these helpers. They fall into five groups:

* **formats**: :func:`resolve_dtype`, :func:`cast_value`, :func:`spacing_around`;
* **tiny updates**: :func:`apply_update`, :func:`survives`, :func:`smallest_surviving_update`,
  :func:`update_report` (why the update ``w - lr * grad`` must happen in float32);
* **range and loss scaling**: :func:`synthetic_gradients`;
* **speed**: :func:`all_formats_size`, :func:`time_matmul` (``torch.utils.benchmark.Timer(...)
  .blocked_autorange(...)``), :func:`timing_report`, :func:`matmul_report`;
* **training and libraries**: :func:`train_mixed_precision` (on the course's
  digits task and MLP from :mod:`course_utils.digits`), :func:`training_arguments_kwargs`, :func:`library_settings`.

Every function takes plain values (a dtype may be given by name: ``"float32"``, ``"bf16"``, ...) and rejects
bad input with a ``ValueError`` or ``TypeError`` that names the argument and what is allowed.
"""

import bisect
import math
import timeit
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from course_utils import checks, digits, hardware

#: What a ``device`` argument may be: a torch device, a name such as "cuda:0", or None (the best one here).
Device = torch.device | str | None

# --------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------
#: The three formats of the lesson, by their PyTorch names, and the other names they go by.
_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALIASES: dict[str, str] = dict(fp32="float32", float="float32", bf16="bfloat16", fp16="float16", half="float16")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for ``dtype``: one of float32, bfloat16, float16, given as a dtype or a name.

    Names may be ``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``/``"half"``,
    with or without a ``"torch."`` prefix (a torch dtype is read by its name, ``str(torch.bfloat16)``).
    """
    checks.instance(dtype, "dtype", (str, torch.dtype), "a torch.dtype or a name such as 'bfloat16'")
    key = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPES[checks.choice(_ALIASES.get(key, key), "dtype", _DTYPES)]


def dtype_name(dtype: str | torch.dtype) -> str:
    """The short name of a lesson dtype: 'float32', 'bfloat16' or 'float16'."""
    return str(resolve_dtype(dtype)).removeprefix("torch.")


def _stored(value: float, dt: torch.dtype) -> torch.Tensor:
    """``value`` rounded to ``dt`` (from float64, so that it is rounded once), as a 0-d tensor."""
    return torch.tensor(value, dtype=torch.float64).to(dt)


def _finite_in(value: float, dt: torch.dtype, argument: str) -> float:
    """``value`` when it is a number within the finite range of ``dt``."""
    limit = torch.finfo(dt).max
    return checks.number(value, argument, -limit, limit)


def cast_value(value: float, dtype: str | torch.dtype) -> float:
    """``value`` stored in ``dtype`` and read back as a Python float (inf when it overflows, 0.0 when it flushes)."""
    return _stored(checks.number(value, "value"), resolve_dtype(dtype)).item()


def spacing_around(value: float, dtype: str | torch.dtype) -> tuple[float, float]:
    """The gaps from ``value`` (first rounded to ``dtype``) to its neighbours below and above in ``dtype``.

    At a power of two the gap below is half the gap above: 1.0's neighbour below in float32 is 1 - 2**-24,
    its neighbour above 1 + 2**-23.
    """
    dt = resolve_dtype(dtype)
    w = _stored(_finite_in(value, dt, "value"), dt)
    below, above = torch.nextafter(w, torch.tensor([-math.inf, math.inf], dtype=dt)).double()
    return (w.double() - below).item(), (above - w.double()).item()


# --------------------------------------------------------------------------------------------
# Can a tiny update survive?
# --------------------------------------------------------------------------------------------
def apply_update(w: float, update: float, dtype: str | torch.dtype) -> float:
    """``w - update`` with both stored in ``dtype`` and the result rounded to ``dtype``, as a Python float.

    This is one optimizer step ``w <- w - lr * grad`` on a weight kept in ``dtype`` (``update = lr * grad``).
    """
    dt = resolve_dtype(dtype)
    return (_stored(_finite_in(w, dt, "w"), dt) - _stored(_finite_in(update, dt, "update"), dt)).item()


def survives(w: float, update: float, dtype: str | torch.dtype) -> bool:
    """True when subtracting ``update`` from ``w`` in ``dtype`` changes the stored weight."""
    return apply_update(w, update, dtype) != cast_value(w, dtype)


def _float32_with_bits(bits: int) -> float:
    """The float32 number whose bit pattern is the integer ``bits``."""
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def smallest_surviving_update(w: float, dtype: str | torch.dtype) -> float:
    """The smallest positive float32 update that changes ``w`` when subtracted in ``dtype``.

    Found by bisection over float32 values (positive floats sort like their bit patterns), using the real
    torch arithmetic of :func:`apply_update`: from +0.0, which never survives, to a whole gap below ``w``,
    which always does. The answer sits just above half that gap: smaller updates round back to ``w``.
    """
    gap_below = spacing_around(w, dtype)[0]
    patterns = range(torch.tensor([gap_below], dtype=torch.float32).view(torch.int32).item() + 1)
    first = bisect.bisect_left(patterns, True, key=lambda bits: survives(w, _float32_with_bits(bits), dtype))
    return _float32_with_bits(first)


def update_report(dtype: str | torch.dtype, update: float) -> str:
    """Text for the tiny-update widget: one step ``w - update`` on w = 1.0 in ``dtype``, next to the float32 copy.

    ``update`` is lr * |gradient| (the widget's slider: a positive number).
    """
    dt, name, w = resolve_dtype(dtype), dtype_name(dtype), 1.0
    new16, new32 = apply_update(w, update, dt), apply_update(w, update, torch.float32)
    below, above = spacing_around(w, dt)
    neighbours = f"{w - below:.9g} below (gap {below:.3e}), {w + above:.9g} above (gap {above:.3e})"
    kept = new16 != cast_value(w, dt)
    verdict = "survives" if kept else "is LOST: rounds back to w"
    lines = [
        f"w = {w} stored in {name}; update lr*grad = {update:.3e}",
        f"  neighbours of w in {name}: {neighbours}",
        f"  {name:>8}: w - update = {new16:.9g}   -> the update {verdict}",
        f"   float32: w - update = {new32:.9g}   (the master copy)",
        f"  smallest update that survives in {name}: {smallest_surviving_update(w, dt):.3e}",
    ]
    if kept and new16 != cast_value(w - update, dt):
        lines.append("  note: the 16-bit result is rounded, so the step taken is not the step asked for")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Range and loss scaling
# --------------------------------------------------------------------------------------------
def synthetic_gradients(
    n: int = 100_000, log10_mean: float = -6.0, log10_std: float = 1.5, seed: int = 0
) -> torch.Tensor:
    """``n`` float32 gradient values with random signs and magnitudes ``10**N(log10_mean, log10_std)``.

    A stand-in for the activation gradients of a deep network: most are small, and a long tail is tiny.
    """
    n = checks.integer(n, "n", 1, 10_000_000)
    log10_mean = checks.number(log10_mean, "log10_mean", -30, 30)
    log10_std = checks.positive(log10_std, "log10_std", 10)
    g = torch.Generator().manual_seed(seed)
    exponents = log10_mean + log10_std * torch.randn(n, generator=g, dtype=torch.float64)
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (signs * 10.0**exponents).float()


# --------------------------------------------------------------------------------------------
# Matmul speed
# --------------------------------------------------------------------------------------------
#: Largest matrix side :func:`time_matmul` accepts (a 16384² float32 matrix is 1 GiB).
_MAX_MATMUL_SIZE = 16384
#: Largest side the size widget offers on a CPU (a 4096² float32 matmul takes about 1-2 s on 2 cores).
MAX_CPU_WIDGET_SIZE = 4096
#: Largest side float16 is timed at on a CPU. Most CPUs have no float16 matrix instructions, and PyTorch's CPU
#: float16 matmul is tens to hundreds of times slower than float32: one 256² multiply takes tens of milliseconds
#: on a 2-core CPU, a 2048² one most of a minute.
CPU_FLOAT16_MAX_SIZE = 256
#: Seconds a CPU timing may take at most (all its runs together); larger matrices are shrunk to fit.
_CPU_TIMING_BUDGET_S = 6.0
#: Side of the small multiply that estimates how long a large one would take on a CPU.
_CPU_PROBE_SIZE = 256


class MatmulTiming(NamedTuple):
    """One timed square matrix multiply."""

    size: int
    dtype: str
    device: str
    ms: float  # milliseconds per multiply (the median of blocked_autorange's blocks)
    tflops: float  # achieved throughput, 2 * size**3 floating-point operations per multiply


def all_formats_size(device: Device = None) -> int:
    """The side at which the lesson times float32, bfloat16 and float16 side by side on ``device``.

    4096 on a GPU (large enough to keep its tensor cores busy); :data:`CPU_FLOAT16_MAX_SIZE` on a CPU, so that
    the slow float16 multiply stays well under a second there.
    """
    return 4096 if hardware.as_device(device).type == "cuda" else CPU_FLOAT16_MAX_SIZE


def _cpu_size_within_budget(size: int, seconds_at: Callable[[int], float], runs: int) -> int:
    """The largest side from :data:`_CPU_PROBE_SIZE` doubling up to ``size`` whose ``runs`` multiplies fit in budget.

    ``seconds_at(n)`` times one ``n x n`` multiply. Starting at the probe size, each measured side predicts the
    next: a multiply costs ``2 n**3`` operations, so doubling the side takes 8 times as long. The climb stops
    where ``runs`` multiplies of the next side would exceed :data:`_CPU_TIMING_BUDGET_S`. A CPU without fast
    16-bit instructions can be many times slower in bfloat16 than in float32; this keeps a timing cell short there, and
    measuring each step (rather than extrapolating from the smallest) keeps a busy machine's pauses from
    shrinking a fast multiply.
    """
    side = min(size, _CPU_PROBE_SIZE)
    while side < size and runs * seconds_at(side) * 8 <= _CPU_TIMING_BUDGET_S:
        side *= 2
    return min(side, size)


def _cpu_seconds(n: int, dtype: torch.dtype) -> float:
    """Seconds one ``n x n`` multiply in ``dtype`` takes on the CPU: the fastest of two, after a first call."""
    a = torch.ones(n, n, dtype=dtype)
    return min(timeit.repeat(lambda: a @ a, number=1, repeat=3)[1:])  # the first call pays for setup


def time_matmul(size: int, dtype: str | torch.dtype, device: Device = None, min_run_time: float = 0.2) -> MatmulTiming:
    """Time ``a @ b`` for two random ``size x size`` matrices in ``dtype`` with ``torch.utils.benchmark``.

    The call the notebook shows, on all of torch's CPU threads (``Timer`` would use one by default)::

        Timer(stmt="a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
            .blocked_autorange(min_run_time=min_run_time)

    ``blocked_autorange`` warms up, picks a block of runs long enough to hide the clock's overhead, and repeats
    blocks for at least ``min_run_time`` seconds; ``ms`` is the median time per multiply. It synchronizes a GPU
    before reading the clock, so the asynchronous CUDA launches are really finished. The matrices are drawn in
    float32 on the CPU from their own generator (seed 0) and then converted, so every device and dtype gets the
    same numbers (rounded to the format) and the global random state is left as it was. On a CPU, float16 is
    refused above :data:`CPU_FLOAT16_MAX_SIZE`, and a small multiply first predicts the time: if the runs would
    take more than :data:`_CPU_TIMING_BUDGET_S`, smaller matrices are timed instead (see
    :func:`_cpu_size_within_budget`; ``size`` in the result says which).
    """
    from torch.utils import benchmark  # imported on use: it is not needed elsewhere

    size, dt, dev, refusal = _timing_case(size, dtype, device)
    if refusal:
        raise ValueError(f"dtype: {refusal}")
    min_run_time = checks.positive(min_run_time, "min_run_time", 10)
    if dev.type == "cpu":
        size = _cpu_size_within_budget(size, lambda n: _cpu_seconds(n, dt), runs=3)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(device=dev, dtype=dt) for _ in range(2))
    timer = benchmark.Timer(stmt="a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=min_run_time).median
    return MatmulTiming(size, dtype_name(dt), str(dev), seconds * 1e3, 2 * size**3 / seconds / 1e12)


def fraction_of_peak(timing: MatmulTiming, sheet: hardware.Datasheet | None) -> float | None:
    """Achieved / datasheet throughput for ``timing``'s dtype, or None (no datasheet, or no fast path for it).

    float32 is compared with the datasheet's plain float32 figure (PyTorch does not use TF32 for matmuls
    unless you allow it); float16 with the 16-bit tensor-core figure; bfloat16 too, except on a GPU without
    native bfloat16 (a T4), whose datasheet has no bfloat16 figure.
    """
    no_bf16_figure = timing.dtype == "bfloat16" and not hardware.bf16_native(timing.device)  # a T4: none
    if sheet is None or not timing.device.startswith("cuda") or no_bf16_figure:
        return None
    return timing.tflops / (sheet.fp32_tflops if timing.dtype == "float32" else sheet.tensor16_tflops)


def timing_report(timings: Sequence[MatmulTiming], sheet: hardware.Datasheet | None = None) -> str:
    """Lines of ms per multiply and TFLOP/s for each timing, the speed-up over the first, and % of peak."""
    return "\n".join(_timing_line(t, timings[0], sheet) for t in timings)


def _timing_line(t: MatmulTiming, base: MatmulTiming, sheet: hardware.Datasheet | None) -> str:
    """One line of :func:`timing_report`: ``t`` on its own, then against ``base`` and the datasheet peak."""
    rate = t.tflops * 1000  # GFLOP/s
    gflops = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"  # small CPU figures keep 2 digits
    line = f"{t.dtype:>8} on {t.device}: {t.ms:9.2f} ms per {t.size}x{t.size} matmul, "
    line += f"{t.tflops:8.3f} TFLOP/s ({gflops} GFLOP/s)"
    if t is not base and t.size == base.size:
        speedup = base.ms / t.ms
        change = f"{speedup:.1f}x faster" if speedup >= 1 else f"{1 / speedup:.1f}x slower"
        line += f", {change} than {base.dtype}"
    elif t is not base:  # shrunk to fit the CPU time budget: compare throughputs, not times
        line += f", {t.tflops / base.tflops:.2f}x the throughput of {base.dtype} (a smaller matrix: too slow here)"
    peak = fraction_of_peak(t, sheet)
    if peak is not None:
        line += f", {peak:.0%} of the {sheet.name} datasheet peak"
    return line


def _timing_case(size: int, dtype: str | torch.dtype, device: Device) -> tuple[int, torch.dtype, torch.device, str]:
    """The checked size, dtype and device of a matmul timing, and why it is not timed here ('' when it is).

    Only float16 on a CPU is refused, and only above :data:`CPU_FLOAT16_MAX_SIZE`.
    """
    size = checks.integer(size, "size", 1, _MAX_MATMUL_SIZE)
    dt, dev, n = resolve_dtype(dtype), hardware.as_device(device), CPU_FLOAT16_MAX_SIZE
    if dt != torch.float16 or dev.type != "cpu" or size <= n:
        return size, dt, dev, ""
    refusal = (
        f"float16 is timed on a CPU only up to {n}x{n}: CPU float16 matmuls are tens to hundreds of times slower than "
        f"float32, so one {size}x{size} multiply could take minutes. Choose a side of {n} or less, or bfloat16."
    )
    return size, dt, dev, refusal


def matmul_report(size: int, dtype: str | torch.dtype, device: Device = None) -> str:
    """Text for the matmul widget: one timing of ``dtype`` next to float32, or why it is not timed here."""
    size, dt, dev, refusal = _timing_case(size, dtype, device)
    if refusal:
        return refusal
    dtypes = [torch.float32] if dt == torch.float32 else [torch.float32, dt]
    return timing_report([time_matmul(size, d, dev) for d in dtypes], hardware.current_datasheet())


# --------------------------------------------------------------------------------------------
# The mixed-precision training loop (on the course's digits task: course_utils.digits)
# --------------------------------------------------------------------------------------------
#: Notebook 02's classifier: :func:`course_utils.digits.make_mlp` with two hidden layers of 128 ReLU units
#: (64 pixels -> 128 -> 128 -> 10 digit scores).
CLASSIFIER = {"hidden": 128, "depth": 2}
#: What :func:`train_mixed_precision` multiplies the loss of a ``spike_at`` step by (enough to overflow float16).
_SPIKE_FACTOR = 1e4


class StepLog(NamedTuple):
    """One training step: the (unscaled) loss, the loss scale after the step, and whether it was skipped."""

    step: int
    loss: float
    scale: float
    skipped: bool

    def text(self, losses: bool) -> str:
        """'step N: loss L, loss scale S' (without the loss when not ``losses``), and a note if it was skipped."""
        loss = f"loss {self.loss:.2f}, " if losses else ""
        skipped = "   <- gradients overflowed: step skipped, scale halved" if self.skipped else ""
        return f"step {self.step:3d}: {loss}loss scale {self.scale:,.0f}{skipped}"


class TrainResult(NamedTuple):
    """What :func:`train_mixed_precision` returns."""

    dtype: str  # the autocast dtype ('float32' means autocast off)
    loss_scaling: bool
    history: Sequence[StepLog] = ()
    test_accuracy: float = 0.0

    @property
    def skipped_steps(self) -> list[int]:
        """The steps whose update the scaler skipped (its gradients overflowed)."""
        return [log.step for log in self.history if log.skipped]

    def mean_loss(self, last: int = 50) -> float:
        """Mean training loss over the ``last`` steps (all of them when there are fewer)."""
        last = checks.integer(last, "last", 1)
        tail = [log.loss for log in self.history[-last:]]
        return sum(tail) / len(tail)

    def log_lines(self, every: int = 25, losses: bool = True) -> str:
        """'step N: loss L, loss scale S' every ``every`` steps, plus every skipped step.

        ``losses=False`` leaves the losses out: the loss scale and the skipped steps are the same on every
        processor, while the last digits of a 16-bit loss are not.
        """
        every = checks.integer(every, "every", 1)
        losses = checks.flag(losses, "losses")
        shown = [log for log in self.history if log.step % every == 0 or log.step == 1 or log.skipped]
        return "\n".join(log.text(losses) for log in shown)


def train_mixed_precision(
    dtype: str | torch.dtype | None = None,
    *,
    device: Device = None,
    steps: int = 200,
    spike_at: Sequence[int] = (),
    task: digits.DigitsData | None = None,
) -> TrainResult:
    """Train :data:`CLASSIFIER` on the digits with ONE loop whose tricks are flags.

    ``dtype`` float32 switches autocast off; bfloat16/float16 switch it on (default: the lesson's dtype for
    ``device``). The ``GradScaler`` is enabled for float16 only. ``spike_at`` lists steps whose loss is
    multiplied by :data:`_SPIKE_FACTOR` before the backward pass, on purpose: with float16 and a scale of 65,536
    the gradients overflow, and the scaler skips that step and halves the scale. ``task`` defaults to
    :func:`course_utils.digits.load_digits_data` (the course's split). Adam's learning rate (3e-3), the
    mini-batches of 64 and seed 0 (initial weights and batches) are those of the notebook's visible loop.

    ``device`` None means :func:`course_utils.hardware.pick_device`; ``dtype`` None means the lesson's dtype
    there (:func:`course_utils.hardware.autocast_dtype`: float16 on a T4, bfloat16 on Ampere+ and on CPUs).
    Loss scaling follows :func:`course_utils.hardware.needs_loss_scaling`.
    """
    dev = hardware.as_device(device)
    dt = hardware.autocast_dtype(dev) if dtype is None else resolve_dtype(dtype)
    steps = checks.integer(steps, "steps", 1, digits.MAX_STEPS)
    for spike in spike_at:
        checks.integer(spike, "spike_at (a step)", 1, steps)
    task = digits.load_digits_data() if task is None else digits.check_data(task, "task")
    model = digits.make_mlp(seed=0, **CLASSIFIER).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    scaler = torch.amp.GradScaler(dev.type, enabled=hardware.needs_loss_scaling(dt))  # flag 2: float16 only
    history = []
    for step, (x, y) in enumerate(task.batches(steps, 64, seed=0), start=1):
        x, y = x.to(dev), y.to(dev)
        with torch.autocast(device_type=dev.type, dtype=dt, enabled=dt != torch.float32):  # flag 1: 16-bit maths
            loss = F.cross_entropy(model(x), y)  # matmuls in 16-bit, loss in float32
        factor = _SPIKE_FACTOR if step in spike_at else 1.0
        scale_before = scaler.get_scale()
        scaler.scale(loss * factor).backward()  # backward outside autocast
        scaler.step(optimizer)  # unscale; skip if inf/nan; update fp32
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scale_after = scaler.get_scale()
        history.append(StepLog(step, loss.item(), scale_after, scale_after < scale_before))
    return TrainResult(dtype_name(dt), scaler.is_enabled(), history, digits.evaluate(model, task).accuracy)


# --------------------------------------------------------------------------------------------
# One setting in the libraries
# --------------------------------------------------------------------------------------------
def training_arguments_kwargs(device: Device = None, *, cpu_bf16: bool = True) -> dict[str, bool]:
    """Mixed-precision keyword arguments for ``transformers.TrainingArguments`` on ``device``: the one 16-bit rule.

    Ampere+ GPU: ``bf16=True``. Older GPU (T4, V100): ``fp16=True`` (the Trainer adds loss scaling).
    CPU: ``bf16=True, use_cpu=True``: transformers refuses ``bf16=True`` without a bf16 GPU unless told
    that the CPU is meant, and ``fp16=True`` would be accepted but runs float16 maths, very slow on CPUs.
    ``cpu_bf16=False`` (a CPU without bfloat16 instructions, see :func:`course_utils.training_arguments.cpu_bf16_fast`)
    gives ``bf16=False``: emulated bfloat16 would be many times slower than float32.
    Note that transformers itself would accept ``bf16=True`` on a T4 (bfloat16 is emulated there, slowly):
    the choice follows the compute capability, as :func:`course_utils.hardware.autocast_dtype` does.
    """
    dev = hardware.as_device(device)
    if dev.type == "cuda":
        return {"bf16": True} if hardware.autocast_dtype(dev) == torch.bfloat16 else {"fp16": True}
    return {"bf16": bool(cpu_bf16), "use_cpu": True}


def library_settings(dtype: str | torch.dtype) -> dict[str, str]:
    """The one setting that turns on mixed precision in three libraries, as code text, for ``dtype``."""
    dt = resolve_dtype(dtype)
    if dt == torch.float32:
        raise ValueError("dtype must be bfloat16 or float16: float32 is the setting without mixed precision")
    flag, lightning = ("bf16", "bf16-mixed") if dt == torch.bfloat16 else ("fp16", "16-mixed")
    return {
        "Hugging Face Trainer": f'TrainingArguments(output_dir="out", {flag}=True)',
        "Hugging Face Accelerate": f'Accelerator(mixed_precision="{flag}")',
        "PyTorch Lightning": f'Trainer(precision="{lightning}")',
    }
