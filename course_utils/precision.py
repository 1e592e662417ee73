"""Mixed precision: what 16-bit numbers can and cannot hold, what autocast does, how fast it is.

The notebook ``02_mixed_precision`` calls these helpers. They fall into five groups:

* **formats**: :func:`resolve_dtype`, :func:`format_facts`, :func:`spacing_around`;
* **tiny updates**: :func:`apply_update`, :func:`smallest_surviving_update`, :func:`repeated_updates`,
  :func:`update_report` (why the update ``w - lr * grad`` must happen in float32);
* **range and loss scaling**: :func:`cast_value`, :func:`synthetic_gradients`, :func:`fp16_cast_stats`;
* **autocast and speed**: :func:`autocast_example`, :func:`autocast_op_dtypes`, :func:`all_formats_size`,
  :func:`time_matmul` (``torch.utils.benchmark.Timer(...).blocked_autorange(...)``), :func:`timing_report`;
* **training and libraries**: :func:`mixed_precision_plan`, :func:`train_mixed_precision` (on the course's
  digits task and MLP from :mod:`course_utils.digits`), :func:`compare_runs` (a 16-bit run against float32,
  within a tolerance that holds on every processor), :func:`training_arguments_kwargs`, :func:`library_settings`.

Every function takes plain values (a dtype may be given by name: ``"float32"``, ``"bf16"``, ...) and rejects
bad input with a ``ValueError`` or ``TypeError`` that names the argument and what is allowed.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from course_utils import checks, digits, hardware

# --------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------
#: The three formats of the lesson, by their PyTorch names.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALIASES: dict[str, str] = {"fp32": "float32", "float": "float32", "bf16": "bfloat16",
                            "fp16": "float16", "half": "float16"}

def resolve_dtype(dtype: str | torch.dtype, argument: str = "dtype") -> torch.dtype:
    """The torch dtype for ``dtype``: one of float32, bfloat16, float16, given as a dtype or a name.

    Names may be ``"float32"``/``"fp32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``/``"half"``,
    with or without a ``"torch."`` prefix.
    """
    allowed = "float32 (fp32), bfloat16 (bf16) or float16 (fp16)"
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise ValueError(f"{argument} must be {allowed}, got {dtype}")
    if not isinstance(dtype, str):
        raise TypeError(f"{argument} must be a torch.dtype or a name such as 'bfloat16', got {type(dtype).__name__}")
    key = dtype.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"{argument} must be {allowed}, got {dtype!r}")
    return DTYPES[key]


def dtype_name(dtype: str | torch.dtype) -> str:
    """The short name of a lesson dtype: 'float32', 'bfloat16' or 'float16'."""
    return str(resolve_dtype(dtype)).removeprefix("torch.")


class FormatFacts(NamedTuple):
    """What ``torch.finfo`` says about a floating-point format, plus its smallest subnormal."""

    name: str
    bits: int
    mantissa_bits: int       # stored fraction bits (the leading 1 is implicit)
    eps: float               # gap between 1.0 and the next larger number
    max: float               # largest finite value
    smallest_normal: float   # smallest value with full precision
    smallest_subnormal: float  # smallest value above zero at all (with fewer significant bits)


def format_facts(dtype: str | torch.dtype) -> FormatFacts:
    """Bits, precision and range of ``dtype``, read from ``torch.finfo``."""
    dt = resolve_dtype(dtype)
    info = torch.finfo(dt)
    mantissa_bits = round(-math.log2(info.eps))
    return FormatFacts(dtype_name(dt), info.bits, mantissa_bits, float(info.eps), float(info.max),
                       float(info.smallest_normal), float(info.smallest_normal) * float(info.eps))


def formats_table(dtypes: Sequence[str | torch.dtype] = ("float32", "bfloat16", "float16")) -> str:
    """A text table of each format's bits, gap after 1.0, largest value and smallest normal value."""
    if not dtypes:
        raise ValueError("dtypes must name at least one format")
    lines = [f"{'format':>8} | bits (sign/exponent/fraction) | gap after 1.0 | largest value | smallest normal"]
    for d in dtypes:
        f = format_facts(d)
        layout = f"{f.bits} (1/{f.bits - 1 - f.mantissa_bits}/{f.mantissa_bits})"
        lines.append(f"{f.name:>8} | {layout:>29} | {f.eps:>13.3g} | {f.max:>13.5g} | {f.smallest_normal:>15.3g}")
    return "\n".join(lines)


def _check_in_range(value: float, dt: torch.dtype, argument: str) -> float:
    limit = torch.finfo(dt).max
    if abs(value) > limit:
        raise ValueError(f"{argument} must lie within ±{limit:.6g}, the finite range of {dtype_name(dt)}, got {value}")
    return value


