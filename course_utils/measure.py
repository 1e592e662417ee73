"""Measure what a training step really costs: peak memory and time, on any device, saying what was measured.

Two tools live here.

* :func:`track_peak` / :func:`measure_peak` - the peak memory of *any piece of work*. On a CUDA GPU they
  read PyTorch's allocator counters (reset at the start of the work). On a CPU there is no allocator
  counter, so they read the process's resident-memory high-water mark (Linux ``VmHWM``), reset at the start
  of the work through ``/proc/self/clear_refs``; where that reset is impossible (macOS) the reading is the
  peak since the process started. The returned object's ``what`` always says which one you got.

* :func:`measure_training_step` - one (or a few) real training steps of a decoder language model built
  from its ``config.json`` with random, seeded weights: full fine-tuning (float32, or pure bfloat16), LoRA, LoRA
  on a 16-bit base, or QLoRA (4-bit NF4 base). Every other 16-bit dtype comes from :mod:`course_utils.hardware`
  (bfloat16 on a CPU and on Ampere-or-newer GPUs, float16 with loss scaling on a T4, which has no native
  bfloat16). It counts the bytes of the weights, gradients and optimizer states exactly from the tensors, the
  activations autograd saves for backward (deduplicated by storage), and measures the step's peak memory and
  time. On CPU the step runs in a fresh child process (so the peak belongs to this step only), with
  ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system and resident memory tracks the
  live bytes; the child is killed after ``timeout_s``. With ``compile=True`` the step runs in such a bounded
  child on a GPU too: compiling has no upper bound on its time.

Why a warm-up step first: a real training run spends almost all its steps in the *steady state*, where the
optimizer states already exist while the next forward and backward run. The first step is special (the
optimizer allocates its states lazily, ``torch.compile`` compiles). So one unmeasured warm-up step runs
first, the peak counter is reset, and then ``steps`` steps are measured and timed. The warm-up step's
time is reported separately (``first_step_seconds``): for ``compile=True`` it contains the compilation.

It also times one frozen layer stored three ways (:func:`time_frozen_layer`, lesson 04). The peak tracker is
:mod:`course_utils.peak`; the estimates these measurements are compared with are :mod:`course_utils.step_memory`.

The child process runs ``python -m course_utils.measure --json SPEC`` and prints one JSON line;
:func:`measure_training_steps` runs ``--many SPECS``, one child that forks a fresh process per case.
"""
from __future__ import annotations

import contextlib
from contextlib import contextmanager
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from course_utils import checks
from course_utils.architecture import DEFAULT_TARGETS, normalize_targets
from course_utils.configs import config_name, read_config
from course_utils.hardware import as_device
from course_utils.memory import ALL_METHODS, OPTIMIZERS
from course_utils.peak import current_rss_bytes, track_peak
from course_utils.quiet import quiet_libraries
from course_utils.units import GB

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
        return self.peak_bytes / GB

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
    cfg, name = read_config(config), config_name(config)
    if "model_type" not in cfg:
        raise ValueError("config must describe a model: a JSON object with a 'model_type' key")
    for key in ("torch_dtype", "dtype"):  # the step chooses its dtypes (see step_precision)
        cfg.pop(key, None)
    checks.choice(method, "method", ALL_METHODS)
    checks.choice(optimizer, "optimizer", OPTIMIZERS)
    limit = cfg.get("max_position_embeddings")
    checks.integer(batch, "batch", 1, 4096)
    checks.integer(seq, "seq", 1, limit if isinstance(limit, int) else 1_000_000)
    checks.integer(lora_rank, "lora_rank", 1, 4096)
    checks.integer(steps, "steps", 1, 100)
    checks.integer(accumulation, "accumulation", 1, 1024)
    targets = normalize_targets(targets)
    return {"config": cfg, "config_name": name, "method": method, "batch": batch, "seq": seq,
            "lora_rank": lora_rank, "targets": list(targets), "checkpointing": bool(checkpointing),
            "optimizer": optimizer, "autocast": _normalise_autocast(autocast), "compile": bool(compile),
            "steps": steps, "accumulation": accumulation, "seed": int(seed)}


