"""One training step, built and run in this process: what :mod:`course_utils.measure` runs in its child processes.

:func:`build_model` builds a decoder from its config with random seeded weights, by method (full, full-bf16, LoRA,
LoRA on a 16-bit base, or QLoRA with notebook 01b's recipe); :func:`run_step` runs a warm-up step, then the timed
steps (their peak read with :func:`course_utils.peak.track_peak`), then one more, untimed step that counts the weights,
gradients, optimizer states and the activations autograd saves (each storage once). Which dtypes a step uses on a
device is :func:`_step_precision`'s decision. Isolating the process is :mod:`course_utils.measure`'s job; a step in
this process (a CUDA GPU) stops at ``timeout_s`` in its spec, checked between micro-batches (see :class:`_Deadline`).
"""
from __future__ import annotations

import functools
import tempfile
import time
from contextlib import contextmanager, nullcontext, suppress
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import torch

from course_utils.hardware import as_device, autocast_dtype, needs_loss_scaling
from course_utils.lora import add_lora
from course_utils.memory import ALL_METHODS
from course_utils.footprint import count_model_parameters
from course_utils.peak import memory_in_use, track_peak
from course_utils.quiet import import_bitsandbytes, quiet_libraries


class _Precision(NamedTuple):
    """The dtypes of a measured step, decided for its device by :mod:`course_utils.hardware`."""

    base: str  # the frozen/trained weights' dtype: "float32", or the 16-bit dtype of lora-bf16 / qlora
    autocast: str | None  # the autocast dtype, None without autocast
    loss_scaling: bool  # True when float16 does the arithmetic (GradScaler on)


def _step_precision(method: str, autocast: str | None, device: Any = None) -> _Precision:
    """Which dtypes a step of ``method`` uses on ``device``, and whether it needs loss scaling.

    The 16-bit dtype is :func:`course_utils.hardware.autocast_dtype`: bfloat16 on a CPU or an Ampere-or-newer
    GPU, float16 on a T4 (it emulates bfloat16 slowly; ``torch.cuda.is_bf16_supported()`` says True there).
    ``lora-bf16`` and ``qlora`` store (or compute) their frozen base in it. ``full-bf16`` is bfloat16 on every
    device, by its name (pure float16 training without a float32 master copy loses small updates; a T4 runs
    bfloat16 by emulation, slowly). ``autocast``: None, ``"auto"`` (that dtype) or an explicit ``"bfloat16"`` /
    ``"float16"`` for a lesson that compares dtypes on purpose.
    Loss scaling (:func:`course_utils.hardware.needs_loss_scaling`) is on when float16 does the arithmetic.
    Decides only: nothing is allocated. ``method`` and ``autocast`` were checked (and spelled out) by :func:`step_spec`.
    """
    half = str(autocast_dtype(as_device(device))).replace("torch.", "")
    base = {"lora-bf16": half, "qlora": half, "full-bf16": "bfloat16"}.get(method, "float32")
    amp = half if autocast == "auto" else autocast
    return _Precision(base, amp, needs_loss_scaling(getattr(torch, amp or base)))


# --------------------------------------------------------------------------------------------
# The step itself (runs in the child on CPU, in-process on CUDA)
# --------------------------------------------------------------------------------------------
def _storage_key(t: Any) -> tuple[int, int] | None:
    """``(data pointer, bytes)`` of the storage behind ``t``; None when it has no real memory."""
    try:
        st = t.untyped_storage()
        key = st.data_ptr(), st.nbytes()
    except Exception:  # noqa: BLE001 - tensor subclasses / fake tensors without a real storage
        return None
    return key if key[0] != 0 else None


def _unique_nbytes(tensors: Iterator[Any]) -> int:
    """The bytes of the storages behind ``tensors``, each storage once."""
    return sum(dict(key for key in map(_storage_key, tensors) if key).values())