def cast_value(value: float, dtype: str | torch.dtype) -> float:
    """``value`` stored in ``dtype`` and read back as a Python float (inf when it overflows, 0.0 when it flushes)."""
    value = checks.number(value, "value")
    return torch.tensor(value, dtype=torch.float64).to(resolve_dtype(dtype)).item()


def cast_table(values: Sequence[float],
               dtypes: Sequence[str | torch.dtype] = ("float32", "bfloat16", "float16")) -> str:
    """A text table: each value (rows) as stored in each format (columns), 5 significant digits."""
    names, lines = _table_head("values", values, "value", 10, dtypes, 10)
    for v in values:
        v = checks.number(v, "values")
        lines.append(f"{v:>10.5g} | " + " | ".join(f"{cast_value(v, n):>10.5g}" for n in names))
    return "\n".join(lines)


def spacing_around(value: float, dtype: str | torch.dtype) -> tuple[float, float]:
    """The gaps from ``value`` (first rounded to ``dtype``) to its neighbours below and above in ``dtype``.

    At a power of two the gap below is half the gap above: 1.0's neighbour below in float32 is 1 - 2**-24,
    its neighbour above 1 + 2**-23.
    """
    dt = resolve_dtype(dtype)
    value = _check_in_range(checks.number(value, "value"), dt, "value")
    w = torch.tensor(value, dtype=torch.float64).to(dt)
    below = torch.nextafter(w, torch.tensor(-math.inf, dtype=dt))
    above = torch.nextafter(w, torch.tensor(math.inf, dtype=dt))
    return (w.double() - below.double()).item(), (above.double() - w.double()).item()


# --------------------------------------------------------------------------------------------
# Can a tiny update survive?
# --------------------------------------------------------------------------------------------
def apply_update(w: float, update: float, dtype: str | torch.dtype) -> float:
    """``w - update`` with both stored in ``dtype`` and the result rounded to ``dtype``, as a Python float.

    This is one optimizer step ``w <- w - lr * grad`` on a weight kept in ``dtype`` (``update = lr * grad``).
    """
    dt = resolve_dtype(dtype)
    w = _check_in_range(checks.number(w, "w"), dt, "w")
    update = _check_in_range(checks.number(update, "update"), dt, "update")
    return (torch.tensor(w, dtype=torch.float64).to(dt) - torch.tensor(update, dtype=torch.float64).to(dt)).item()


def survives(w: float, update: float, dtype: str | torch.dtype) -> bool:
    """True when subtracting ``update`` from ``w`` in ``dtype`` changes the stored weight."""
    return apply_update(w, update, dtype) != cast_value(w, dtype)


def smallest_surviving_update(w: float, dtype: str | torch.dtype) -> float:
    """The smallest positive float32 update that changes ``w`` when subtracted in ``dtype``.

    Found by bisection over float32 values (positive floats sort like their bit patterns), using the real
    torch arithmetic of :func:`apply_update`. The answer sits just above half the gap below ``w``: smaller
    updates round back to ``w``.
    """
    dt = resolve_dtype(dtype)
    w = _check_in_range(checks.number(w, "w"), dt, "w")
    gap_below, _ = spacing_around(w, dt)

    def as_f32(bits: int) -> float:  # the float32 number with this bit pattern
        return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()

    lo = 0  # bit pattern of +0.0: never survives
    hi = torch.tensor([gap_below], dtype=torch.float32).view(torch.int32).item()  # a whole gap always survives
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if survives(w, as_f32(mid), dt):
            hi = mid
        else:
            lo = mid
    return as_f32(hi)


def repeated_updates(w: float, update: float, steps: int, dtype: str | torch.dtype) -> float:
    """Apply ``w <- w - update`` ``steps`` times with the weight stored in ``dtype``; return the final weight."""
    dt = resolve_dtype(dtype)
    steps = checks.integer(steps, "steps", 1, 100_000)
    w = _check_in_range(checks.number(w, "w"), dt, "w")
    u = torch.tensor(_check_in_range(checks.number(update, "update"), dt, "update"), dtype=torch.float64).to(dt)
    weight = torch.tensor(w, dtype=torch.float64).to(dt)
    for _ in range(steps):
        weight = weight - u
    return weight.item()