def step_spec(config: str | os.PathLike | Mapping[str, Any], **step: Any) -> dict[str, Any]:
    """Check the arguments of a step as :func:`measure_training_step` would (ValueError naming the argument), and
    return its plain-JSON description; ``step`` is that function's keyword arguments. Nothing is built or run."""
    args = {"method": "lora", "batch": 8, "seq": 128, "lora_rank": 8, "targets": DEFAULT_TARGETS,
            "checkpointing": False, "optimizer": "adamw", "autocast": None, "compile": False, "steps": 1,
            "accumulation": 1, "seed": 0}
    unknown = set(step) - set(args)
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}; allowed: {', '.join(args)}")
    return _spec(config, **{**args, **step})


def measure_training_step(config: str | os.PathLike | Mapping[str, Any] = "smollm2-135m", *,
                          method: str = "lora", batch: int = 8, seq: int = 128, lora_rank: int = 8,
                          targets: str | Sequence[str] = DEFAULT_TARGETS, checkpointing: bool = False,
                          optimizer: str = "adamw", autocast: Any = None, compile: bool = False,
                          steps: int = 1, timeout_s: float = 300.0, accumulation: int = 1, seed: int = 0,
                          device: Any = None, subprocess_: bool | None = None) -> StepMeasurement:
    """Build the model, run a warm-up step, then measure ``steps`` training steps; see the module doc.

    ``method``: ``"full"`` (every weight trained, float32), ``"full-bf16"`` (every weight trained, stored in
    bfloat16 with no float32 master copy; AdamW's states are bfloat16 too), ``"lora"`` (float32 base frozen, LoRA
    adapters of rank ``lora_rank`` on ``targets``), ``"lora-bf16"`` (the frozen base in the device's 16-bit dtype:
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
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    dev = _for_device(spec, device)
    if not runs_in_child(dev, spec["compile"], subprocess_):
        return StepMeasurement.from_dict(run_step(spec))
    return StepMeasurement.from_dict(_run_in_child(spec, float(timeout_s)))


def measure_training_steps(config: str | os.PathLike | Mapping[str, Any], cases: Sequence[Mapping[str, Any]], *,
                           timeout_s: float = 300.0, device: Any = None) -> list[StepMeasurement | Exception]:
    """Measure several training steps of one config, each as :func:`measure_training_step` would, in order.

    ``cases`` are that function's keyword arguments (no ``compile``: a compiled step always gets a process of its
    own). On a CPU they share one child process that imports the libraries once and then forks a fresh process
    per case (Linux), so each case is measured as if alone, without paying the imports (10-15 s of CPU here)
    each time; elsewhere each case gets its own child. ``timeout_s`` bounds each case. A case that fails or runs
    too long gives its exception (TimeoutError, RuntimeError) in its place; bad arguments raise at once.
    """
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    if not cases:
        raise ValueError("cases must hold at least one case")
    specs = []
    for case in cases:
        if case.get("compile"):
            raise ValueError("cases: a compiled step is measured alone, with measure_training_step(compile=True)")
        known = ("method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer", "autocast", "steps",
                 "accumulation", "seed")
        unknown = set(case) - set(known)
        if unknown:
            raise ValueError(f"cases: unknown argument(s) {', '.join(sorted(unknown))}; allowed: {', '.join(known)}")
        defaults = {"method": "lora", "batch": 8, "seq": 128, "lora_rank": 8, "targets": DEFAULT_TARGETS,
                    "checkpointing": False, "optimizer": "adamw", "autocast": None, "steps": 1, "accumulation": 1,
                    "seed": 0}
        args = {**defaults, **case}
        specs.append(_spec(config, args["method"], args["batch"], args["seq"], args["lora_rank"], args["targets"],
                           args["checkpointing"], args["optimizer"], args["autocast"], False, args["steps"],
                           args["accumulation"], args["seed"]))
    dev = as_device(device)
    for spec in specs:
        _for_device(spec, dev)
    if not runs_in_child(dev, False):
        return [_in_process_or_error(spec) for spec in specs]
    if not _can_fork():
        return [_child_or_error(spec, float(timeout_s)) for spec in specs]
    return _run_forked_children(specs, float(timeout_s))


def _for_device(spec: dict[str, Any], device: Any) -> Any:
    """Check ``spec`` against ``device`` and fill in its device and autocast dtype; returns the torch.device."""
    dev = as_device(device)
    if dev.type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but torch.cuda.is_available() is False on this machine")
    elif spec["autocast"] == "float16":
        raise ValueError("autocast='fp16' is for CUDA GPUs: float16 matmuls on a CPU are 100-1000x slower; "
                         "use 'bf16' or 'auto' on a CPU")
    spec["device"] = str(dev)
    spec["autocast"] = step_precision(spec["method"], spec["autocast"], dev).autocast
    return dev


def _can_fork() -> bool:
    """Linux only: macOS forks badly once system frameworks are loaded, Windows cannot fork."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def _child_or_error(spec: dict[str, Any], timeout_s: float) -> StepMeasurement | Exception:
    try:
        return StepMeasurement.from_dict(_run_in_child(spec, timeout_s))
    except (TimeoutError, RuntimeError) as err:
        return err