def _tensors_of_params(model: Any) -> Iterator[Any]:
    """The parameters, their 4-bit quantization constants and the buffers (and None or other values where a
    constant is missing: :func:`_storage_key` leaves them out)."""
    for p in model.parameters():
        yield p
        quant_state = getattr(p, "quant_state", None)  # bitsandbytes 4-bit: block scales live beside the data
        for state in (quant_state, getattr(quant_state, "state2", None)):  # state2: the scales' own scales
            yield from (getattr(state, attr, None) for attr in ("absmax", "code"))
    yield from model.buffers()


def build_model(spec: Mapping[str, Any], device: Any = "cpu") -> Any:
    """The model a spec describes, random seeded weights, on ``device``, ready to train.

    The 16-bit base of ``lora-bf16`` and ``qlora`` (and QLoRA's compute dtype) is :func:`_step_precision`'s:
    bfloat16, or float16 on a T4. ``full-bf16`` is the whole model in bfloat16, every parameter trainable.
    LoRA and QLoRA get their adapters (rank ``lora_rank``, alpha twice the rank) and checkpointing from
    :func:`course_utils.lora.add_lora`, so ``qlora`` is notebook 01b's recipe: the 4-bit NF4 load, then peft's
    ``prepare_model_for_kbit_training`` (the embedding, norms and an untied output layer upcast to float32; the
    step's checkpointing, non-reentrant), then LoRA; ``kbit_preparation`` False in the spec skips the middle step.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    cfg = {**spec["config"], "use_cache": False}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(spec.get("seed", 0))
    base_dtype = getattr(torch, _step_precision(spec["method"], None, device).base)
    # dtype must be explicit: from_config otherwise follows the config's "torch_dtype" (bfloat16 for SmolLM2)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=base_dtype)
    if spec["method"] == "qlora":
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=base_dtype)
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, dtype=base_dtype,
                                                         device_map={"": str(device)})
            # from_pretrained memory-maps the safetensors file, and the tensors it does not convert (the embedding,
            # the norms) stay views of that mapping: on a CPU the file's pages would count in the resident memory
            # for as long as the model lives (0.2 GB for SmolLM2), though the step does not need them. Copy them out.
            with torch.no_grad():
                for param in model.parameters():
                    if type(param).__name__ != "Params4bit":
                        param.data = param.data.clone()
    else:
        model = model.to(device)
    if not ALL_METHODS[spec["method"]].trains_all:  # the course's LoRA / QLoRA recipe (notebook 01b)
        model = add_lora(model, spec["lora_rank"], 2 * spec["lora_rank"], spec["targets"],
                         checkpointing=bool(spec.get("checkpointing")),
                         kbit_preparation=spec.get("kbit_preparation", True))
    elif spec.get("checkpointing"):
        model.activation_checkpointing_enable() if hasattr(model, "activation_checkpointing_enable") \
            else model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _make_optimizer(spec: Mapping[str, Any], params: list[Any]) -> Any:
    """AdamW from torch, or bitsandbytes' 8-bit AdamW, over ``params``."""
    if spec["optimizer"] != "adamw8bit":
        return torch.optim.AdamW(params, lr=1e-4)
    bnb = import_bitsandbytes()
    device = params[0].device if params else "cpu"
    if bnb is None:
        raise RuntimeError("optimizer='adamw8bit' needs bitsandbytes, which is not installed here")
    if not adamw8bit_available(device):
        raise RuntimeError(f"optimizer='adamw8bit': bitsandbytes {getattr(bnb, '__version__', '?')} has no 8-bit "
                           f"AdamW for the {torch.device(device).type.upper()} (on a CPU it needs 0.49 or newer)")
    return bnb.optim.AdamW8bit(params, lr=1e-4)


