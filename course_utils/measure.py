"""Measure what a training step really costs: peak memory and time, on any device, saying what was measured.

Two tools live here.

* :func:`track_peak` / :func:`measure_peak` - the peak memory of *any piece of work*. On a CUDA GPU they
  read PyTorch's allocator counters (reset at the start of the work). On a CPU there is no allocator
  counter, so they read the process's resident-memory high-water mark (Linux ``VmHWM``), reset at the start
  of the work through ``/proc/self/clear_refs``; where that reset is impossible (macOS) the reading is the
  peak since the process started. The returned object's ``what`` always says which one you got.

* :func:`measure_training_step` - one (or a few) real training steps of a decoder language model built
  from its ``config.json`` with random, seeded weights: full fine-tuning, LoRA, LoRA on a 16-bit base, or
  QLoRA (4-bit NF4 base). Every 16-bit dtype comes from :mod:`course_utils.hardware` (bfloat16 on a CPU and on
  Ampere-or-newer GPUs, float16 with loss scaling on a T4, which has no native bfloat16). It counts the
  bytes of the weights, gradients and optimizer states exactly from the tensors, the activations autograd
  saves for backward (deduplicated by storage), and measures the step's peak memory and time. On CPU the
  step runs in a fresh child process (so the peak belongs to this step only), with
  ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system and resident memory tracks the
  live bytes; the child is killed after ``timeout_s``. With ``compile=True`` the step runs in such a bounded
  child on a GPU too: compiling has no upper bound on its time.

Why a warm-up step first: a real training run spends almost all its steps in the *steady state*, where the
optimizer states already exist while the next forward and backward run. The first step is special (the
optimizer allocates its states lazily, ``torch.compile`` compiles). So one unmeasured warm-up step runs
first, the peak counter is reset, and then ``steps`` steps are measured and timed. The warm-up step's
time is reported separately (``first_step_seconds``): for ``compile=True`` it contains the compilation.

Command line (used by :func:`measure_training_step` for its child process; handy for maintainers)::

    python -m course_utils.measure --method lora --batch 8 --seq 128
    python -m course_utils.measure --json '{"config": "smollm2-135m", "method": "full", "batch": 1}'
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

#: ``lora-bf16`` keeps its historical name but means "LoRA on a 16-bit base": bfloat16 where the device has it
#: natively (CPU, Ampere+), float16 on a T4 (see :func:`step_precision`).
METHODS = ("full", "lora", "lora-bf16", "qlora")
OPTIMIZERS = ("adamw", "adamw8bit")
#: Accepted spellings of the autocast dtype (None = no autocast). ``"auto"`` (or True) asks
#: :func:`course_utils.hardware.autocast_dtype` for the device's 16-bit dtype: use it unless a lesson compares
#: dtypes on purpose.
AUTOCAST_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                  "auto": "auto"}
#: Environment of the child process that runs a CPU step. The malloc setting makes glibc serve every
#: allocation above 64 KiB with its own mmap, returned on free, so RSS tracks the live bytes (see module doc).
CHILD_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}


# --------------------------------------------------------------------------------------------
# Peak memory of a piece of work
# --------------------------------------------------------------------------------------------
@dataclass
class WorkPeak:
    """The peak memory of one piece of work, and what the number is.

    ``bytes`` is the peak; ``start_bytes`` what was already in use when the work began (so
    ``bytes - start_bytes`` is what the work added at its worst moment); ``reserved_bytes`` is the CUDA
    caching allocator's reserved peak (None on CPU); ``what`` names the counter.
    """

    bytes: int = 0
    start_bytes: int = 0
    reserved_bytes: int | None = None
    what: str = ""
    device: str = "cpu"

    @property
    def gb(self) -> float:
        """The peak in GB (10^9 bytes)."""
        return self.bytes / 1e9

    @property
    def added_bytes(self) -> int:
        """What the work added on top of what was in use when it started."""
        return max(0, self.bytes - self.start_bytes)


def _proc_status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; elsewhere the peak so far, an upper bound)."""
    kib = _proc_status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    from course_utils.hardware import process_peak_rss_bytes  # noqa: PLC0415

    return process_peak_rss_bytes()


