"""One training step, run in this process: what :mod:`course_utils.measure` runs (in its child processes on a CPU).

:func:`run_step` builds the model (:func:`course_utils.step_model.build_model`), runs a warm-up step, then the timed
steps (their peak read with :func:`course_utils.peak.track_peak`), then one more, untimed step that counts the weights,
gradients, optimizer states and the activations autograd saves (each storage once), and records the attention
backend that ran. Isolating the process is :mod:`course_utils.measure`'s job; a step in this process (a CUDA GPU)
stops at ``timeout_s`` in its spec, checked between micro-batches (see :meth:`_Step._check_time`).
"""

import functools
import time
from contextlib import contextmanager, nullcontext, suppress
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from course_utils.footprint import count_model_parameters
from course_utils.hardware import as_device, autocast_dtype
from course_utils.peak import memory_in_use, track_peak
from course_utils.quiet import quiet_libraries
from course_utils.step_model import _make_optimizer, _step_precision, build_model

#: The SDPA backend a step can force (``attention`` in its spec): "auto" lets PyTorch choose.
ATTENTION_CHOICES = ("auto", "math")
#: What a step in this process past its ``timeout_s`` reports (a TimeoutError), formatted with the seconds.
_TIMEOUT = "the measured step did not finish within timeout_s={:g} s (its limit is checked between micro-batches)"
#: What a CPU step's ``what`` adds: it ran in a fresh child process (see course_utils.children).
_CHILD_WHAT = "; includes the child's baseline (Python, torch, transformers); freed tensors leave its resident set"


# --------------------------------------------------------------------------------------------
# Counting storages: the weights, the gradients, what autograd saves for backward
# --------------------------------------------------------------------------------------------
def _storage_key(t: Any) -> tuple[int, int] | None:
    """``(data pointer, bytes)`` of the storage behind ``t``; None when it has no real memory."""
    try:
        st = t.untyped_storage()
        key = st.data_ptr(), st.nbytes()
    except Exception:  # noqa: BLE001 - tensor subclasses / fake tensors without a real storage
        return None
    return key if key[0] != 0 else None


def _unique_nbytes(tensors: Iterable[Any]) -> int:
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


@contextmanager
def _count_saved_tensors(exclude: set[int]) -> Iterator[dict[int, int]]:
    """Record the storages autograd saves for backward meanwhile, ``{data pointer: bytes}``, those in ``exclude``
    (data pointers) left out. With checkpointing these are the inputs the checkpointed layers keep (checkpointing
    saves them through the same hooks) and what is saved outside those layers."""
    seen: dict[int, int] = {}

    def note(t: Any) -> Any:
        key = _storage_key(t)
        if key is not None and key[0] not in exclude:
            seen[key[0]] = key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
        yield seen


def saved_for_backward(fn: Callable[[], Any], exclude: Iterable[Any] = ()) -> tuple[Any, int]:
    """Run ``fn()`` (a forward pass) and count the bytes autograd saves for backward meanwhile: each storage
    once, leaving out storages shared with ``exclude`` (a model's parameters, held anyway). Works for eager and
    ``torch.compile``'d code alike. Returns ``(fn's result, bytes)``; call backward on the result to free them."""
    with _count_saved_tensors({key[0] for key in map(_storage_key, exclude) if key}) as seen:
        result = fn()
    return result, sum(seen.values())


# --------------------------------------------------------------------------------------------
# The attention kernel that ran
# --------------------------------------------------------------------------------------------
@contextmanager
def _record_attention_backends() -> Iterator[set[str]]:
    """Record which SDPA backend PyTorch picks for each attention call meanwhile ("flash", "efficient", "cudnn",
    "math"), asking its own dispatcher (``torch._fused_sdp_choice``) with the very arguments of the call."""
    seen: set[str] = set()

    class _Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.scaled_dot_product_attention:
                with suppress(Exception):  # a torch without _fused_sdp_choice, or one without enable_gqa: not recorded
                    choice = SDPBackend(torch._fused_sdp_choice(*_as_autocast(args), **kwargs)).name
                    seen.add(choice.lower().removesuffix("_attention"))  # flash, efficient, cudnn or math
            return func(*args, **kwargs)

    with _Spy():
        yield seen