def _in_process_or_error(spec: dict[str, Any]) -> StepMeasurement | Exception:
    """One case in this process (CUDA): its result, or its error (an out-of-memory included) in its place.

    After a failure the case's tensors are freed and the allocator's cache emptied, so that the next case starts
    from what was allocated before this one.
    """
    import torch

    try:
        return StepMeasurement.from_dict(run_step(spec))
    except (RuntimeError, ValueError, ImportError, TimeoutError) as err:  # torch.OutOfMemoryError is a RuntimeError
        return err if isinstance(err, RuntimeError) else RuntimeError(f"{type(err).__name__}: {err}")
    finally:
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _run_forked_children(specs: list[dict[str, Any]], timeout_s: float) -> list[StepMeasurement | Exception]:
    """One bounded child process for all ``specs`` (see :func:`fork_each`); a result or an exception per spec."""
    total = timeout_s * len(specs) + 120.0  # the imports, then every case at its limit
    try:
        lines = _run_in_child_lines(["--many", json.dumps(specs), "--case-timeout", str(timeout_s)], total)
    except (TimeoutError, RuntimeError) as err:
        return [err] * len(specs)
    answers: dict[int, Any] = {}
    for line in lines:
        payload = json.loads(line)
        answers[payload["index"]] = payload
    out: list[StepMeasurement | Exception] = []
    for i in range(len(specs)):
        payload = answers.get(i, {"error": "RuntimeError: the measuring process gave no answer for this case"})
        if "result" in payload:
            out.append(StepMeasurement.from_dict(payload["result"]))
        elif payload["error"].startswith("TimeoutError"):
            out.append(TimeoutError(f"the measured step did not finish within timeout_s={timeout_s:g} s"))
        else:
            out.append(RuntimeError(payload["error"]))
    return out


