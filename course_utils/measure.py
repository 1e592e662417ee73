"""Measure what a training step really costs: peak memory and time, on any device, saying what was measured.

:func:`measure_training_step` runs one (or a few) real training steps of a decoder language model built from its
``config.json`` with random, seeded weights (:mod:`course_utils.step_model`): full fine-tuning (float32, or pure
bfloat16), LoRA, LoRA on a 16-bit base, or QLoRA (4-bit NF4 base). Every other 16-bit dtype comes from
:mod:`course_utils.hardware` (bfloat16 on a CPU and on Ampere-or-newer GPUs, float16 with loss scaling on a T4, which
has no native bfloat16). It counts the bytes of the weights, gradients and optimizer states exactly from the tensors,
the activations autograd saves for backward (deduplicated by storage), and measures the step's peak memory and time
(:mod:`course_utils.training_step`). The peak tracker is :mod:`course_utils.peak`: PyTorch's allocator counters on a
CUDA GPU, the process's resident-memory high-water mark on a CPU, and ``what`` always says which one was read.

On a CPU the step runs in a fresh child process (:mod:`course_utils.children`), so that the peak belongs to this step
only, with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the system and resident memory tracks the
live bytes; the child is killed after ``timeout_s``. With ``compile=True`` the step runs in such a bounded child on a
GPU too: compiling has no upper bound on its time. :func:`measure_training_steps` measures several cases in one child
that imports the libraries once and forks a fresh-looking process per case.

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

It also times one frozen layer stored three ways (:func:`time_frozen_layer`, lesson 04). The estimates these
measurements are compared with are :mod:`course_utils.step_memory`'s.
"""

import gc
import sys
from dataclasses import asdict, dataclass, field
from inspect import signature
from typing import Any, Mapping, Sequence

import torch

from course_utils import checks, children
from course_utils.architecture import Config, normalize_targets
from course_utils.configs import read_config
from course_utils.hardware import as_device, autocast_dtype
from course_utils.memory import ALL_METHODS, OPTIMIZERS
from course_utils.peak import checked_device
from course_utils.quiet import import_bitsandbytes
from course_utils.step_memory import estimate_step
from course_utils.step_model import _step_precision
from course_utils.training_step import ATTENTION_CHOICES, run_step