def reset_rss_high_water_mark() -> bool:
    """Reset this process's resident-memory high-water mark (Linux >= 4.0). True if it worked."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return _proc_status_kib("VmHWM") is not None


def rss_high_water_mark_bytes() -> int:
    """Peak resident memory since the last reset (Linux VmHWM), else since the process started."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    from course_utils.hardware import process_peak_rss_bytes  # noqa: PLC0415

    return process_peak_rss_bytes()


def _device_of(device: Any) -> "torch.device":  # noqa: F821 - torch imported lazily
    """``device`` as a torch.device (None: the GPU if there is one), via :func:`course_utils.hardware.as_device`."""
    from course_utils.hardware import as_device  # noqa: PLC0415

    return as_device(device)


@contextmanager
def track_peak(device: Any = None) -> Iterator[WorkPeak]:
    """Measure the peak memory of the work inside a ``with`` block, on any device.

    CUDA: ``reset_peak_memory_stats`` at the start, ``max_memory_allocated`` (and ``..._reserved``) at the
    end - the bytes PyTorch's tensors held at their peak (the CUDA context itself, a few hundred MB, is
    outside this counter). CPU: the process's resident-memory high-water mark, reset at the start of the
    block when the OS allows it (Linux), otherwise the peak since the process started. Resident memory
    includes the Python interpreter and its libraries, and the allocator's free-but-kept pages: run the
    work in a fresh process with ``MALLOC_MMAP_THRESHOLD_=65536`` (what :func:`measure_training_step`
    does) for a number that tracks live tensors.
    """
    import torch  # noqa: PLC0415

    dev = _device_of(device)
    reading = WorkPeak(device=str(dev))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but torch.cuda.is_available() is False on this machine")
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        reading.start_bytes = torch.cuda.memory_allocated(dev)
        yield reading
        torch.cuda.synchronize(dev)
        reading.bytes = torch.cuda.max_memory_allocated(dev)
        reading.reserved_bytes = torch.cuda.max_memory_reserved(dev)
        reading.what = ("CUDA: peak bytes allocated by PyTorch tensors during the work "
                        "(torch.cuda.max_memory_allocated after reset_peak_memory_stats; reserved shown apart)")
        return
    reset = reset_rss_high_water_mark()
    reading.start_bytes = current_rss_bytes()
    yield reading
    reading.bytes = rss_high_water_mark_bytes()
    reading.what = ("CPU: peak resident memory of this process during the work (VmHWM, reset at its start)"
                    if reset else
                    "CPU: peak resident memory of this process since it started (no reset possible here)")


