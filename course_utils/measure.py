"""Measure what a training step really costs: peak memory and time, on any device, saying what was measured.

Two tools are used here.

* :func:`course_utils.peak.track_peak` / :func:`~course_utils.peak.measure_peak` - the peak memory of *any piece
  of work*. On a CUDA GPU they read PyTorch's allocator counters (reset at the start of the work). On a CPU there
  is no allocator counter, so they read the process's resident-memory high-water mark (Linux ``VmHWM``), reset at
  the start of the work through ``/proc/self/clear_refs``; where that reset is impossible (macOS) the reading is
  the peak since the process started. The returned object's ``what`` always says which one you got.

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
first, the peak counter is reset, and then ``steps`` steps are measured and timed: 3 by default on a CUDA GPU (a GPU
step takes milliseconds, and one alone is noisy), 1 in a CPU child (a step there takes seconds, and a notebook waits
for it; the CPU lessons read its peak, not its time). One more step, untimed and after the peak, counts the saved
activations and gradients and records the attention backend (the counting hooks cost time). The warm-up step's
time is reported separately (``first_step_seconds``): for ``compile=True`` it contains the compilation. On a CUDA
GPU, the first step of a process is preceded by a tiny matmul and its backward, so that the CUDA context and cuBLAS's
workspace exist before the baseline is read.

A case of :func:`measure_training_steps` that fails, whatever the error, comes back as :class:`Skipped` (its reason as
text): an exception object would keep its traceback, and with it the failed step's model and tensors, alive.

It also times one frozen layer stored three ways (:func:`time_frozen_layer`, lesson 04), and counts what any
forward pass keeps for backward (:func:`saved_for_backward`, lesson 05's torch.compile demo). The peak tracker is
:mod:`course_utils.peak`; the estimates these measurements are compared with are :mod:`course_utils.step_memory`.

The child process runs ``python -m course_utils.measure --json SPEC`` and prints one JSON line;
:func:`measure_training_steps` runs ``--many SPECS``, one child that forks a fresh process per case.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from course_utils import checks
from course_utils.architecture import DEFAULT_TARGETS, normalize_targets
from course_utils.configs import read_config
from course_utils.hardware import as_device, autocast_dtype
from course_utils.memory import ALL_METHODS, OPTIMIZERS
from course_utils.peak import checked_device
from course_utils.quiet import import_bitsandbytes, quiet_libraries
from course_utils.training_step import _TIMEOUT_MESSAGE, ATTENTION_CHOICES, _step_precision, run_step
from course_utils.units import GB

#: Accepted spellings of the autocast dtype (None = no autocast). ``"auto"`` (or True) asks
#: :func:`course_utils.hardware.autocast_dtype` for the device's 16-bit dtype: use it unless a lesson compares
#: dtypes on purpose.
_AUTOCAST_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "auto": "auto"}
#: The keyword arguments that describe a step, with their defaults: those of :func:`measure_training_step`
#: (which spells them out in its signature), of :func:`step_spec` and of a case of :func:`measure_training_steps`.
_STEP_DEFAULTS: dict[str, Any] = {"method": "lora", "batch": 8, "seq": 128, "lora_rank": 8, "targets": DEFAULT_TARGETS,
                                  "checkpointing": False, "optimizer": "adamw", "autocast": None, "compile": False,
                                  "steps": None, "accumulation": 1, "kbit_preparation": True, "attention": "auto"}
#: Timed steps when ``steps`` is None, by device type (see the module doc).
DEFAULT_STEPS = {"cuda": 3, "cpu": 1}
#: Environment of the child process that runs a CPU step. The malloc setting makes glibc serve every
#: allocation above 64 KiB with its own mmap, returned on free, so RSS tracks the live bytes (see module doc).
_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
              "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


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
    checkpointed layers keep, plus what is saved outside them), counted in an untimed step after the timed ones.
    ``steps`` were timed, after the warm-up step; ``autocast`` is the dtype that ran (None: no autocast);
    ``extra["attention"]`` the SDPA backend(s) that ran.
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
    steps: int = 1
    autocast: str | None = None
    total_params: int = 0
    trained_params: int = 0
    first_step_seconds: float = 0.0
    compile_seconds: float | None = None
    reserved_bytes: int | None = None
    # in use when the measured step began: baseline + weights + optimizer states + the framework's memory after a
    # first step (kernel code pages, thread pools, allocator caches)
    start_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_gb(self) -> float:
        """The measured peak in GB (10^9 bytes)."""
        return self.peak_bytes / GB

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field (:func:`measure_training_step`'s child process sends it)."""
        return asdict(self)