#: The keyword arguments that describe a step, with their defaults: the estimate's (a measurement is compared with
#: the estimate of the same step), and two that only a measurement has.
_STEP_DEFAULTS = {
    p.name: p.default
    for p in signature(estimate_step).parameters.values()
    if p.kind is p.KEYWORD_ONLY and p.name not in ("device", "baseline_bytes", "capability")
} | {"compile": False, "steps": None}
#: Timed steps when ``steps`` is None, by device type (see the module doc).
DEFAULT_STEPS = {"cuda": 3, "cpu": 1}
#: What a child process runs for a step, and what it imports once before it forks a process per case.
_RUN_STEP = "course_utils.training_step:run_step"
_IMPORTS = "course_utils.training_step:import_step_libraries"


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
    ``extra["attention"]`` the SDPA backend(s) that ran. ``start_bytes``: in use when the measured step began
    (baseline + weights + optimizer states + the framework's memory after a first step: kernel code pages, thread
    pools, allocator caches).
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
    start_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary of every field (what a child process sends)."""
        return asdict(self)


@dataclass(frozen=True)
class Skipped:
    """A case of :func:`measure_training_steps` that gave no measurement: ``reason`` is the error's type and message,
    as text. Never the exception itself: its traceback would keep the failed step's model, optimizer and activations
    alive, and on a GPU after an out-of-memory error nothing could free them for the next case."""

    reason: str


def _normalise_autocast(autocast: Any) -> str | None:
    """``autocast`` spelled out: None (also False), ``"auto"`` (also True), ``"bfloat16"`` or ``"float16"`` (also
    their short names and torch dtypes); ValueError naming ``autocast`` for anything else."""
    if autocast is None or autocast is False:
        return None
    name = "auto" if autocast is True else str(autocast).replace("torch.", "")
    name = {"bf16": "bfloat16", "fp16": "float16"}.get(name, name)
    return checks.choice(name, "autocast", ("auto", "bfloat16", "float16"))


def step_spec(config: Config, **step: Any) -> dict[str, Any]:
    """Check the arguments of a step as :func:`measure_training_step` would (ValueError naming the argument), and
    return its plain-JSON description; ``step``: that function's ``compile``, ``steps`` and step arguments (each
    missing one takes its default). Nothing is built or run."""
    if unknown := set(step) - set(_STEP_DEFAULTS):
        raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}; allowed: {', '.join(_STEP_DEFAULTS)}")
    spec = {**_STEP_DEFAULTS, **step}
    cfg = read_config(config)
    if "model_type" not in cfg:
        raise ValueError("config must describe a model: a JSON object with a 'model_type' key")
    checks.choice(spec["method"], "method", ALL_METHODS)
    checks.choice(spec["optimizer"], "optimizer", OPTIMIZERS)
    limit = cfg.get("max_position_embeddings")
    longest = limit if isinstance(limit, int) else 1_000_000
    highs = {"batch": 4096, "seq": longest, "lora_rank": 4096, "steps": 100, "accumulation": 1024}
    for arg, high in highs.items():
        if not (arg == "steps" and spec[arg] is None):  # None: the device's default, set by _place_on_device
            checks.integer(spec[arg], arg, 1, high)
    # the step chooses its dtypes (see step_model._step_precision): the config's own are left out
    spec["config"] = {k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype")}
    spec["targets"] = list(normalize_targets(spec["targets"]))
    spec["checkpointing"], spec["compile"] = bool(spec["checkpointing"]), bool(spec["compile"])
    spec["autocast"] = _normalise_autocast(spec["autocast"])
    spec["kbit_preparation"] = checks.flag(spec["kbit_preparation"], "kbit_preparation")
    spec["attention"] = checks.choice(spec["attention"], "attention", ATTENTION_CHOICES)
    return spec


def measure_training_step(
    config: Config = "smollm2-135m", *, timeout_s: float = 300.0, device: Any = None, **step: Any
) -> StepMeasurement:
    """Build the model, run a warm-up step, then measure ``steps`` training steps; see the module doc.

    ``step``: the step, as :func:`course_utils.step_memory.estimate_step` takes it and with its defaults (a
    measurement and its estimate take the same step): ``method``, ``batch``, ``seq``, ``lora_rank``, ``targets``,
    ``checkpointing``, ``optimizer``, ``autocast``, ``accumulation``, ``kbit_preparation``, ``attention``.
    ``method``: ``"full"`` (every weight trained, float32), ``"full-bf16"`` (every weight trained, stored in
    bfloat16 with no float32 master copy; AdamW's states are bfloat16 too), ``"lora"`` (float32 base frozen, LoRA
    adapters of rank ``lora_rank`` on ``targets``), ``"lora-bf16"`` (the frozen base in the device's 16-bit dtype:
    bfloat16, or float16 on a T4), ``"qlora"`` (the frozen base in 4-bit NF4 via bitsandbytes, computing in
    that 16-bit dtype, then prepared for training as notebook 01b does: see
    :func:`course_utils.step_model.build_model`). ``kbit_preparation``: ``"qlora"`` only (ignored by the other
    methods, which load no 4-bit weights): False skips peft's ``prepare_model_for_kbit_training``, as Unsloth and
    some trainers do. ``optimizer``: ``"adamw"`` (torch, two float32 states = 8 bytes per trained parameter) or
    ``"adamw8bit"`` (bitsandbytes, two 8-bit states + block scales, about 2 bytes). ``attention``: ``"auto"``
    (PyTorch picks the SDPA backend) or ``"math"`` (forced with ``torch.nn.attention.sdpa_kernel``: the backend that
    keeps the s x s scores); the backend that ran is in ``extra["attention"]``.
    ``autocast``: None, ``"auto"`` (the device's 16-bit dtype), or ``"bf16"`` / ``"fp16"`` on purpose (fp16 only on
    CUDA). ``accumulation``: micro-batches of ``batch`` examples per optimizer step. ``steps``: timed steps, None
    for :data:`DEFAULT_STEPS` (3 on a CUDA GPU, 1 on a CPU). ``device``: None means
    :func:`course_utils.hardware.pick_device`. On CPU (the process's peak must belong to the step), and with
    ``compile=True`` on any device (compiling has no upper bound on its time, and only a child process can be
    stopped with everything it started), the work runs in a fresh child process bounded by ``timeout_s`` seconds
    (TimeoutError when it runs longer); on a CUDA GPU otherwise in this process, where ``timeout_s`` is checked
    between micro-batches (a running CUDA kernel cannot be interrupted).
    """
    spec = step_spec(config, **step)
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    return _measure_case(spec, timeout_s, _place_on_device(spec, device))


def _measure_case(spec: dict[str, Any], timeout_s: float, in_child: bool) -> StepMeasurement:
    """One step, in a bounded child process or in this process (bounded between micro-batches)."""
    result = _run_in_child(spec, timeout_s) if in_child else run_step({**spec, "timeout_s": timeout_s})
    return StepMeasurement(**result)


def _run_in_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One step in a fresh child process bounded by ``timeout_s``: its :class:`StepMeasurement` dict."""
    return children.call(_RUN_STEP, spec, timeout_s)


def measure_training_steps(
    config: Config, cases: Sequence[Mapping[str, Any]], *, timeout_s: float = 300.0, device: Any = None
) -> list[StepMeasurement | Skipped]:
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
    if all(in_child) and not any(spec["compile"] for spec in specs) and sys.platform.startswith("linux"):
        answers = children.call_each(_RUN_STEP, specs, timeout_s, prepare=_IMPORTS)
        return [StepMeasurement(**a["result"]) if "result" in a else Skipped(a["error"]) for a in answers]
    return [_case_or_skip(spec, timeout_s, child) for spec, child in zip(specs, in_child)]


def _place_on_device(spec: dict[str, Any], device: Any) -> bool:
    """Check ``spec`` against ``device`` and fill in its device and autocast dtype; returns whether the step runs
    in a bounded child process (off a CUDA GPU, and with ``compile`` on every device)."""
    dev = checked_device(device)
    if dev.type != "cuda" and spec["autocast"] == "float16":
        raise ValueError("autocast='fp16' is for CUDA GPUs (100-1000x slower on a CPU): use 'bf16' or 'auto'")
    spec["device"] = str(dev)
    spec["autocast"] = _step_precision(spec["method"], spec["autocast"], dev).autocast
    spec["steps"] = spec["steps"] or DEFAULT_STEPS["cuda" if dev.type == "cuda" else "cpu"]  # None: the default
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
        result = Skipped(f"{type(err).__name__}: {err}"[:500])
    if not in_child:  # the error and its traceback are gone: the failed step's tensors can be freed now
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised
    return result


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
    name = str(half).replace("torch.", "")
    return [("float32", torch.float32, torch.float32), (name, half, half), ("4-bit NF4", torch.uint8, half)]


def time_frozen_layer(
    in_features: int = 576, out_features: int = 1536, tokens: int = 512, min_run_time: float = 0.3, device: Any = None
) -> dict[str, float]:
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
    weight = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
    x = torch.randn(tokens, in_features, generator=gen)
    bnb = import_bitsandbytes()
    out = {}
    for label, dtype, compute in _frozen_layer_plan(dev):  # every dtype decided in one place, by the device
        if dtype == torch.uint8 and bnb is None:
            continue  # no 4-bit layer without bitsandbytes
        if dtype == torch.uint8:  # NF4 quantizes on .to(dev)
            layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=compute, quant_type="nf4")
        else:
            layer = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype, device=dev)
        layer.load_state_dict({"weight": weight})  # copied in the layer's dtype
        layer = layer.to(dev).requires_grad_(False)
        inp = x.to(device=dev, dtype=compute).requires_grad_(True)
        timer = benchmark.Timer("layer(inp).float().sum().backward()", globals={"layer": layer, "inp": inp})
        out[label] = timer.blocked_autorange(min_run_time=min_run_time).median * 1e3
    return out