def _resident_file_pages() -> list[int]:
    """Addresses of this process's resident pages of mapped files (libraries), from /proc/self/pagemap.

    fork() does not copy the page-table entries of file mappings: a forked process's resident memory lacks the
    library pages its parent had loaded until it touches them again. :func:`_touch` maps them back.
    """
    size = os.sysconf("SC_PAGE_SIZE")
    pages: list[int] = []
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps, \
                open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or not fields[5].startswith("/") or "r" not in fields[1]:
                    continue  # anonymous memory is copied by fork; unreadable pages cannot be touched
                start, end = (int(x, 16) for x in fields[0].split("-"))
                pagemap.seek(start // size * 8)
                entries = pagemap.read((end - start) // size * 8)
                pages += [start + i * size for i in range(len(entries) // 8)
                          if entries[8 * i + 7] & 0x80]  # bit 63: the page is present
    except OSError:
        return []
    return pages


def _touch(pages: list[int]) -> None:
    """Read one byte of each page, which maps it into this process."""
    import ctypes

    for address in pages:
        ctypes.c_char.from_address(address).value  # noqa: B018 - the read is the point


def fork_each(specs: list[dict[str, Any]], case_timeout_s: float) -> None:
    """In the child: import the libraries once, then measure each spec in a process forked from this one.

    A forked process starts with the imports already resident, as a fresh process has them after importing,
    so its peak is the step's own. Each prints one JSON line ``{"index": i, "result": ...}`` (or ``"error"``);
    a case past ``case_timeout_s`` is stopped by an alarm signal.
    """
    import signal

    with quiet_libraries():
        import peft  # noqa: F401 - everything a step imports, loaded before the forks
        import torch  # noqa: F401 - imported for the forks, as above
        from transformers import AutoModelForCausalLM  # noqa: F401 - loads the model classes for the forks
    resident = _resident_file_pages()
    for index, spec in enumerate(specs):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the forked process: one step, its answer down the pipe, then exit without cleanup
            os.close(read_fd)
            _touch(resident)  # map back the library pages fork left out, so the baseline is a fresh process's
            signal.alarm(max(1, int(case_timeout_s)))
            try:
                payload = {"index": index, "result": run_step(spec)}
            except BaseException as err:  # noqa: BLE001 - any failure is this case's answer, not the others'
                payload = {"index": index, "error": f"{type(err).__name__}: {err}"[:500]}
            with os.fdopen(write_fd, "w") as fh:
                fh.write(json.dumps(payload))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as fh:
            answer = fh.read()
        _, status = os.waitpid(pid, 0)
        if not answer:
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
            answer = json.dumps({"index": index, "error": "TimeoutError: past its time limit" if killed else
                                 f"RuntimeError: the measuring process ended with status {status}"})
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


class Precision(NamedTuple):
    """The dtypes of a measured step, decided for its device by :mod:`course_utils.hardware`."""

    base: str  # the frozen/trained weights' dtype: "float32", or the 16-bit dtype of lora-bf16 / qlora
    autocast: str | None  # the autocast dtype, None without autocast
    loss_scaling: bool  # True when float16 does the arithmetic (GradScaler on)


def step_precision(method: str, autocast: str | None, device: Any = None) -> Precision:
    """Which dtypes a step of ``method`` uses on ``device``, and whether it needs loss scaling.

    The 16-bit dtype is :func:`course_utils.hardware.autocast_dtype`: bfloat16 on a CPU or an Ampere-or-newer
    GPU, float16 on a T4 (it emulates bfloat16 slowly; ``torch.cuda.is_bf16_supported()`` says True there).
    ``lora-bf16`` and ``qlora`` store (or compute) their frozen base in it. ``full-bf16`` is bfloat16 on every
    device, by its name (pure float16 training without a float32 master copy loses small updates; a T4 runs
    bfloat16 by emulation, slowly). ``autocast``: None, ``"auto"``
    (that dtype) or an explicit ``"bfloat16"`` / ``"float16"`` for a lesson that compares dtypes on purpose.
    Loss scaling (:func:`course_utils.hardware.needs_loss_scaling`) is on when float16 does the arithmetic.
    Decides only: nothing is allocated.
    """
    from course_utils.hardware import autocast_dtype, needs_loss_scaling

    checks.choice(method, "method", ALL_METHODS)
    half = autocast_dtype(as_device(device))
    half_name = str(half).replace("torch.", "")
    base = {"lora-bf16": half_name, "qlora": half_name, "full-bf16": "bfloat16"}.get(method, "float32")
    if autocast not in (None, "auto", "bfloat16", "float16"):
        raise ValueError(f"autocast must be None, 'auto', 'bfloat16' or 'float16', got {autocast!r}")
    amp = half_name if autocast == "auto" else autocast
    import torch

    compute = amp or base
    return Precision(base, amp, needs_loss_scaling(getattr(torch, compute)))


def runs_in_child(device: Any, compile: bool, subprocess_: bool | None = None) -> bool:
    """Whether a measured step runs in a bounded child process (True) or in this process.

    CPU: always (the process's peak must belong to the step). CUDA: when ``compile`` is on - compiling has no
    upper bound on its time, and only a child process can be stopped with everything it started - or when
    ``subprocess_`` asks for it. ``subprocess_=False`` with ``compile=True`` raises ValueError.
    """
    dev = as_device(device)
    if compile and subprocess_ is False:
        raise ValueError("subprocess_ must be None or True when compile=True: torch.compile runs in a child "
                         "process so that timeout_s can stop it")
    if subprocess_ is not None:
        return bool(subprocess_)
    return dev.type != "cuda" or bool(compile)


def _run_in_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    result = json.loads(_run_in_child_lines(["--json", json.dumps(spec)], timeout_s)[-1])
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _run_in_child_lines(args: list[str], timeout_s: float) -> list[str]:
    """Run ``python -m course_utils.measure ARGS`` in a bounded child process; its JSON lines."""
    env = dict(os.environ)
    env.update(CHILD_ENV)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "course_utils.measure", *args]
    try:
        done = _run_bounded(cmd, env, timeout_s)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(f"the measured step did not finish within timeout_s={timeout_s:g} s; "
                           "the child process and its helpers (e.g. compilers) were stopped") from err
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the measuring process failed (exit status {done.returncode}):\n{tail}")
    return lines


def _run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (torch.compile starts compilers)."""
    if os.name != "posix":
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    import signal

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
    import torch

    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def build_model(spec: Mapping[str, Any], device: Any = "cpu") -> Any:
    """The model a spec describes, random seeded weights, on ``device``, ready to train.

    The 16-bit base of ``lora-bf16`` and ``qlora`` (and QLoRA's compute dtype) is :func:`step_precision`'s:
    bfloat16, or float16 on a T4. ``full-bf16`` is the whole model in bfloat16, every parameter trainable.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

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
        import tempfile

        from transformers import BitsAndBytesConfig

        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                       bnb_4bit_compute_dtype=base_dtype)
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, dtype=base_dtype,
                                                         device_map={"": str(device)})
            _detach_from_checkpoint_file(model)
    else:
        model = model.to(device)
    if spec.get("checkpointing"):
        model.activation_checkpointing_enable() if hasattr(model, "activation_checkpointing_enable") \
            else model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not ALL_METHODS[method].trains_all:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=spec["lora_rank"], lora_alpha=2 * spec["lora_rank"], lora_dropout=0.0,
                          target_modules=list(spec["targets"]), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        if spec.get("checkpointing"):
            model.enable_input_require_grads()
    model.train()
    return model


def _detach_from_checkpoint_file(model: Any) -> None:
    """Copy every tensor that is not 4-bit out of the temporary checkpoint file it was loaded from.

    ``from_pretrained`` memory-maps the safetensors file, and tensors it does not convert (the embedding, the
    norms) stay views of that mapping: on a CPU the file's pages would then count in the process's resident
    memory for as long as the model lives (0.2 GB for SmolLM2), though the step does not need them.
    """
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if type(param).__name__ != "Params4bit":
                param.data = param.data.clone()


def make_optimizer(spec: Mapping[str, Any], params: list[Any]) -> Any:
    """AdamW from torch, or bitsandbytes' 8-bit AdamW, over ``params``."""
    import torch

    if spec["optimizer"] == "adamw8bit":
        from course_utils.quiet import import_bitsandbytes

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
    import torch

    from course_utils.quiet import import_bitsandbytes

    kind = as_device(device).type
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
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return type(module).__name__.endswith("DecoderLayer")
    return isinstance(module, GradientCheckpointingLayer)


@contextmanager
def _count_saved_tensors(model: Any, exclude: set[int], checkpointing: bool) -> Iterator[dict[int, int]]:
    """Record the storages autograd saves for backward (and, with checkpointing, each layer's kept input)."""
    import torch

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
        import peft  # noqa: F401 - imported before the baseline is read, so that every method has the same baseline

        dev = as_device(spec.get("device"))
        baseline = _memory_in_use(dev)
        model = build_model(spec, dev)
        step = _Step(spec, model, dev)
        t0 = time.perf_counter()
        step.run(count=False)  # warm-up: optimizer states, lazy allocations, compilation
        step.sync()
        first = time.perf_counter() - t0
        losses = []
        with track_peak(dev) as peak:
            t0 = time.perf_counter()
            for i in range(spec["steps"]):
                losses.append(step.run(count=i == spec["steps"] - 1))
            step.sync()
            per_step = (time.perf_counter() - t0) / spec["steps"]
        return _result(spec, step, peak, baseline=baseline, first=first, per_step=per_step, losses=losses,
                       import_start_rss=import_start_rss)


def _memory_in_use(dev: Any) -> int:
    """What the peak counter of ``dev`` reads now: PyTorch's allocated bytes on CUDA, resident memory on CPU."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        return torch.cuda.memory_allocated(dev)
    return current_rss_bytes()


class _Step:
    """One training step of ``model`` as the spec says: micro-batches, autocast, loss scaling, optimizer."""

    def __init__(self, spec: Mapping[str, Any], model: Any, dev: Any) -> None:
        import torch

        from course_utils.hardware import autocast_dtype

        self.spec, self.model, self.dev = spec, model, dev
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(spec, self.trained)
        self.precision = step_precision(spec["method"], spec.get("autocast"), dev)
        # autocast needs a valid dtype even when it is off: the device's own 16-bit one
        self.amp_dtype = getattr(torch, self.precision.autocast) if self.precision.autocast else autocast_dtype(dev)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.precision.loss_scaling)  # float16 needs it
        self.forward = torch.compile(model) if spec.get("compile") else model
        gen = torch.Generator().manual_seed(spec.get("seed", 0) + 1)
        vocab = int(spec["config"]["vocab_size"])
        self.micro_batches = [torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=gen).to(dev)
                              for _ in range(spec["accumulation"])]
        self.param_storages = {k[0] for k in (_storage_key(t) for t in _tensors_of_params(model)) if k}
        self.counts: dict[str, int] = {}

    def run(self, count: bool) -> float:
        """One optimizer step over every micro-batch; with ``count``, count the saved activations and gradients."""
        import torch

        loss_value = 0.0
        for i, ids in enumerate(self.micro_batches):
            counting = count and i == 0
            ctx = _count_saved_tensors(self.model, self.param_storages, self.spec.get("checkpointing", False)) \
                if counting else contextlib.nullcontext({})
            with ctx as seen:
                with torch.autocast(self.dev.type, dtype=self.amp_dtype, enabled=self.precision.autocast is not None):
                    loss = self.forward(input_ids=ids, labels=ids).loss / self.spec["accumulation"]
                self.scaler.scale(loss).backward()
            if counting:
                self.counts["saved"] = sum(seen.values())
            loss_value += float(loss.detach())
        if count:
            self.counts["grads"] = _unique_nbytes(p.grad for p in self.trained if p.grad is not None)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_value

    def sync(self) -> None:
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)


def _true_param_count(model: Any) -> int:
    """Every parameter once; bitsandbytes' packed 4-bit tensors hold 2 numbers per byte."""
    unique = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() * (2 if type(p).__name__ == "Params4bit" else 1) for p in unique)