@dataclass(frozen=True)
class Skipped:
    """A case of :func:`measure_training_steps` that gave no measurement: ``reason`` is the error's type and message,
    as text. Never the exception itself: its traceback would keep the failed step's model, optimizer and activations
    alive, and on a GPU after an out-of-memory error nothing could free them for the next case."""

    reason: str

    @property
    def timed_out(self) -> bool:
        """Whether the case ran past its time limit."""
        return self.reason.startswith("TimeoutError")


def _skipped(err: BaseException) -> Skipped:
    """``err`` as a :class:`Skipped` row: ``"TypeName: message"`` (shortened), no reference to ``err`` kept."""
    return Skipped(f"{type(err).__name__}: {err}"[:500])


def _normalise_autocast(autocast: Any) -> str | None:
    """``autocast`` spelled out: None (also False), ``"auto"`` (also True), ``"bfloat16"`` or ``"float16"`` (also
    their short names and torch dtypes); ValueError naming ``autocast`` for anything else."""
    if autocast is None or autocast is False:
        return None
    name = "auto" if autocast is True else str(autocast).replace("torch.", "")
    return _AUTOCAST_NAMES[checks.choice(name, "autocast", _AUTOCAST_NAMES)]


def step_spec(config: str | os.PathLike | Mapping[str, Any], **step: Any) -> dict[str, Any]:
    """Check the arguments of a step as :func:`measure_training_step` would (ValueError naming the argument), and
    return its plain-JSON description; ``step`` is that function's keyword arguments (a case of
    :func:`measure_training_steps`; the rest from :data:`_STEP_DEFAULTS`). Nothing is built or run."""
    if unknown := set(step) - set(_STEP_DEFAULTS):
        raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}; allowed: {', '.join(_STEP_DEFAULTS)}")
    spec = {**_STEP_DEFAULTS, **step}
    cfg = read_config(config)
    if "model_type" not in cfg:
        raise ValueError("config must describe a model: a JSON object with a 'model_type' key")
    checks.choice(spec["method"], "method", ALL_METHODS)
    checks.choice(spec["optimizer"], "optimizer", OPTIMIZERS)
    limit = cfg.get("max_position_embeddings")
    highs = {"batch": 4096, "seq": limit if isinstance(limit, int) else 1_000_000, "lora_rank": 4096, "steps": 100,
             "accumulation": 1024}
    for arg, high in highs.items():
        if not (arg == "steps" and spec[arg] is None):  # None: the device's default, set by _place_on_device
            checks.integer(spec[arg], arg, 1, high)
    # the step chooses its dtypes (see _step_precision): the config's own are left out
    spec.update(config={k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype")},
                targets=list(normalize_targets(spec["targets"])), checkpointing=bool(spec["checkpointing"]),
                autocast=_normalise_autocast(spec["autocast"]), compile=bool(spec["compile"]),
                kbit_preparation=checks.flag(spec["kbit_preparation"], "kbit_preparation"),
                attention=checks.choice(spec["attention"], "attention", ATTENTION_CHOICES))
    return spec


def measure_training_step(config: str | os.PathLike | Mapping[str, Any] = "smollm2-135m", *,
                          method: str = "lora", batch: int = 8, seq: int = 128, lora_rank: int = 8,
                          targets: str | Sequence[str] = DEFAULT_TARGETS, checkpointing: bool = False,
                          optimizer: str = "adamw", autocast: Any = None, compile: bool = False,
                          steps: int | None = None, timeout_s: float = 300.0, accumulation: int = 1,
                          kbit_preparation: bool = True, attention: str = "auto",
                          device: Any = None) -> StepMeasurement:
    """Build the model, run a warm-up step, then measure ``steps`` training steps; see the module doc.

    ``method``: ``"full"`` (every weight trained, float32), ``"full-bf16"`` (every weight trained, stored in
    bfloat16 with no float32 master copy; AdamW's states are bfloat16 too), ``"lora"`` (float32 base frozen, LoRA
    adapters of rank ``lora_rank`` on ``targets``), ``"lora-bf16"`` (the frozen base in the device's 16-bit dtype:
    bfloat16, or float16 on a T4), ``"qlora"`` (the frozen base in 4-bit NF4 via bitsandbytes, computing in
    that 16-bit dtype, then prepared for training as notebook 01b does: see :func:`build_model`).
    ``kbit_preparation``: ``"qlora"`` only (ignored by the other methods, which load no 4-bit weights): False
    skips peft's ``prepare_model_for_kbit_training``, as Unsloth and some trainers do. ``optimizer``:
    ``"adamw"`` (torch, two float32 states = 8 bytes per trained parameter) or ``"adamw8bit"`` (bitsandbytes,
    two 8-bit states + block scales, about 2 bytes). ``attention``: ``"auto"`` (PyTorch picks the SDPA backend) or
    ``"math"`` (forced with ``torch.nn.attention.sdpa_kernel``: the backend that keeps the s x s scores); the
    backend that ran is in ``extra["attention"]``.
    ``autocast``: None, ``"auto"`` (the device's 16-bit dtype, see :func:`_step_precision`), or ``"bf16"`` /
    ``"fp16"`` on purpose (fp16 only on CUDA). ``accumulation``: micro-batches of ``batch`` examples per
    optimizer step. ``steps``: timed steps, None for :data:`DEFAULT_STEPS` (3 on a CUDA GPU, 1 on a CPU).
    ``device``: None means :func:`course_utils.hardware.pick_device`. On CPU (the process's peak
    must belong to the step), and with ``compile=True`` on any device (compiling has no upper bound on its time,
    and only a child process can be stopped with everything it started), the work runs in a fresh child process
    bounded by ``timeout_s`` seconds (TimeoutError when it runs longer); on a CUDA GPU otherwise in this process,
    where ``timeout_s`` is checked between micro-batches (a running CUDA kernel cannot be interrupted).
    """
    # the arguments that describe the step, by their names in _STEP_DEFAULTS (read first: nothing else is local yet)
    spec = step_spec(config, **{name: value for name, value in locals().items() if name in _STEP_DEFAULTS})
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    return _measure_case(spec, timeout_s, _place_on_device(spec, device))


def _measure_case(spec: dict[str, Any], timeout_s: float, in_child: bool) -> StepMeasurement:
    """One step, in a bounded child process or in this process (bounded between micro-batches)."""
    if in_child:
        return StepMeasurement(**_run_in_child(spec, timeout_s))
    return StepMeasurement(**run_step({**spec, "timeout_s": timeout_s}))


def measure_training_steps(config: str | os.PathLike | Mapping[str, Any], cases: Sequence[Mapping[str, Any]], *,
                           timeout_s: float = 300.0, device: Any = None) -> list[StepMeasurement | Skipped]:
    """Measure several training steps of one config, each as :func:`measure_training_step` would, in order.

    ``cases`` are that function's keyword arguments. On a CPU they share one child process that imports the
    libraries once and then forks a fresh process per case (Linux), so each case is measured as if alone, without
    paying the imports (10-15 s of CPU here) each time. Where forking is not possible (macOS), or when a case has
    ``compile=True``, each case gets a bounded child of its own; on a CUDA GPU a case without ``compile`` runs in
    this process. ``timeout_s`` bounds each case. A case that fails (any error: out of memory, a missing library, a
    bug) or runs too long gives a :class:`Skipped` with the reason in its place; bad arguments raise at once.
    """
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    if not cases:
        raise ValueError("cases must hold at least one case")
    specs = [step_spec(config, **case) for case in cases]
    in_child = [_place_on_device(spec, device) for spec in specs]
    # one child that forks a process per case: off a GPU (every case in a child), without compile, on Linux only
    # (macOS forks badly once system frameworks are loaded)
    if all(in_child) and not any(spec["compile"] for spec in specs) and sys.platform.startswith("linux"):
        return _run_forked_children(specs, timeout_s)
    return [_case_or_skip(spec, timeout_s, child) for spec, child in zip(specs, in_child)]


def _place_on_device(spec: dict[str, Any], device: Any) -> bool:
    """Check ``spec`` against ``device`` and fill in its device and autocast dtype; returns whether the step runs
    in a bounded child process (off a CUDA GPU, and with ``compile`` on every device)."""
    dev = checked_device(device)
    if dev.type != "cuda" and spec["autocast"] == "float16":
        raise ValueError("autocast='fp16' is for CUDA GPUs: float16 matmuls on a CPU are 100-1000x slower; "
                         "use 'bf16' or 'auto' on a CPU")
    spec["device"] = str(dev)
    spec["autocast"] = _step_precision(spec["method"], spec["autocast"], dev).autocast
    if spec["steps"] is None:
        spec["steps"] = DEFAULT_STEPS["cuda" if dev.type == "cuda" else "cpu"]
    return dev.type != "cuda" or spec["compile"]


def _case_or_skip(spec: dict[str, Any], timeout_s: float, in_child: bool) -> StepMeasurement | Skipped:
    """One case of :func:`measure_training_steps`, in a bounded child or in this process (CUDA): its result, or a
    :class:`Skipped` saying why there is none (any error: out of memory, a compiler's error, a missing library).

    After a case in this process the case's tensors are freed and the allocator's cache emptied, so that the next
    case starts from what was allocated before this one: the error is kept as text only (see :class:`Skipped`).
    """
    try:
        result: StepMeasurement | Skipped = _measure_case(spec, timeout_s, in_child)
    except Exception as err:  # noqa: BLE001 - any failure is this case's row, not the end of the others
        result = _skipped(err)
    if not in_child:  # the error and its traceback are gone: the failed step's tensors can be freed now
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised
    return result


def _run_forked_children(specs: list[dict[str, Any]], timeout_s: float) -> list[StepMeasurement | Skipped]:
    """One bounded child process for all ``specs`` (see :func:`_fork_each`); a result or a :class:`Skipped` per spec."""
    total = timeout_s * len(specs) + 120.0  # the imports, then every case at its limit
    try:
        lines = _run_in_child_lines(["--many", json.dumps(specs), "--case-timeout", str(timeout_s)], total)
    except Exception as err:  # noqa: BLE001 - the child failed as a whole: every case says why
        return [_skipped(err)] * len(specs)
    answers = {payload["index"]: payload for payload in map(json.loads, lines)}
    missing = {"error": "RuntimeError: the measuring process gave no answer for this case"}
    return [_answer(answers.get(i, missing), timeout_s) for i in range(len(specs))]


def _answer(payload: Mapping[str, Any], timeout_s: float) -> StepMeasurement | Skipped:
    """A forked case's JSON line (see :func:`_fork_each`): its measurement, or why there is none."""
    if "result" in payload:
        return StepMeasurement(**payload["result"])
    if payload["error"].startswith("TimeoutError"):
        return Skipped(f"TimeoutError: {_TIMEOUT_MESSAGE.format(timeout_s)}")
    return Skipped(payload["error"])


def _resident_file_pages() -> list[int]:
    """Addresses of this process's resident pages of mapped files (libraries), from /proc/self/pagemap.

    fork() does not copy the page-table entries of file mappings: a forked process's resident memory lacks the
    library pages its parent had loaded until it touches them again. :func:`_fork_each` maps them back. Where
    /proc cannot be read, the pages found so far (every one of them present and readable).
    """
    size = os.sysconf("SC_PAGE_SIZE")
    pages: list[int] = []
    with suppress(OSError), open("/proc/self/maps", encoding="ascii", errors="replace") as maps, \
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
    return pages


def _fork_each(specs: list[dict[str, Any]], case_timeout_s: float) -> None:
    """In the child: import the libraries once, then measure each spec in a process forked from this one.

    A forked process starts with the imports already resident, as a fresh process has them after importing,
    so its peak is the step's own. Each prints one JSON line ``{"index": i, "result": ...}`` (or ``"error"``);
    a case past ``case_timeout_s`` is stopped by an alarm signal, and this process prints the line of a forked
    process that did not end normally.
    """
    with quiet_libraries():
        with suppress(ImportError):  # everything a step imports, loaded before the forks (peft where installed)
            import peft  # noqa: F401 - see above
        from transformers import AutoModelForCausalLM  # noqa: F401 - loads the model classes for the forks
    resident = _resident_file_pages()
    for index, spec in enumerate(specs):
        sys.stdout.flush()  # nothing buffered for the forked process to print again
        pid = os.fork()
        if pid == 0:  # the forked process: one step, its answer, then exit without cleanup
            for address in resident:  # map back the library pages fork left out: the baseline is a fresh process's
                ctypes.c_char.from_address(address).value  # noqa: B018 - reading one byte maps the page in
            signal.alarm(max(1, int(case_timeout_s)))
            try:
                payload = {"index": index, "result": run_step(spec)}
            except BaseException as err:  # noqa: BLE001 - any failure is this case's answer, not the others'
                payload = {"index": index, "error": f"{type(err).__name__}: {err}"[:500]}
            print(json.dumps(payload), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
            sys.stdout.write(json.dumps({"index": index, "error": "TimeoutError: past its time limit" if killed else
                                         f"RuntimeError: the measuring process ended with status {status}"}) + "\n")


def _run_in_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One step in a bounded child process (``--json SPEC``): its :class:`StepMeasurement` dict."""
    return json.loads(_run_in_child_lines(["--json", json.dumps(spec)], timeout_s)[-1])


def _run_in_child_lines(args: list[str], timeout_s: float) -> list[str]:
    """Run ``python -m course_utils.measure ARGS`` in a bounded child process; its JSON lines."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # this package first
    env = {**os.environ, **_CHILD_ENV, "PYTHONPATH": path}
    try:
        done = _run_bounded([sys.executable, "-m", "course_utils.measure", *args], env, timeout_s)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(f"{_TIMEOUT_MESSAGE.format(timeout_s)}; the child process and its helpers (e.g. compilers) "
                           "were stopped") from err
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the measuring process failed (exit status {done.returncode}):\n{tail}")
    return lines


def _run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (torch.compile starts compilers).

    POSIX only, as the course is (Linux and macOS).
    """
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # leaving the with block closes the pipes and reaps the child
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --------------------------------------------------------------------------------------------
# Is 4-bit slow here? One frozen layer, forward + backward
# --------------------------------------------------------------------------------------------
def _frozen_layer_plan(device: Any = None) -> list[tuple[str, Any, Any]]:
    """The ways :func:`time_frozen_layer` stores its layer on ``device``: ``(label, storage dtype, compute dtype)``.

    float32; the 16-bit dtype :func:`course_utils.hardware.autocast_dtype` picks for the device (bfloat16 on a
    CPU and on Ampere-or-newer GPUs, float16 on a T4, which has no native bfloat16); and 4-bit NF4 computing in
    that same 16-bit dtype, as QLoRA does. Decides only: nothing is allocated. ``device`` None means
    :func:`course_utils.hardware.pick_device`.
    """
    half = autocast_dtype(as_device(device))
    return [("float32", torch.float32, torch.float32),
            (str(half).replace("torch.", ""), half, half),
            ("4-bit NF4", torch.uint8, half)]


def time_frozen_layer(in_features: int = 576, out_features: int = 1536, tokens: int = 512,
                      min_run_time: float = 0.3, device: Any = None) -> dict[str, float]:
    """Milliseconds of one forward + backward through a *frozen* linear layer stored three ways.

    That is the work a frozen base layer does in every LoRA/QLoRA step: the input's gradient flows through
    it, its own weight gets none. Stored as float32, in the device's 16-bit dtype, and (when bitsandbytes
    can load) as 4-bit NF4 computing in that 16-bit dtype, as QLoRA does (see :func:`_frozen_layer_plan`:
    bfloat16 on a CPU or an Ampere-or-newer GPU, float16 on a T4). Timed with ``torch.utils.benchmark`` on
    ``device`` (None: the GPU if there is one, else the CPU). Sizes default to one MLP projection of
    SmolLM2-135M and 512 tokens (batch 8 x 64).
    """
    checks.integer(in_features, "in_features", 1, 16384)
    checks.integer(out_features, "out_features", 1, 16384)
    checks.integer(tokens, "tokens", 1, 65536)
    checks.positive(min_run_time, "min_run_time", 10)
    from torch.utils import benchmark

    dev = as_device(device)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=gen) / in_features ** 0.5
    x = torch.randn(tokens, in_features, generator=gen)
    bnb = import_bitsandbytes()
    out = {}
    for label, dtype, compute in _frozen_layer_plan(dev):  # every dtype decided in one place, by the device
        four_bit = dtype == torch.uint8
        if four_bit and bnb is None:
            continue  # no 4-bit layer without bitsandbytes
        layer = (bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=compute, quant_type="nf4")
                 if four_bit else torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype, device=dev))
        layer.load_state_dict({"weight": weight})  # copied in the layer's dtype; NF4 quantizes on .to(dev)
        layer = layer.to(dev).requires_grad_(False)
        inp = x.to(device=dev, dtype=compute).requires_grad_(True)
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
        _fork_each(json.loads(args[1]), float(args[3]))
        return 0
    print("usage: python -m course_utils.measure --json SPEC | --many SPECS --case-timeout S (the measuring "
          "child process; people use python -m course_utils memory --measure)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