@functools.cache
def adamw8bit_available(device: Any = "cpu") -> bool:
    """Whether bitsandbytes' 8-bit AdamW can take a step on ``device`` here (tried once per device, on a
    4096-number tensor, the smallest that gets 8-bit states). bitsandbytes before 0.49 has no CPU version."""
    try:
        param = torch.nn.Parameter(torch.ones(4096, device=as_device(device)))
        param.grad = torch.ones_like(param)
        import_bitsandbytes().optim.AdamW8bit([param], lr=1e-3).step()
    except Exception:  # noqa: BLE001 - no bitsandbytes, or no backend for this device in this bitsandbytes
        return False
    return bool(torch.isfinite(param).all()) and bool((param < 1).all())


def _is_checkpointed_layer(module: Any) -> bool:
    """True for a decoder layer whose activations are recomputed in backward (checkpointing switched on).

    transformers (4.57, the course's floor, and newer) marks such layers with
    ``transformers.modeling_layers.GradientCheckpointingLayer``.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    return isinstance(module, GradientCheckpointingLayer) and bool(getattr(module, "gradient_checkpointing", False))


@contextmanager
def _count_saved_tensors(exclude: set[int], layers: Sequence[Any] = ()) -> Iterator[dict[int, int]]:
    """Record the storages autograd saves for backward, ``{data pointer: bytes}``, those in ``exclude`` (data
    pointers) left out; and the input each of ``layers`` (checkpointed layers) keeps."""
    seen: dict[int, int] = {}

    def note(t: Any) -> Any:
        key = _storage_key(t)
        if key is not None and key[0] not in exclude:
            seen[key[0]] = key[1]
        return t

    def pre_hook(_module: Any, args: tuple, kwargs: dict) -> None:
        if torch.is_grad_enabled():  # the layer's input (None, or anything without a storage, is left out by note)
            note(args[0] if args else kwargs.get("hidden_states"))

    handles = [layer.register_forward_pre_hook(pre_hook, with_kwargs=True) for layer in layers]
    try:
        with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
            yield seen
    finally:
        for h in handles:
            h.remove()


#: The SDPA backend a step can force (``attention`` in its spec): "auto" lets PyTorch choose.
ATTENTION_CHOICES = ("auto", "math")


def _attention_context(attention: str | None) -> Any:
    """``torch.nn.attention.sdpa_kernel`` forcing ``attention`` ("math"), or a no-op for "auto" (PyTorch chooses)."""
    if attention in (None, "auto"):
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


@contextmanager
def _record_attention_backends() -> Iterator[set[str]]:
    """Record which SDPA backend PyTorch picks for each attention call meanwhile ("flash", "efficient", "cudnn",
    "math"), asking its own dispatcher (``torch._fused_sdp_choice``) with the very arguments of the call."""
    from torch.nn.attention import SDPBackend
    from torch.overrides import TorchFunctionMode

    names = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
             "MATH": "math"}
    seen: set[str] = set()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    class _Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa and hasattr(torch, "_fused_sdp_choice"):
                with suppress(Exception):  # an older torch without enable_gqa: not recorded
                    choice = SDPBackend(torch._fused_sdp_choice(*_as_autocast(args), **kwargs)).name
                    seen.add(names.get(choice, choice.lower()))
            return func(*args, **kwargs)

    with _Spy():
        yield seen


def _as_autocast(args: Sequence[Any]) -> list[Any]:
    """SDPA's arguments as autocast hands them to the kernel: floating tensors in the autocast dtype, where it is on."""
    if not args or not isinstance(args[0], torch.Tensor):
        return list(args)
    kind = args[0].device.type
    if not torch.is_autocast_enabled(kind):
        return list(args)
    low = torch.get_autocast_dtype(kind)
    return [a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def saved_for_backward(fn: Callable[[], Any], exclude: Iterable[Any] = ()) -> tuple[Any, int]:
    """Run ``fn()`` (a forward pass) and count the bytes autograd saves for backward meanwhile: each storage
    once, leaving out storages shared with ``exclude`` (a model's parameters, held anyway). Works for eager and
    ``torch.compile``'d code alike. Returns ``(fn's result, bytes)``; call backward on the result to free them."""
    with _count_saved_tensors({key[0] for key in map(_storage_key, exclude) if key}) as seen:
        result = fn()
    return result, sum(seen.values())


#: What a step past its ``timeout_s`` reports (a TimeoutError), formatted with the seconds.
_TIMEOUT_MESSAGE = "the measured step did not finish within timeout_s={:g} s"


def run_step(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Build the model, warm up one step, time ``steps`` steps (their peak), then count the saved activations, the
    gradients and the SDPA backend in one more step, untimed and outside the peak (the hooks cost time); return a
    :class:`StepMeasurement` dict. ``timeout_s`` in the spec (None or absent: no limit) bounds the whole call, checked
    between micro-batches: TimeoutError past it."""
    with quiet_libraries():
        # peft, where installed, is imported before the baseline is read whatever the method, so that every method's
        # baseline holds the same libraries; without peft, full tuning still runs (LoRA and QLoRA fail in build_model)
        with suppress(ImportError):
            import peft  # noqa: F401 - imported for its memory, see above

        dev = as_device(spec.get("device"))
        deadline = _Deadline(spec.get("timeout_s"), dev)
        if dev.type == "cuda":
            _warm_up_cuda(str(dev))
        baseline = memory_in_use(dev)
        step = _Step(spec, build_model(spec, dev), dev, deadline)
        with track_peak(dev) as warm_up:  # optimizer states, lazy allocations, compilation
            step.run(count=False)
        with track_peak(dev) as peak:
            for _ in range(spec["steps"]):
                step.run(count=False)
        step.run(count=True)
        return _result(spec, step, peak, baseline=baseline, first=warm_up.seconds)


@functools.cache
def _warm_up_cuda(device: str) -> None:
    """Once per process and GPU, before the first baseline is read: a float32 and a 16-bit matmul with their backward,
    so that what no estimate counts (the CUDA context, cuBLAS's handle and workspace) exists before anything is."""
    dev = torch.device(device)
    for dtype in (torch.float32, autocast_dtype(dev)):
        a = torch.ones(64, 64, device=dev, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()
    torch.cuda.synchronize(dev)


class _Deadline:
    """The time limit of a step in this process. A CUDA kernel cannot be interrupted: the limit is checked between
    micro-batches, after waiting for the GPU (CUDA runs ahead of Python), so one long micro-batch overshoots it by
    its own length. A child process (CPU, torch.compile) is stopped from outside instead (see
    :mod:`course_utils.measure`)."""

    def __init__(self, timeout_s: float | None, dev: Any) -> None:
        self.timeout_s, self.dev = timeout_s, dev
        self.end = None if timeout_s is None else time.monotonic() + float(timeout_s)

    def check(self) -> None:
        """TimeoutError once the limit is past."""
        if self.end is None:
            return
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        if time.monotonic() > self.end:
            raise TimeoutError(_TIMEOUT_MESSAGE.format(self.timeout_s) + " (checked between micro-batches: a running "
                               "CUDA kernel cannot be interrupted)")


class _Step:
    """One training step of ``model`` as the spec says: micro-batches, autocast, loss scaling, optimizer."""

    def __init__(self, spec: Mapping[str, Any], model: Any, dev: Any, deadline: _Deadline | None = None) -> None:
        self.spec, self.model, self.dev = spec, model, dev
        self.deadline = deadline or _Deadline(None, dev)
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _make_optimizer(spec, self.trained)
        self.precision = _step_precision(spec["method"], spec.get("autocast"), dev)
        # autocast needs a valid dtype even when it is off: the device's own 16-bit one
        self.amp_dtype = getattr(torch, self.precision.autocast) if self.precision.autocast else autocast_dtype(dev)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.precision.loss_scaling)  # float16 needs it
        self.forward = torch.compile(model) if spec.get("compile") else model
        gen = torch.Generator().manual_seed(spec.get("seed", 0) + 1)
        vocab = int(spec["config"]["vocab_size"])
        self.micro_batches = [torch.randint(0, vocab, (spec["batch"], spec["seq"]), generator=gen).to(dev)
                              for _ in range(spec["accumulation"])]
        self.checkpointed = [m for m in model.modules() if _is_checkpointed_layer(m)]
        self.counts: dict[str, int] = {}
        self.attention_backends: list[str] = []  # the SDPA backends the counting step ran (_record_attention_backends)

    def run(self, count: bool) -> None:
        """One optimizer step over every micro-batch; with ``count``, count the saved activations and gradients."""
        for i, ids in enumerate(self.micro_batches):
            self.deadline.check()
            counting = count and i == 0
            # the parameters' storages as they are now: a 4-bit layer's bias moves to a new one at its first forward
            params = {key[0] for key in map(_storage_key, _tensors_of_params(self.model)) if key} if counting else set()
            record = counting and not self.spec.get("compile")  # a mode under torch.compile changes what compiles
            with (
                _attention_context(self.spec.get("attention")),
                _count_saved_tensors(params, self.checkpointed) if counting else nullcontext({}) as seen,
                _record_attention_backends() if record else nullcontext(set()) as backends,
            ):
                with torch.autocast(self.dev.type, dtype=self.amp_dtype, enabled=self.precision.autocast is not None):
                    loss = self.forward(input_ids=ids, labels=ids).loss / self.spec["accumulation"]
                self.scaler.scale(loss).backward()
            if counting:
                self.counts["saved"] = sum(seen.values())
                self.attention_backends = sorted(backends)
        if count:
            self.counts["grads"] = _unique_nbytes(p.grad for p in self.trained if p.grad is not None)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


def _result(spec: Mapping[str, Any], step: _Step, peak: Any, *, baseline: int, first: float) -> dict[str, Any]:
    """The plain-JSON :class:`StepMeasurement` of a measured step (``peak``: the :class:`~course_utils.peak.WorkPeak`
    of the measured steps; ``first``: the warm-up step's seconds)."""
    per_step = peak.seconds / spec["steps"]
    if step.dev.type == "cuda":  # this process: count the step's own bytes, above what was allocated before it
        before = int(baseline)
        what = (f"{peak.what}; counted above the {before:,} bytes already allocated in this process before the "
                "model was built")
    else:  # a fresh child process: its baseline is its own
        before = 0
        what = (peak.what.replace("this process", "a fresh child process") + "; includes the child's baseline "
                "(Python, torch, transformers); MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave the resident set")
    return {
        "steps": spec["steps"], "baseline_bytes": int(baseline) - before, "grads_bytes": step.counts.get("grads", 0),
        "peak_bytes": max(0, int(peak.bytes) - before), "start_bytes": max(0, int(peak.start_bytes) - before),
        "weights_bytes": _unique_nbytes(_tensors_of_params(step.model)), "first_step_seconds": first,
        # the optimizer's states (a step count that is a number, not a tensor, is left out by _storage_key)
        "optimizer_bytes": _unique_nbytes(v for state in step.optimizer.state.values() for v in state.values()),
        "saved_activations_bytes": step.counts.get("saved", 0), "step_seconds": per_step, "device": str(step.dev),
        "what": what, "autocast": step.precision.autocast, "reserved_bytes": peak.reserved_bytes,
        # tied parameters count once, bitsandbytes' packed 4-bit ones at their true size (2 numbers per byte)
        "total_params": count_model_parameters(step.model), "trained_params": sum(p.numel() for p in step.trained),
        "compile_seconds": max(0.0, first - per_step) if spec.get("compile") else None,
        "extra": {"base_dtype": step.precision.base, "loss_scaling": step.precision.loss_scaling,
                  "attention": ",".join(step.attention_backends) or "unknown"},
    }