def _result(spec: Mapping[str, Any], step: _Step, peak: Any, *, baseline: int, first: float, per_step: float,
            losses: list[float], import_start_rss: int) -> dict[str, Any]:
    """The plain-JSON :class:`StepMeasurement` of a measured step."""
    import torch

    what = peak.what
    peak_bytes, start_bytes, before = int(peak.bytes), int(peak.start_bytes), 0
    if step.dev.type == "cuda":  # this process: count the step's own bytes, above what was allocated before it
        before, baseline = int(baseline), 0
        peak_bytes, start_bytes = max(0, peak_bytes - before), max(0, start_bytes - before)
        what += f"; counted above the {before:,} bytes already allocated in this process before the model was built"
    else:
        what = (what.replace("this process", "a fresh child process")
                + "; includes the child's baseline (Python, torch, transformers); "
                + "MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave the resident set")
    return {
        "peak_bytes": peak_bytes, "baseline_bytes": int(baseline),
        "weights_bytes": _unique_nbytes(_tensors_of_params(step.model)),
        "grads_bytes": step.counts.get("grads", 0),
        "optimizer_bytes": _unique_nbytes(_optimizer_tensors(step.optimizer)),
        "saved_activations_bytes": step.counts.get("saved", 0),
        "step_seconds": per_step, "device": str(step.dev), "what": what,
        "config_name": spec.get("config_name", ""), "method": spec["method"], "batch": spec["batch"],
        "seq": spec["seq"], "lora_rank": spec["lora_rank"], "targets": list(spec["targets"]),
        "checkpointing": bool(spec.get("checkpointing")), "optimizer": spec["optimizer"],
        "autocast": step.precision.autocast, "compile": bool(spec.get("compile")), "steps": spec["steps"],
        "accumulation": spec["accumulation"], "total_params": _true_param_count(step.model),
        "trained_params": int(sum(p.numel() for p in step.trained)), "first_step_seconds": first,
        "compile_seconds": max(0.0, first - per_step) if spec.get("compile") else None,
        "reserved_bytes": peak.reserved_bytes, "loss": losses[-1] if losses else float("nan"),
        "torch_threads": torch.get_num_threads(), "start_bytes": start_bytes,
        "extra": {"rss_before_imports_bytes": int(import_start_rss), "peak_start_bytes": int(peak.start_bytes),
                  "allocated_before_bytes": before,
                  "base_dtype": step.precision.base, "loss_scaling": step.precision.loss_scaling},
    }