def _as_autocast(args: Sequence[Any]) -> list[Any]:
    """SDPA's arguments as autocast hands them to the kernel: floating tensors in the autocast dtype, where it is on."""
    kind = args[0].device.type if args and isinstance(args[0], torch.Tensor) else None
    if kind is None or not torch.is_autocast_enabled(kind):
        return list(args)
    low = torch.get_autocast_dtype(kind)
    return [a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------
def import_step_libraries() -> None:
    """Import what every step needs before its baseline is read, so that every method's baseline holds the same
    libraries: transformers' model classes, and peft where installed (without it, full tuning still runs; LoRA and
    QLoRA fail in :func:`course_utils.step_model.build_model`)."""
    with quiet_libraries(), suppress(ImportError):
        from transformers import AutoModelForCausalLM  # noqa: F401 - imported for its memory, see above
        import peft  # noqa: F401 - imported for its memory, see above


def run_step(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Build the model, warm up one step, time ``steps`` steps (their peak), then count the saved activations, the
    gradients and the SDPA backend in one more step, untimed and outside the peak (the hooks cost time); return a
    :class:`~course_utils.measure.StepMeasurement` dict. ``timeout_s`` in the spec (None or absent: no limit) bounds
    the steps, once the model is built: TimeoutError past it (see :meth:`_Step._check_time`)."""
    import_step_libraries()
    with quiet_libraries():
        dev = as_device(spec.get("device"))
        if dev.type == "cuda":
            _warm_up_cuda(str(dev))
        baseline = memory_in_use(dev)
        step = _Step(spec, build_model(spec, dev), dev)
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


class _Step:
    """One training step of ``model`` as the spec says: micro-batches, autocast, loss scaling, optimizer."""

    def __init__(self, spec: Mapping[str, Any], model: Any, dev: Any) -> None:
        self.spec, self.model, self.dev = spec, model, dev
        timeout_s = spec.get("timeout_s")  # None or absent: no limit
        self.end = None if timeout_s is None else time.monotonic() + float(timeout_s)
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _make_optimizer(spec, self.trained)
        self.precision = _step_precision(spec["method"], spec.get("autocast"), dev)
        # autocast needs a valid dtype even when it is off: the device's own 16-bit one
        self.amp_dtype = getattr(torch, self.precision.autocast) if self.precision.autocast else autocast_dtype(dev)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.precision.loss_scaling)  # float16 needs it
        self.forward = torch.compile(model) if spec.get("compile") else model
        gen = torch.Generator().manual_seed(spec.get("seed", 0) + 1)
        shape, vocab = (spec["batch"], spec["seq"]), int(spec["config"]["vocab_size"])
        self.micro_batches = [
            torch.randint(0, vocab, shape, generator=gen).to(dev) for _ in range(spec["accumulation"])
        ]
        self.counts: dict[str, int] = {}
        self.attention_backends: list[str] = []  # the SDPA backends the counting step ran (_record_attention_backends)

    def _check_time(self) -> None:
        """TimeoutError once the spec's ``timeout_s`` (counted from this step's creation) is past. A CUDA kernel
        cannot be interrupted: the limit is checked between micro-batches, after waiting for the GPU (CUDA runs ahead
        of Python), so one long micro-batch overshoots it by its own length. A child process (CPU, torch.compile) is
        stopped from outside instead (see :mod:`course_utils.children`)."""
        if self.end is None:
            return
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        if time.monotonic() > self.end:
            raise TimeoutError(_TIMEOUT.format(self.spec["timeout_s"]))

    def run(self, count: bool) -> None:
        """One optimizer step over every micro-batch; with ``count``, count the saved activations and gradients."""
        for i, ids in enumerate(self.micro_batches):
            self._check_time()
            counting = count and i == 0
            # the parameters' storages as they are now: a 4-bit layer's bias moves to a new one at its first forward
            params = {key[0] for key in map(_storage_key, _tensors_of_params(self.model)) if key} if counting else set()
            record = counting and not self.spec.get("compile")  # a mode under torch.compile changes what compiles
            with (
                # "math" forces the backend that keeps the s x s scores; "auto" lets PyTorch choose
                sdpa_kernel(SDPBackend.MATH) if self.spec.get("attention") == "math" else nullcontext(),
                _count_saved_tensors(params) if counting else nullcontext({}) as seen,
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
    """The plain-JSON :class:`~course_utils.measure.StepMeasurement` of a measured step (``peak``: the
    :class:`~course_utils.peak.WorkPeak` of the measured steps; ``first``: the warm-up step's seconds)."""
    per_step, precision = peak.seconds / spec["steps"], step.precision
    backends = ",".join(step.attention_backends) or "unknown"  # the SDPA backends that ran
    if step.dev.type == "cuda":  # this process: count the step's own bytes, above what was allocated before it
        before = int(baseline)
        what = f"{peak.what}; counted above the {before:,} bytes already allocated before the model was built"
    else:  # a fresh child process: its baseline is its own
        before = 0
        what = peak.what.replace("this process", "a fresh child process") + _CHILD_WHAT
    return {
        "peak_bytes": max(0, int(peak.bytes) - before),
        "baseline_bytes": int(baseline) - before,
        "weights_bytes": _unique_nbytes(_tensors_of_params(step.model)),
        "grads_bytes": step.counts.get("grads", 0),
        # the optimizer's states (a step count that is a number, not a tensor, is left out by _storage_key)
        "optimizer_bytes": _unique_nbytes(v for state in step.optimizer.state.values() for v in state.values()),
        "saved_activations_bytes": step.counts.get("saved", 0),
        "step_seconds": per_step,
        "device": str(step.dev),
        "what": what,
        "steps": spec["steps"],
        "autocast": precision.autocast,
        # tied parameters count once, bitsandbytes' packed 4-bit ones at their true size (2 numbers per byte)
        "total_params": count_model_parameters(step.model),
        "trained_params": sum(p.numel() for p in step.trained),
        "first_step_seconds": first,
        "compile_seconds": max(0.0, first - per_step) if spec.get("compile") else None,
        "reserved_bytes": peak.reserved_bytes,
        "start_bytes": max(0, int(peak.start_bytes) - before),
        "extra": {"base_dtype": precision.base, "loss_scaling": precision.loss_scaling, "attention": backends},
    }