def update_table(updates: Sequence[float], w: float = 1.0,
                 dtypes: Sequence[str | torch.dtype] = ("float32", "bfloat16", "float16")) -> str:
    """A text table: ``w - update`` for each update (rows) in each format (columns); '= w' marks a lost update."""
    names, lines = _table_head("updates", updates, "update", 9, dtypes, 17)
    for u in updates:
        cells = []
        for n in names:
            new = apply_update(w, u, n)
            cells.append(f"{new:.8f} {'(lost)' if new == cast_value(w, n) else '      '}")
        lines.append(f"{u:>9.0e} | " + " | ".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def _table_head(argument: str, rows: Sequence[float], first: str, first_width: int,
                dtypes: Sequence[str | torch.dtype], width: int) -> tuple[list[str], list[str]]:
    """The dtype names of a table's columns and its header line; ValueError when there are no rows."""
    if not rows:
        raise ValueError(f"{argument} must contain at least one value")
    names = [dtype_name(d) for d in dtypes]
    return names, [f"{first:>{first_width}} | " + " | ".join(f"{n:>{width}}" for n in names)]


def update_report(dtype: str | torch.dtype, update: float, w: float = 1.0) -> str:
    """Text for the tiny-update widget: one step ``w - update`` in ``dtype`` next to the float32 master copy."""
    dt = resolve_dtype(dtype)
    update = checks.positive(update, "update")  # lr * |gradient|
    name = dtype_name(dt)
    new16, new32 = apply_update(w, update, dt), apply_update(w, update, torch.float32)
    below, above = spacing_around(w, dt)
    kept = new16 != cast_value(w, dt)
    verdict = "survives" if kept else "is LOST: rounds back to w"
    lines = [
        f"w = {w} stored in {name}; update lr*grad = {update:.3e}",
        f"  neighbours of w in {name}: {w - below:.9g} below (gap {below:.3e}), "
        f"{w + above:.9g} above (gap {above:.3e})",
        f"  {name:>8}: w - update = {new16:.9g}   -> the update {verdict}",
        f"   float32: w - update = {new32:.9g}   (the master copy)",
        f"  smallest update that survives in {name}: {smallest_surviving_update(w, dt):.3e}",
    ]
    if kept and new16 != cast_value(w - update, dt):
        lines.append("  note: the 16-bit result is the nearest 16-bit number, so the step taken is not the step "
                     "asked for")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Range and loss scaling
# --------------------------------------------------------------------------------------------
def synthetic_gradients(n: int = 100_000, log10_mean: float = -6.0, log10_std: float = 1.5,
                        seed: int = 0) -> torch.Tensor:
    """``n`` float32 gradient values with random signs and magnitudes ``10**N(log10_mean, log10_std)``.

    A stand-in for the activation gradients of a deep network: most are small, and a long tail is tiny.
    """
    n = checks.integer(n, "n", 1, 10_000_000)
    log10_mean = checks.number(log10_mean, "log10_mean", -30, 30)
    log10_std = checks.positive(log10_std, "log10_std", 10)
    g = torch.Generator().manual_seed(seed)
    exponents = log10_mean + log10_std * torch.randn(n, generator=g, dtype=torch.float64)
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (signs * 10.0 ** exponents).float()


class CastStats(NamedTuple):
    """What happens to a set of values when they are multiplied by ``scale`` and stored in float16."""

    scale: float
    zero_fraction: float       # non-zero values that became exactly 0 (underflow)
    subnormal_fraction: float  # values that landed below float16's smallest normal (kept with fewer bits)
    overflow_fraction: float   # values that became inf
    kept_fraction: float       # values stored as normal float16 numbers


def fp16_cast_stats(values: torch.Tensor, scale: float = 1.0) -> CastStats:
    """Fractions of ``values * scale`` that underflow to zero, turn subnormal, overflow, or are kept in float16."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if values.numel() == 0 or not values.is_floating_point():
        raise ValueError("values must be a non-empty floating-point tensor")
    scale = checks.positive(scale, "scale")
    v = values.detach().double().flatten()
    v = v[v != 0]
    if v.numel() == 0:
        raise ValueError("values must contain at least one non-zero value")
    h = (v * scale).to(torch.float16)
    mag = h.abs()
    n = v.numel()
    zero = (mag == 0).sum().item() / n
    inf = torch.isinf(h).sum().item() / n
    sub = ((mag > 0) & (mag < torch.finfo(torch.float16).smallest_normal)).sum().item() / n
    return CastStats(scale, zero, sub, inf, 1.0 - zero - inf - sub)


# --------------------------------------------------------------------------------------------
# Autocast
# --------------------------------------------------------------------------------------------
def lesson_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The 16-bit dtype this lesson uses on ``device`` (bfloat16 on Ampere+ GPUs and CPUs, float16 on a T4)."""
    return hardware.autocast_dtype(device)


def autocast_example(device: torch.device | str | None = None, dtype: str | torch.dtype | None = None,
                     seed: int = 0) -> dict[str, torch.dtype]:
    """Run one linear layer and an MSE loss under autocast, backward outside it; return the four dtypes.

    Keys: 'weights' (the master copy), 'output' (the matrix multiply), 'loss', 'gradient'.
    """
    dev = hardware.as_device(device)
    dt = lesson_dtype(dev) if dtype is None else resolve_dtype(dtype)
    if dt == torch.float32:
        raise ValueError("dtype must be a 16-bit type (bfloat16 or float16): float32 has nothing to autocast to")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Linear(512, 512).to(dev)
        x = torch.randn(64, 512).to(dev)
        y = torch.randn(64, 512).to(dev)
    with torch.autocast(device_type=dev.type, dtype=dt):
        out = model(x)
        loss = F.mse_loss(out, y)
    loss.backward()
    return {"weights": model.weight.dtype, "output": out.dtype, "loss": loss.dtype, "gradient": model.weight.grad.dtype}


def dtype_lines(dtypes: dict[str, torch.dtype]) -> str:
    """The four lines of the lesson, aligned as ``print("weights: ", ...)`` aligns them."""
    return "\n".join(f"{key + ':':<10}{value}" for key, value in dtypes.items())


def autocast_op_dtypes(device: torch.device | str | None = None,
                       dtype: str | torch.dtype | None = None) -> dict[str, torch.dtype]:
    """Output dtype of a few typical ops inside ``torch.autocast`` on ``device``: which run in 16-bit?"""
    dev = hardware.as_device(device)
    dt = lesson_dtype(dev) if dtype is None else resolve_dtype(dtype)
    x = torch.linspace(-1, 1, 32, device=dev).reshape(4, 8)
    w = torch.linspace(1, -1, 64, device=dev).reshape(8, 8)
    target = torch.tensor([0, 1, 2, 3], device=dev)
    with torch.autocast(device_type=dev.type, dtype=dt):
        h = F.linear(x, w)
        return {
            "linear (matmul)": h.dtype,
            "layer_norm": F.layer_norm(h, (8,)).dtype,
            "softmax": torch.softmax(h, dim=-1).dtype,
            "cross_entropy": F.cross_entropy(h, target).dtype,
            "mse_loss": F.mse_loss(h, x).dtype,
        }


# --------------------------------------------------------------------------------------------
# Matmul speed
# --------------------------------------------------------------------------------------------
#: Largest matrix side :func:`time_matmul` accepts (a 16384² float32 matrix is 1 GiB).
MAX_MATMUL_SIZE = 16384
#: Largest side the size widget offers on a CPU (a 4096² float32 matmul takes about 1-2 s on 2 cores).
MAX_CPU_WIDGET_SIZE = 4096
#: Largest side float16 is timed at on a CPU. Most CPUs have no float16 matrix instructions, and PyTorch's CPU
#: float16 matmul is tens to hundreds of times slower than float32: one 256² multiply takes tens of milliseconds
#: on a 2-core CPU, a 2048² one most of a minute.
CPU_FLOAT16_MAX_SIZE = 256
#: Seconds of timed runs a timing collects at least: ``Timer.blocked_autorange(min_run_time=MIN_RUN_TIME_S)``.
MIN_RUN_TIME_S = 0.2
#: The statement every timing runs, on two square matrices ``a`` and ``b``.
MATMUL_STMT = "a @ b"


class MatmulTiming(NamedTuple):
    """One timed square matrix multiply."""

    size: int
    dtype: str
    device: str
    ms: float        # milliseconds per multiply (median of blocked_autorange's blocks, or mean of timeit's runs)
    tflops: float    # achieved throughput, 2 * size**3 floating-point operations per multiply
    measurement: Any = None  # the torch.utils.benchmark Measurement behind it (None when built by hand)

    @property
    def gflops(self) -> float:
        """Achieved throughput in GFLOP/s."""
        return self.tflops * 1000


def matmul_flops(size: int) -> int:
    """Floating-point operations of one ``size x size`` by ``size x size`` multiply: 2 * size**3."""
    return 2 * checks.integer(size, "size", 1, MAX_MATMUL_SIZE) ** 3


def default_matmul_size(device: torch.device | str | None = None) -> int:
    """A large multiply's side: 4096 on a GPU; 2048 on a CPU, where one 4096² float32 multiply takes seconds.

    :func:`timing_refusal` judges this size when it is given none.
    """
    return 4096 if hardware.as_device(device).type == "cuda" else 2048


def all_formats_size(device: torch.device | str | None = None) -> int:
    """The side at which the lesson times float32, bfloat16 and float16 side by side on ``device``.

    4096 on a GPU (large enough to keep its tensor cores busy); :data:`CPU_FLOAT16_MAX_SIZE` on a CPU, so that
    the slow float16 multiply stays well under a second there.
    """
    return 4096 if hardware.as_device(device).type == "cuda" else CPU_FLOAT16_MAX_SIZE


def timing_refusal(dtype: str | torch.dtype, device: torch.device | str | None = None,
                   size: int | None = None) -> str | None:
    """Why ``dtype`` should not be timed at ``size`` on ``device``, or None when timing it is fine.

    Only float16 on a CPU is refused, and only above :data:`CPU_FLOAT16_MAX_SIZE`; ``size`` None means
    :func:`default_matmul_size` (so float16 is refused at a CPU's default 2048 and timed on a GPU).
    """
    dt, dev = resolve_dtype(dtype), hardware.as_device(device)
    size = default_matmul_size(dev) if size is None else checks.integer(size, "size", 1, MAX_MATMUL_SIZE)
    if dt == torch.float16 and dev.type == "cpu" and size > CPU_FLOAT16_MAX_SIZE:
        n = CPU_FLOAT16_MAX_SIZE
        return (f"float16 is timed on a CPU only up to {n}x{n}: most CPUs have no float16 matrix instructions, and "
                f"PyTorch's CPU float16 matmul is tens to hundreds of times slower than float32, so one {size}x{size} "
                f"multiply could take a minute or more. Choose a side of {n} or less, or bfloat16.")
    return None


#: Seconds a CPU timing may take at most (all its runs together); larger matrices are shrunk to fit.
CPU_TIMING_BUDGET_S = 6.0
#: Side of the small multiply that estimates how long a large one would take on a CPU.
CPU_PROBE_SIZE = 256


def cpu_size_within_budget(size: int, seconds_at: Callable[[int], float], runs: int,
                           budget_s: float = CPU_TIMING_BUDGET_S, probe_size: int = CPU_PROBE_SIZE) -> int:
    """The largest side from ``probe_size`` doubling up to ``size`` whose ``runs`` multiplies fit in ``budget_s``.

    ``seconds_at(n)`` times one ``n x n`` multiply. Starting at ``probe_size``, each measured side predicts the
    next: a multiply costs ``2 n**3`` operations, so doubling the side takes 8 times as long. The climb stops
    where ``runs`` multiplies of the next side would exceed the budget. A CPU without fast 16-bit instructions
    can be many times slower in bfloat16 than in float32; this keeps a timing cell short there, and
    measuring each step (rather than extrapolating from the smallest) keeps a busy machine's pauses from
    shrinking a fast multiply.
    """
    size = checks.integer(size, "size", 1, MAX_MATMUL_SIZE)
    if not callable(seconds_at):
        raise TypeError(f"seconds_at must be a function of the matrix side, got {type(seconds_at).__name__}")
    runs = checks.integer(runs, "runs", 1)
    budget_s = checks.positive(budget_s, "budget_s")
    side = min(size, probe_size)
    while side < size:
        seconds = checks.number(seconds_at(side), "seconds_at's result (seconds)", 0)
        if runs * seconds * 8 > budget_s:
            break
        side *= 2
    return min(side, size)


def _cpu_seconds(dtype: torch.dtype) -> Callable[[int], float]:
    """A function timing one ``n x n`` multiply in ``dtype`` on the CPU: the fastest of two, after a first call."""
    def seconds_at(n: int) -> float:
        a = torch.ones(n, n, dtype=dtype)
        a @ a  # the first call of a size pays for setup
        fastest = math.inf
        for _ in range(2):
            start = time.perf_counter()
            a @ a
            fastest = min(fastest, time.perf_counter() - start)
        return fastest
    return seconds_at


def random_matrices(size: int, dtype: str | torch.dtype, device: torch.device | str | None = None,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random ``size x size`` matrices in ``dtype`` on ``device``, from their own generator (``seed``).

    They are drawn in float32 on the CPU and then converted, so every device and dtype gets the same numbers
    (rounded to the format), and the global random state is left as it was.
    """
    size = checks.integer(size, "size", 1, MAX_MATMUL_SIZE)
    dt, dev = resolve_dtype(dtype), hardware.as_device(device)
    g = torch.Generator().manual_seed(checks.integer(seed, "seed", 0))
    a = torch.randn(size, size, generator=g).to(device=dev, dtype=dt)
    b = torch.randn(size, size, generator=g).to(device=dev, dtype=dt)
    return a, b


def time_matmul(size: int, dtype: str | torch.dtype, device: torch.device | str | None = None,
                repeats: int | None = None, seed: int = 0, min_run_time: float = MIN_RUN_TIME_S) -> MatmulTiming:
    """Time ``a @ b`` for two random ``size x size`` matrices in ``dtype`` with ``torch.utils.benchmark``.

    The call the notebook shows, on all of torch's CPU threads (``Timer`` would use one by default)::

        Timer(stmt="a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
            .blocked_autorange(min_run_time=min_run_time)

    ``blocked_autorange`` warms up, picks a block of runs long enough to hide the clock's overhead, and repeats
    blocks for at least ``min_run_time`` seconds; ``ms`` is the median time per multiply. It synchronizes a GPU
    before reading the clock, so the asynchronous CUDA launches are really finished. With ``repeats`` it runs
    ``Timer.timeit(repeats)`` instead (after at least 2 untimed runs) and ``ms`` is their mean (scripts/gpu_check
    uses this). On a CPU, float16 is refused above :data:`CPU_FLOAT16_MAX_SIZE` (:func:`timing_refusal`), and
    a small multiply first predicts the time: if the runs would take more than :data:`CPU_TIMING_BUDGET_S`,
    smaller matrices are timed instead (see :func:`cpu_size_within_budget`; ``size`` in the result says which).
    """
    from torch.utils import benchmark  # imported on use: it is not needed elsewhere

    size, dt, dev, refusal = _timing_case(size, dtype, device)
    if refusal:
        raise ValueError(f"dtype: {refusal}")
    if repeats is not None:
        repeats = checks.integer(repeats, "repeats", 1, 1000)
    min_run_time = checks.positive(min_run_time, "min_run_time", 10)
    if dev.type == "cpu":
        size = cpu_size_within_budget(size, _cpu_seconds(dt), 3 if repeats is None else repeats + 2)
    a, b = random_matrices(size, dt, dev, seed)
    timer = benchmark.Timer(stmt=MATMUL_STMT, globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    if repeats is None:
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
        seconds = measurement.median
    else:
        measurement = timer.timeit(repeats)
        seconds = measurement.mean
    return MatmulTiming(size, dtype_name(dt), str(dev), seconds * 1e3, matmul_flops(size) / seconds / 1e12,
                        measurement)



def fraction_of_peak(timing: MatmulTiming, sheet: hardware.Datasheet | None) -> float | None:
    """Achieved / datasheet throughput for ``timing``'s dtype, or None (no datasheet, or no fast path for it).

    float32 is compared with the datasheet's plain float32 figure (PyTorch does not use TF32 for matmuls
    unless you allow it); float16 with the 16-bit tensor-core figure; bfloat16 too, except on a GPU without
    native bfloat16 (a T4), whose datasheet has no bfloat16 figure.
    """
    if sheet is None or not timing.device.startswith("cuda"):
        return None
    if timing.dtype == "float32":
        return timing.tflops / sheet.fp32_tflops
    if timing.dtype == "bfloat16" and not hardware.bf16_native(timing.device):
        return None
    return timing.tflops / sheet.tensor16_tflops


def timing_report(timings: Sequence[MatmulTiming], sheet: hardware.Datasheet | None = None) -> str:
    """Lines of ms per multiply and TFLOP/s for each timing, the speed-up over the first, and % of peak."""
    if not timings:
        raise ValueError("timings must contain at least one MatmulTiming")
    base = timings[0]
    lines = []
    for t in timings:
        gflops = f"{t.gflops:,.0f}" if t.gflops >= 10 else f"{t.gflops:.2g}"  # small CPU figures keep 2 digits
        line = (f"{t.dtype:>8} on {t.device}: {t.ms:9.2f} ms per {t.size}x{t.size} matmul, "
                f"{t.tflops:8.3f} TFLOP/s ({gflops} GFLOP/s)")
        if t is not base and t.size == base.size:
            speedup = base.ms / t.ms
            line += (f", {speedup:.1f}x faster than {base.dtype}" if speedup >= 1
                     else f", {1 / speedup:.1f}x slower than {base.dtype}")
        elif t is not base:  # shrunk to fit the CPU time budget: compare throughputs, not times
            line += f", {t.tflops / base.tflops:.2f}x the throughput of {base.dtype} (a smaller matrix: too slow here)"
        peak = fraction_of_peak(t, sheet)
        if peak is not None:
            line += f", {peak:.0%} of the {sheet.name} datasheet peak"
        lines.append(line)
    return "\n".join(lines)


def _timing_case(size: int, dtype: str | torch.dtype,
                 device: torch.device | str | None) -> tuple[int, torch.dtype, torch.device, str | None]:
    """The checked size, dtype and device of a matmul timing, and why it is not timed here (None: it is)."""
    size = checks.integer(size, "size", 1, MAX_MATMUL_SIZE)
    dt, dev = resolve_dtype(dtype), hardware.as_device(device)
    return size, dt, dev, timing_refusal(dt, dev, size)


def matmul_report(size: int, dtype: str | torch.dtype, device: torch.device | str | None = None) -> str:
    """Text for the matmul widget: one timing of ``dtype`` next to float32, or why it is not timed here."""
    size, dt, dev, refusal = _timing_case(size, dtype, device)
    if refusal:
        return refusal
    if dev.type == "cpu" and size > MAX_CPU_WIDGET_SIZE:
        raise ValueError(f"size must be at most {MAX_CPU_WIDGET_SIZE} on a CPU, got {size}")
    timings = [time_matmul(size, torch.float32, dev)]
    if dt != torch.float32:
        timings.append(time_matmul(size, dt, dev))
    return timing_report(timings, hardware.current_datasheet())


# --------------------------------------------------------------------------------------------
# The mixed-precision training loop (on the course's digits task: course_utils.digits)
# --------------------------------------------------------------------------------------------
#: Notebook 02's classifier: :func:`course_utils.digits.make_mlp` with two hidden layers of 128 ReLU units
#: (64 pixels -> 128 -> 128 -> 10 digit scores).
CLASSIFIER = {"hidden": 128, "depth": 2}


class StepLog(NamedTuple):
    """One training step: the (unscaled) loss, the loss scale after the step, and whether it was skipped."""

    step: int
    loss: float
    scale: float
    skipped: bool


@dataclass
class TrainResult:
    """What :func:`train_mixed_precision` returns."""

    dtype: str                 # the autocast dtype ('float32' means autocast off)
    loss_scaling: bool
    history: list[StepLog] = field(default_factory=list)
    test_accuracy: float = 0.0

    @property
    def skipped_steps(self) -> list[int]:
        """The steps whose update the scaler skipped (its gradients overflowed)."""
        return [log.step for log in self.history if log.skipped]

    def mean_loss(self, last: int = 50) -> float:
        """Mean training loss over the ``last`` steps (all of them when there are fewer)."""
        last = checks.integer(last, "last", 1)
        if not self.history:
            raise ValueError("history is empty: train first")
        tail = [log.loss for log in self.history[-last:]]
        return sum(tail) / len(tail)

    def log_lines(self, every: int = 25, losses: bool = True) -> str:
        """'step N: loss L, loss scale S' every ``every`` steps, plus every skipped step.

        ``losses=False`` leaves the losses out: the loss scale and the skipped steps are the same on every
        processor, while the last digits of a 16-bit loss are not.
        """
        every = checks.integer(every, "every", 1)
        losses = checks.flag(losses, "losses")
        lines = []
        for log in self.history:
            if log.step % every == 0 or log.step == 1 or log.skipped:
                loss = f"loss {log.loss:.2f}, " if losses else ""
                line = f"step {log.step:3d}: {loss}loss scale {log.scale:,.0f}"
                if log.skipped:
                    line += "   <- gradients overflowed: step skipped, scale halved"
                lines.append(line)
        return "\n".join(lines)


class MixedPrecisionPlan(NamedTuple):
    """What the training loop will do on a device: where, in which dtype, with autocast and loss scaling or not."""

    device: torch.device
    dtype: torch.dtype
    autocast: bool        # flag 1: 16-bit maths (False for float32)
    loss_scaling: bool    # flag 2: GradScaler enabled (float16 only)


def mixed_precision_plan(dtype: str | torch.dtype | None = None,
                         device: torch.device | str | None = None) -> MixedPrecisionPlan:
    """The decisions :func:`train_mixed_precision` takes before it allocates anything.

    ``device`` None means :func:`course_utils.hardware.pick_device`; ``dtype`` None means the lesson's dtype
    there (:func:`course_utils.hardware.autocast_dtype`: float16 on a T4, bfloat16 on Ampere+ and on CPUs).
    Loss scaling follows :func:`course_utils.hardware.needs_loss_scaling`.
    """
    dev = hardware.as_device(device)
    dt = lesson_dtype(dev) if dtype is None else resolve_dtype(dtype)
    return MixedPrecisionPlan(dev, dt, dt != torch.float32, hardware.needs_loss_scaling(dt))


def train_mixed_precision(dtype: str | torch.dtype | None = None, *, device: torch.device | str | None = None,
                          steps: int = 200, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
                          spike_at: Sequence[int] = (), spike_factor: float = 1e4,
                          task: digits.DigitsData | None = None) -> TrainResult:
    """Train :data:`CLASSIFIER` on the digits with ONE loop whose tricks are flags.

    ``dtype`` float32 switches autocast off; bfloat16/float16 switch it on (default: the lesson's dtype for
    ``device``). The ``GradScaler`` is enabled for float16 only. ``spike_at`` lists steps whose loss is
    multiplied by ``spike_factor`` before the backward pass, on purpose: with float16 and a scale of 65,536
    the gradients overflow, and the scaler skips that step and halves the scale. ``task`` defaults to
    :func:`course_utils.digits.load_digits_data` (the course's split); ``seed`` sets the initial weights and
    the mini-batches.
    """
    plan = mixed_precision_plan(dtype, device)
    dev, dt = plan.device, plan.dtype
    lr = checks.positive(lr, "lr", 1)
    spike_factor = checks.positive(spike_factor, "spike_factor")
    steps = checks.integer(steps, "steps", 1, digits.MAX_STEPS)
    for spike in spike_at:
        checks.integer(spike, "spike_at (a step)", 1, steps)
    task = digits.load_digits_data() if task is None else task
    if not isinstance(task, digits.DigitsData):
        raise TypeError(f"task must be a DigitsData (from course_utils.digits) or None, got {type(task).__name__}")
    model = digits.make_mlp(seed=seed, **CLASSIFIER).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    use_autocast = plan.autocast                                          # flag 1: 16-bit maths or not
    scaler = torch.amp.GradScaler(dev.type, enabled=plan.loss_scaling)    # flag 2: loss scaling, float16 only
    result = TrainResult(dtype_name(dt), scaler.is_enabled())
    for step, (x, y) in enumerate(task.batches(steps, batch_size, seed), start=1):
        x, y = x.to(dev), y.to(dev)
        with torch.autocast(device_type=dev.type, dtype=dt, enabled=use_autocast):
            loss = F.cross_entropy(model(x), y)                          # matmuls in 16-bit, loss in float32
        factor = spike_factor if step in spike_at else 1.0
        scale_before = scaler.get_scale()
        scaler.scale(loss * factor).backward()                           # backward outside autocast
        scaler.step(optimizer)                                           # unscale; skip if inf/nan; update fp32
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scale_after = scaler.get_scale()
        result.history.append(StepLog(step, loss.item(), scale_after, scale_after < scale_before))
    result.test_accuracy = digits.evaluate(model, task).accuracy
    return result


@dataclass(frozen=True)
class RunComparison:
    """A 16-bit training run checked against a float32 run, within stated tolerances.

    16-bit kernels sum in a different order on different processors (and thread counts), so the last digits
    of a 16-bit loss or accuracy change from machine to machine; these checks do not.
    """

    dtype: str
    reference_dtype: str
    loss_difference: float      # |mean loss over the last steps, 16-bit - float32|
    accuracy_difference: float  # |test accuracy, 16-bit - float32|, as a fraction (0.01 = 1 point)
    loss_tolerance: float
    accuracy_tolerance: float
    last: int

    @property
    def same_loss(self) -> bool:
        """The mean loss over the last steps is within ``loss_tolerance`` of float32's."""
        return self.loss_difference <= self.loss_tolerance

    @property
    def same_accuracy(self) -> bool:
        """The test accuracy is within ``accuracy_tolerance`` of float32's."""
        return self.accuracy_difference <= self.accuracy_tolerance

    def __str__(self) -> str:
        return (f"{self.dtype} against {self.reference_dtype}: mean loss over the last {self.last} steps within "
                f"{self.loss_tolerance:g}: {self.same_loss}; test accuracy within "
                f"{100 * self.accuracy_tolerance:g} points: {self.same_accuracy}")


def compare_runs(reference: TrainResult, other: TrainResult, last: int = 50, loss_tolerance: float = 0.05,
                 accuracy_tolerance: float = 0.02) -> RunComparison:
    """Compare ``other`` (a 16-bit run) with ``reference`` (float32): loss over the ``last`` steps, test accuracy.

    Tolerances: ``loss_tolerance`` in loss units (0 < t <= 1), ``accuracy_tolerance`` as a fraction
    (0 < t <= 1; 0.02 is 2 points). The defaults are far above the machine-to-machine differences of the
    lesson's digit classifier and far below what a broken run (one that stopped learning) would give.
    """
    loss_tolerance = checks.positive(loss_tolerance, "loss_tolerance", 1)
    accuracy_tolerance = checks.positive(accuracy_tolerance, "accuracy_tolerance", 1)
    for name, run in (("reference", reference), ("other", other)):
        if not isinstance(run, TrainResult):
            raise TypeError(f"{name} must be a TrainResult, got {type(run).__name__}")
    return RunComparison(other.dtype, reference.dtype, abs(other.mean_loss(last) - reference.mean_loss(last)),
                         abs(other.test_accuracy - reference.test_accuracy), loss_tolerance,
                         accuracy_tolerance, last)


# --------------------------------------------------------------------------------------------
# One setting in the libraries
# --------------------------------------------------------------------------------------------
def training_arguments_kwargs(device: torch.device | str | None = None, *, cpu_bf16: bool = True) -> dict[str, bool]:
    """Mixed-precision keyword arguments for ``transformers.TrainingArguments`` on ``device``: the one 16-bit rule.

    Ampere+ GPU: ``bf16=True``. Older GPU (T4, V100): ``fp16=True`` (the Trainer adds loss scaling).
    CPU: ``bf16=True, use_cpu=True``: transformers refuses ``bf16=True`` without a bf16 GPU unless told
    that the CPU is meant, and ``fp16=True`` would be accepted but runs float16 maths, very slow on CPUs.
    ``cpu_bf16=False`` (a CPU without bfloat16 instructions, see :func:`course_utils.tricks.cpu_bf16_fast`)
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
    bf16 = dt == torch.bfloat16
    return {
        "Hugging Face Trainer": f'TrainingArguments(output_dir="out", {"bf16" if bf16 else "fp16"}=True)',
        "Hugging Face Accelerate": f'Accelerator(mixed_precision="{"bf16" if bf16 else "fp16"}")',
        "PyTorch Lightning": f'Trainer(precision="{"bf16-mixed" if bf16 else "16-mixed"}")',
    }