# Is 4-bit slow here? One frozen layer, forward + backward
# --------------------------------------------------------------------------------------------
def frozen_layer_plan(device: Any = None) -> list[tuple[str, Any, Any]]:
    """The ways :func:`time_frozen_layer` stores its layer on ``device``: ``(label, storage dtype, compute dtype)``.

    float32; the 16-bit dtype :func:`course_utils.hardware.autocast_dtype` picks for the device (bfloat16 on a
    CPU and on Ampere-or-newer GPUs, float16 on a T4, which has no native bfloat16); and 4-bit NF4 computing in
    that same 16-bit dtype, as QLoRA does. Decides only: nothing is allocated. ``device`` None means
    :func:`course_utils.hardware.pick_device`.
    """
    import torch

    from course_utils.hardware import as_device, autocast_dtype

    half = autocast_dtype(as_device(device))
    return [("float32", torch.float32, torch.float32),
            (str(half).replace("torch.", ""), half, half),
            ("4-bit NF4", torch.uint8, half)]


def time_frozen_layer(in_features: int = 576, out_features: int = 1536, tokens: int = 512,
                      min_run_time: float = 0.3, device: Any = None) -> dict[str, float]:
    """Milliseconds of one forward + backward through a *frozen* linear layer stored three ways.

    That is the work a frozen base layer does in every LoRA/QLoRA step: the input's gradient flows through
    it, its own weight gets none. Stored as float32, in the device's 16-bit dtype, and (when bitsandbytes
    can load) as 4-bit NF4 computing in that 16-bit dtype, as QLoRA does (see :func:`frozen_layer_plan`:
    bfloat16 on a CPU or an Ampere-or-newer GPU, float16 on a T4). Timed with ``torch.utils.benchmark`` on
    ``device`` (None: the GPU if there is one, else the CPU). Sizes default to one MLP projection of
    SmolLM2-135M and 512 tokens (batch 8 x 64).
    """
    checks.integer(in_features, "in_features", 1, 16384)
    checks.integer(out_features, "out_features", 1, 16384)
    checks.integer(tokens, "tokens", 1, 65536)
    checks.positive(min_run_time, "min_run_time", 10)
    import torch
    from torch.utils import benchmark

    from course_utils.hardware import as_device
    from course_utils.quiet import import_bitsandbytes

    dev = as_device(device)
    plan = frozen_layer_plan(dev)  # every dtype decided in one place, by the device
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen) / in_features ** 0.5
    x = torch.randn(tokens, in_features, generator=gen)
    layers: dict[str, tuple[Any, Any]] = {}
    for label, dtype, _ in plan[:2]:
        layer = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype, device=dev)
        with torch.no_grad():
            layer.weight.copy_(weight)
        layers[label] = (layer.requires_grad_(False), dtype)
    bnb = import_bitsandbytes()
    if bnb is not None:
        label, _, compute = plan[2]
        layer4 = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=compute, quant_type="nf4")
        layer4.load_state_dict({"weight": weight})
        layers[label] = (layer4.to(dev).requires_grad_(False), compute)
    out = {}
    for label, (layer, dtype) in layers.items():
        inp = x.to(device=dev, dtype=dtype).requires_grad_(True)
        timer = benchmark.Timer("layer(inp).float().sum().backward()", globals={"layer": layer, "inp": inp})
        out[label] = timer.blocked_autorange(min_run_time=min_run_time).median * 1e3
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The child process of :func:`measure_training_step`: ``python -m course_utils.measure --json SPEC``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--json":
        sys.stdout.write(json.dumps(run_step(json.loads(args[1]))) + "\n")
        return 0
    if len(args) == 4 and args[0] == "--many" and args[2] == "--case-timeout":
        fork_each(json.loads(args[1]), float(args[3]))
        return 0
    print("usage: python -m course_utils.measure --json SPEC | --many SPECS --case-timeout S (the measuring "
          "child process; people use python -m course_utils memory --measure)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