def measure_peak(fn: Callable[[], Any], device: Any = None) -> tuple[Any, WorkPeak]:
    """Run ``fn()`` and return ``(its result, the peak memory of the call)``; see :func:`track_peak`."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with track_peak(device) as peak:
        result = fn()
    return result, peak


# --------------------------------------------------------------------------------------------
# A measured training step
# --------------------------------------------------------------------------------------------
@dataclass
class StepMeasurement:
    """What one measured training step cost. Bytes are exact tensor counts unless said otherwise.

    ``peak_bytes`` is the measured peak (see ``what``); ``baseline_bytes`` the memory in use before the model
    existed (CPU: the child process's resident memory after importing torch, transformers and the rest;
    CUDA: PyTorch's allocated bytes then, normally 0). ``weights_bytes``, ``grads_bytes`` and
    ``optimizer_bytes`` are summed from the tensors (tied weights counted once, 4-bit weights with their
    quantization constants). ``saved_activations_bytes`` is what autograd kept for backward during the
    forward pass, deduplicated by storage, parameters excluded (with checkpointing: the inputs the
    checkpointed layers keep, plus what is saved outside them).
    """

    peak_bytes: int
    baseline_bytes: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    saved_activations_bytes: int
    step_seconds: float
    device: str
    what: str
    # the case that was measured
    config_name: str = ""
    method: str = "lora"
    batch: int = 8
    seq: int = 128
    lora_rank: int = 8
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    checkpointing: bool = False
    optimizer: str = "adamw"
    autocast: str | None = None
    compile: bool = False
    steps: int = 1
    accumulation: int = 1
    # extra facts
    total_params: int = 0
    trained_params: int = 0
    first_step_seconds: float = 0.0
    compile_seconds: float | None = None
    reserved_bytes: int | None = None
    loss: float = float("nan")
    torch_threads: int = 0
    wall_seconds: float = 0.0
    start_bytes: int = 0  # in use when the measured step began: baseline + weights + optimizer + runtime
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_gb(self) -> float:
        """The measured peak in GB (10^9 bytes)."""
        return self.peak_bytes / 1e9

    @property
    def runtime_bytes(self) -> int:
        """What was in use at the start of the measured step besides baseline, weights and optimizer states:
        the framework's memory after a first step (kernel code pages, thread pools, allocator caches)."""
        return max(0, self.start_bytes - self.baseline_bytes - self.weights_bytes - self.optimizer_bytes)

    @property
    def above_baseline_bytes(self) -> int:
        """The peak minus the baseline: what the model and the step added."""
        return max(0, self.peak_bytes - self.baseline_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field."""
        out = asdict(self)
        out["targets"] = list(self.targets)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepMeasurement":
        """Inverse of :meth:`to_dict` (unknown keys go to ``extra``)."""
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = dict(kwargs.pop("extra", {}) or {})
        extra.update({k: v for k, v in data.items() if k not in known})
        if "targets" in kwargs:
            kwargs["targets"] = tuple(kwargs["targets"])
        return cls(**kwargs, extra=extra)


def load_config(config: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A model config as a plain dict (``_source`` and dtype keys dropped) and a short name for it.

    ``config`` is a preset name of a file in ``data/configs/`` (``"smollm2-135m"``), a path to a
    ``config.json``, or a dict. Reading is :func:`course_utils.configs.read_config`.
    """
    from course_utils.configs import read_config  # noqa: PLC0415

    if isinstance(config, Mapping):
        name = str(config.get("_name_or_path") or config.get("model_type") or "custom")
    elif isinstance(config, (str, os.PathLike)):
        path = Path(config)
        name = path.stem if path.suffix == ".json" else path.name
    else:
        raise TypeError(f"config must be a preset name, a path or a dict, got {type(config).__name__}")
    cfg = read_config(config)
    if "model_type" not in cfg:
        raise ValueError("config must describe a model: a JSON object with a 'model_type' key")
    for key in ("torch_dtype", "dtype"):
        cfg.pop(key, None)
    return cfg, name


def _check_positive_int(name: str, value: Any, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be between 1 and {high}, got {value}")
    return value


def _normalise_autocast(autocast: Any) -> str | None:
    if autocast is None or autocast is False:
        return None
    if autocast is True:
        return "auto"
    name = getattr(autocast, "__repr__", lambda: "")() if not isinstance(autocast, str) else autocast
    name = str(name).replace("torch.", "")
    if name not in AUTOCAST_NAMES:
        raise ValueError(f"autocast must be None, 'auto', 'bf16' or 'fp16' (or the torch dtype), got {autocast!r}")
    return AUTOCAST_NAMES[name]


def _spec(config: Any, method: str, batch: int, seq: int, lora_rank: int, targets: Sequence[str],
          checkpointing: bool, optimizer: str, autocast: Any, compile: bool, steps: int,
          accumulation: int, seed: int) -> dict[str, Any]:
    """Check every argument and return the plain-JSON description of the step."""
    cfg, name = load_config(config)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    _check_positive_int("batch", batch, 4096)
    _check_positive_int("seq", seq, 1_000_000)
    _check_positive_int("lora_rank", lora_rank, 4096)
    _check_positive_int("steps", steps, 100)
    _check_positive_int("accumulation", accumulation, 1024)
    if isinstance(targets, str):
        targets = [t for t in targets.split(",") if t]
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError("targets must be a non-empty list of module names such as ('q_proj', 'v_proj')")
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and seq > limit:
        raise ValueError(f"seq must be at most the model's max_position_embeddings ({limit}), got {seq}")
    return {"config": cfg, "config_name": name, "method": method, "batch": batch, "seq": seq,
            "lora_rank": lora_rank, "targets": list(targets), "checkpointing": bool(checkpointing),
            "optimizer": optimizer, "autocast": _normalise_autocast(autocast), "compile": bool(compile),
            "steps": steps, "accumulation": accumulation, "seed": int(seed)}


def measure_training_step(config: str | os.PathLike | Mapping[str, Any] = "smollm2-135m", *,
                          method: str = "lora", batch: int = 8, seq: int = 128, lora_rank: int = 8,
                          targets: Sequence[str] = ("q_proj", "v_proj"), checkpointing: bool = False,
                          optimizer: str = "adamw", autocast: Any = None, compile: bool = False,
                          steps: int = 1, timeout_s: float = 300.0, accumulation: int = 1, seed: int = 0,
                          device: Any = None, subprocess_: bool | None = None) -> StepMeasurement:
    """Build the model, run a warm-up step, then measure ``steps`` training steps; see the module doc.

    ``method``: ``"full"`` (every weight trained, float32), ``"lora"`` (float32 base frozen, LoRA adapters
    of rank ``lora_rank`` on ``targets``), ``"lora-bf16"`` (the frozen base in the device's 16-bit dtype:
    bfloat16, or float16 on a T4), ``"qlora"`` (the frozen base in 4-bit NF4 via bitsandbytes, computing in
    that 16-bit dtype). ``optimizer``: ``"adamw"`` (torch, two float32 states = 8 bytes per trained
    parameter) or ``"adamw8bit"`` (bitsandbytes, two 8-bit states + block scales, about 2 bytes).
    ``autocast``: None, ``"auto"`` (the device's 16-bit dtype, see :func:`step_precision`), or ``"bf16"`` /
    ``"fp16"`` on purpose (fp16 only on CUDA). ``accumulation``: micro-batches of ``batch`` examples per
    optimizer step. ``device``: None means :func:`course_utils.hardware.pick_device`. On CPU, with
    ``compile=True`` on any device, or with ``subprocess_=True``, the work runs in a fresh child process
    bounded by ``timeout_s`` seconds (TimeoutError when it runs longer); see :func:`runs_in_child`.
    """
    spec = _spec(config, method, batch, seq, lora_rank, targets, checkpointing, optimizer, autocast,
                 compile, steps, accumulation, seed)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 1 <= timeout_s <= 7200:
        raise ValueError(f"timeout_s must be a number of seconds between 1 and 7200, got {timeout_s!r}")
    dev = _device_of(device)
    if dev.type == "cuda":
        import torch  # noqa: PLC0415

        if not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but torch.cuda.is_available() is False on this machine")
    elif spec["autocast"] == "float16":
        raise ValueError("autocast='fp16' is for CUDA GPUs: float16 matmuls on a CPU are 100-1000x slower; "
                         "use 'bf16' or 'auto' on a CPU")
    spec["device"] = str(dev)
    spec["autocast"] = step_precision(spec["method"], spec["autocast"], dev).autocast
    if not runs_in_child(dev, spec["compile"], subprocess_):
        return StepMeasurement.from_dict(run_step(spec))
    return StepMeasurement.from_dict(_run_in_child(spec, float(timeout_s)))


class Precision(NamedTuple):
    """The dtypes of a measured step, decided for its device by :mod:`course_utils.hardware`."""

    base: str  # the frozen/trained weights' dtype: "float32", or the 16-bit dtype of lora-bf16 / qlora
    autocast: str | None  # the autocast dtype, None without autocast
    loss_scaling: bool  # True when float16 does the arithmetic (GradScaler on)


def step_precision(method: str, autocast: str | None, device: Any = None) -> Precision:
    """Which dtypes a step of ``method`` uses on ``device``, and whether it needs loss scaling.

    The 16-bit dtype is :func:`course_utils.hardware.autocast_dtype`: bfloat16 on a CPU or an Ampere-or-newer
    GPU, float16 on a T4 (it emulates bfloat16 slowly; ``torch.cuda.is_bf16_supported()`` says True there).
    ``lora-bf16`` and ``qlora`` store (or compute) their frozen base in it. ``autocast``: None, ``"auto"``
    (that dtype) or an explicit ``"bfloat16"`` / ``"float16"`` for a lesson that compares dtypes on purpose.
    Loss scaling (:func:`course_utils.hardware.needs_loss_scaling`) is on when float16 does the arithmetic.
    Decides only: nothing is allocated.
    """
    from course_utils.hardware import autocast_dtype, needs_loss_scaling  # noqa: PLC0415

    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    half = autocast_dtype(_device_of(device))
    half_name = str(half).replace("torch.", "")
    base = half_name if method in ("lora-bf16", "qlora") else "float32"
    if autocast not in (None, "auto", "bfloat16", "float16"):
        raise ValueError(f"autocast must be None, 'auto', 'bfloat16' or 'float16', got {autocast!r}")
    amp = half_name if autocast == "auto" else autocast
    import torch  # noqa: PLC0415

    compute = amp or base
    return Precision(base, amp, needs_loss_scaling(getattr(torch, compute)))


def runs_in_child(device: Any, compile: bool, subprocess_: bool | None = None) -> bool:
    """Whether a measured step runs in a bounded child process (True) or in this process.

    CPU: always (the process's peak must belong to the step). CUDA: when ``compile`` is on - compiling has no
    upper bound on its time, and only a child process can be stopped with everything it started - or when
    ``subprocess_`` asks for it. ``subprocess_=False`` with ``compile=True`` raises ValueError.
    """
    dev = _device_of(device)
    if compile and subprocess_ is False:
        raise ValueError("subprocess_ must be None or True when compile=True: torch.compile runs in a child "
                         "process so that timeout_s can stop it")
    if subprocess_ is not None:
        return bool(subprocess_)
    return dev.type != "cuda" or bool(compile)


def _run_in_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(CHILD_ENV)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "course_utils.measure", "--json", json.dumps(spec)]
    start = time.perf_counter()
    try:
        done = _run_bounded(cmd, env, timeout_s)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(f"the measured step did not finish within timeout_s={timeout_s:g} s; "
                           "the child process and its helpers (e.g. compilers) were stopped") from err
    wall = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the measuring process failed (exit status {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    result["wall_seconds"] = wall
    return result


def _run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (torch.compile starts compilers)."""
    if os.name != "posix":
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    import signal  # noqa: PLC0415

    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --------------------------------------------------------------------------------------------
# The step itself (runs in the child on CPU, in-process on CUDA)
# --------------------------------------------------------------------------------------------
def _storage_key(t: Any) -> tuple[int, int] | None:
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except Exception:  # noqa: BLE001 - tensor subclasses / fake tensors without a real storage
        return None


def _unique_nbytes(tensors: Iterator[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        key = _storage_key(t)
        if key is not None and key[0] != 0:
            seen[key[0]] = key[1]
    return sum(seen.values())


def _tensors_of_params(model: Any) -> Iterator[Any]:
    for p in model.parameters():
        yield p
        qs = getattr(p, "quant_state", None)  # bitsandbytes 4-bit: block scales live beside the data
        if qs is not None:
            for attr in ("absmax", "code"):
                val = getattr(qs, attr, None)
                if val is not None and hasattr(val, "untyped_storage"):
                    yield val
            nested = getattr(qs, "state2", None)
            if nested is not None:
                for attr in ("absmax", "code"):
                    val = getattr(nested, attr, None)
                    if val is not None and hasattr(val, "untyped_storage"):
                        yield val
    yield from model.buffers()


def _optimizer_tensors(opt: Any) -> Iterator[Any]:
    import torch  # noqa: PLC0415

    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


_QUIET_LOGGERS = ("bitsandbytes", "peft", "transformers", "accelerate", "torch._inductor", "torch._dynamo")


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence warnings, bitsandbytes, transformers and peft inside a ``with`` block; restore them after.

    Inside: every Python warning is ignored, the libraries' loggers show errors only, transformers' progress
    bars are off. On exit the warning filters, the logger levels, transformers' verbosity and its progress-bar
    switch are what they were, so a student's kernel is left as it was found.
    """
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        from course_utils.hardware import import_bitsandbytes  # noqa: PLC0415

        import_bitsandbytes()
        import transformers  # noqa: PLC0415

        tf_logging = transformers.utils.logging
        verbosity, bars = tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled()
        tf_logging.set_verbosity_error()
        tf_logging.disable_progress_bar()
        try:
            yield
        finally:
            tf_logging.set_verbosity(verbosity)
            if bars:
                tf_logging.enable_progress_bar()
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def build_model(spec: Mapping[str, Any], device: Any = "cpu") -> Any:
    """The model a spec describes, random seeded weights, on ``device``, ready to train.

    The 16-bit base of ``lora-bf16`` and ``qlora`` (and QLoRA's compute dtype) is :func:`step_precision`'s:
    bfloat16, or float16 on a T4.
    """
    import torch  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    cfg = dict(spec["config"])
    model_type = cfg.pop("model_type")
    cfg["use_cache"] = False
    hf_config = AutoConfig.for_model(model_type, **cfg)
    method = spec["method"]
    torch.manual_seed(spec.get("seed", 0))
    base_dtype = getattr(torch, step_precision(method, None, device).base)
    # dtype must be explicit: from_config otherwise follows the config's "torch_dtype" (bfloat16 for SmolLM2)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=base_dtype)
    if method == "qlora":
        import tempfile  # noqa: PLC0415

        from transformers import BitsAndBytesConfig  # noqa: PLC0415

        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                       bnb_4bit_compute_dtype=base_dtype)
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, dtype=base_dtype,
                                                         device_map={"": str(device)})
    else:
        model = model.to(device)
    if spec.get("checkpointing"):
        model.activation_checkpointing_enable() if hasattr(model, "activation_checkpointing_enable") \
            else model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method != "full":
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415

        lora = LoraConfig(r=spec["lora_rank"], lora_alpha=2 * spec["lora_rank"], lora_dropout=0.0,
                          target_modules=list(spec["targets"]), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        if spec.get("checkpointing"):
            model.enable_input_require_grads()
    model.train()
    return model


def make_optimizer(spec: Mapping[str, Any], params: list[Any]) -> Any:
    """AdamW from torch, or bitsandbytes' 8-bit AdamW, over ``params``."""
    import torch  # noqa: PLC0415

    if spec["optimizer"] == "adamw8bit":
        from course_utils.hardware import import_bitsandbytes  # noqa: PLC0415

        bnb = import_bitsandbytes()
        if bnb is None:
            raise RuntimeError("optimizer='adamw8bit' needs bitsandbytes, which is not installed here")
        device = params[0].device if params else "cpu"
        if not adamw8bit_available(device):
            raise RuntimeError(f"optimizer='adamw8bit': bitsandbytes {getattr(bnb, '__version__', '?')} has no 8-bit "
                               f"AdamW for the {torch.device(device).type.upper()} (on a CPU it needs 0.49 or newer)")
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    return torch.optim.AdamW(params, lr=1e-4)


_ADAMW8BIT_WORKS: dict[str, bool] = {}


def adamw8bit_available(device: Any = "cpu") -> bool:
    """Whether bitsandbytes' 8-bit AdamW can take a step on ``device`` here (tried once per device type, on a
    4096-number tensor, the smallest that gets 8-bit states). bitsandbytes before 0.49 has no CPU version."""
    import torch  # noqa: PLC0415

    from course_utils.hardware import import_bitsandbytes  # noqa: PLC0415

    kind = _device_of(device).type
    if kind not in _ADAMW8BIT_WORKS:
        bnb = import_bitsandbytes()
        try:
            param = torch.nn.Parameter(torch.ones(4096, device=kind))
            param.grad = torch.ones_like(param)
            opt = bnb.optim.AdamW8bit([param], lr=1e-3)
            opt.step()
            works = bool(torch.isfinite(param).all()) and bool((param < 1).all())
        except Exception:  # noqa: BLE001 - no backend for this device in this bitsandbytes
            works = False
        _ADAMW8BIT_WORKS[kind] = works
    return _ADAMW8BIT_WORKS[kind]


def is_checkpointed_layer(module: Any) -> bool:
    """True for a decoder layer whose activations are recomputed in backward (checkpointing switched on).

    transformers >= 4.52 marks such layers with ``transformers.modeling_layers.GradientCheckpointingLayer``;
    where that module is missing, a layer class named ``...DecoderLayer`` with ``gradient_checkpointing`` set
    is recognised instead.
    """
    if not getattr(module, "gradient_checkpointing", False) or isinstance(module, type):
        return False
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: PLC0415
    except ImportError:
        return type(module).__name__.endswith("DecoderLayer")
    return isinstance(module, GradientCheckpointingLayer)


@contextmanager
def _count_saved_tensors(model: Any, exclude: set[int], checkpointing: bool) -> Iterator[dict[int, int]]:
    """Record the storages autograd saves for backward (and, with checkpointing, each layer's kept input)."""
    import torch  # noqa: PLC0415

    seen: dict[int, int] = {}

    def note(t: Any) -> None:
        key = _storage_key(t)
        if key is not None and key[0] != 0 and key[0] not in exclude:
            seen[key[0]] = key[1]

    def pack(t: Any) -> Any:
        note(t)
        return t

    handles = []
    if checkpointing:
        def pre_hook(_module: Any, args: tuple, kwargs: dict) -> None:
            if torch.is_grad_enabled():
                hidden = args[0] if args else kwargs.get("hidden_states")
                if isinstance(hidden, torch.Tensor):
                    note(hidden)

        for module in model.modules():
            if is_checkpointed_layer(module):
                handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield seen
    finally:
        for h in handles:
            h.remove()


def run_step(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Build the model, warm up one step, measure ``steps`` steps; return a :class:`StepMeasurement` dict."""
    import_start_rss = current_rss_bytes()
    with quiet_libraries():
        return _run_step(spec, import_start_rss)


def _run_step(spec: Mapping[str, Any], import_start_rss: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from course_utils.hardware import autocast_dtype as hardware_autocast_dtype  # noqa: PLC0415

    import peft  # noqa: F401, PLC0415 - always imported before the baseline is read, so every method has the same
    dev = _device_of(spec.get("device"))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        baseline = torch.cuda.memory_allocated(dev)
    else:
        baseline = current_rss_bytes()

    model = build_model(spec, dev)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(spec, trained)
    precision = step_precision(spec["method"], spec.get("autocast"), dev)
    autocast_dtype = getattr(torch, precision.autocast) if precision.autocast else None
    half_dtype = hardware_autocast_dtype(dev)  # autocast's dtype argument when it is off (never used then)
    scaler = torch.amp.GradScaler(dev.type) if precision.loss_scaling else None  # float16 needs loss scaling
    step_fn = model
    if spec.get("compile"):
        step_fn = torch.compile(model)
    vocab = int(spec["config"]["vocab_size"])
    gen = torch.Generator().manual_seed(spec.get("seed", 0) + 1)
    micro = [torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=gen).to(dev)
             for _ in range(spec["accumulation"])]
    param_keys = {k[0] for k in (_storage_key(t) for t in _tensors_of_params(model)) if k}

    counts: dict[str, int] = {}

    def one_step(count: bool) -> float:
        loss_value = 0.0
        for i, ids in enumerate(micro):
            ctx = _count_saved_tensors(model, param_keys, spec.get("checkpointing", False)) if count and i == 0 \
                else contextlib.nullcontext({})
            with ctx as seen:
                with torch.autocast(dev.type, dtype=autocast_dtype or half_dtype, enabled=autocast_dtype is not None):
                    loss = step_fn(input_ids=ids, labels=ids).loss / spec["accumulation"]
                (scaler.scale(loss) if scaler else loss).backward()
            if count and i == 0:
                counts["saved"] = sum(seen.values())
            loss_value += float(loss.detach())
        if count:
            counts["grads"] = _unique_nbytes(p.grad for p in trained if p.grad is not None)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_value

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t0 = time.perf_counter()
    one_step(count=False)  # warm-up: optimizer states, lazy allocations, compilation
    sync()
    first = time.perf_counter() - t0
    losses = []
    with track_peak(dev) as peak:
        t0 = time.perf_counter()
        for i in range(spec["steps"]):
            losses.append(one_step(count=i == spec["steps"] - 1))
        sync()
        per_step = (time.perf_counter() - t0) / spec["steps"]
    total_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if any(type(p).__name__ == "Params4bit" for p in model.parameters()):  # packed: 2 numbers per byte
        total_params = sum(p.numel() * (2 if type(p).__name__ == "Params4bit" else 1)
                           for p in {id(p): p for p in model.parameters()}.values())
    if dev.type == "cuda":
        what = peak.what
    else:
        what = (peak.what.replace("this process", "a fresh child process")
                + "; includes the child's baseline (Python, torch, transformers); "
                + "MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave the resident set")
    result = {
        "peak_bytes": int(peak.bytes), "baseline_bytes": int(baseline),
        "weights_bytes": _unique_nbytes(_tensors_of_params(model)),
        "grads_bytes": counts.get("grads", 0),
        "optimizer_bytes": _unique_nbytes(_optimizer_tensors(optimizer)),
        "saved_activations_bytes": counts.get("saved", 0),
        "step_seconds": per_step, "device": str(dev), "what": what,
        "config_name": spec.get("config_name", ""), "method": spec["method"], "batch": spec["batch"],
        "seq": spec["seq"], "lora_rank": spec["lora_rank"], "targets": list(spec["targets"]),
        "checkpointing": bool(spec.get("checkpointing")), "optimizer": spec["optimizer"],
        "autocast": precision.autocast, "compile": bool(spec.get("compile")), "steps": spec["steps"],
        "accumulation": spec["accumulation"], "total_params": int(total_params),
        "trained_params": int(sum(p.numel() for p in trained)), "first_step_seconds": first,
        "compile_seconds": max(0.0, first - per_step) if spec.get("compile") else None,
        "reserved_bytes": peak.reserved_bytes, "loss": losses[-1] if losses else float("nan"),
        "torch_threads": torch.get_num_threads(), "start_bytes": int(peak.start_bytes),
        "extra": {"rss_before_imports_bytes": int(import_start_rss), "peak_start_bytes": int(peak.start_bytes),
                  "base_dtype": precision.base, "loss_scaling": precision.loss_scaling},
    }
    return result


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_utils.measure",
                                description="Measure the peak memory and time of a training step.")
    p.add_argument("--json", help="run the step described by this JSON spec and print one JSON line")
    p.add_argument("--config", default="smollm2-135m", help="preset name or config.json path")
    p.add_argument("--method", default="lora", choices=METHODS)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--autocast", default=None, choices=sorted(AUTOCAST_NAMES))
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.json:
        result = run_step(json.loads(args.json))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    try:
        m = measure_training_step(args.config, method=args.method, batch=args.batch, seq=args.seq,
                                  lora_rank=args.lora_rank, targets=args.targets.split(","),
                                  checkpointing=args.checkpointing, optimizer=args.optimizer,
                                  autocast=args.autocast, compile=args.compile, steps=args.steps,
                                  accumulation=args.accumulation, timeout_s=args.timeout)
    except (ValueError, TypeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for key in ("peak_bytes", "baseline_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes",
                "saved_activations_bytes"):
        print(f"{key:<24} {getattr(m, key) / 1e9:8.3f} GB")
    print(f"{'step_seconds':<24} {m.step_seconds:8.2f} s (first step {m.first_step_seconds:.2f} s)")
    print(f"measured: {m.what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
