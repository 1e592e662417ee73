"""Predict the peak memory of a whole training step of a decoder language model, from its ``config.json``.

The lesson's estimator (:mod:`course_utils.memory`) counts weights, gradients and AdamW states. A real step
also keeps the **activations autograd saves for backward**, briefly needs **transient buffers** (the
gradient of the vocabulary-sized logits, the optimizer's scratch space), and runs inside a **framework**
that already holds memory before the model exists. This module adds all of them.

Where the formulas start: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), count the activation memory of one GPT layer in 16-bit training as
``s·b·h·(34 + 5·a·s/h)`` bytes: 11·sbh + 5·as²b for attention (with the s×s score, softmax and dropout
tensors), 19·sbh for the GeLU MLP (4h wide), 4·sbh for two LayerNorms; full recomputation (checkpointing)
keeps only the layer input, 2·sbh. We start there and depart where today's models and kernels differ,
by reading what autograd actually keeps (each op saves what its backward formula needs, and only when a
gradient must flow through it):

* **SDPA (fused attention) keeps no s×s tensor**: it saves Q, K, V, the output and one log-sum-exp number
  per head and token, and recomputes the scores in backward. The 5·as²b term disappears.
* **Grouped-query attention**: K and V are ``kv_heads·head_dim`` wide, not ``h``.
* **SwiGLU MLP** (``down(silu(gate(x)) * up(x))``, width ``i``): the gate output, its SiLU and the up
  output (3·i) plus, when the down weight trains, its input (1·i). No dropout, so no masks.
* **RMSNorm** saves its float32 input and one 1/rms number per token, plus its normalized output only when
  its own weight trains.
* **Frozen weights need no saved inputs** (LoRA, QLoRA): a linear layer keeps its input only when its
  weight trains. LoRA adapters keep their (shared) input and a rank-``r`` intermediate.
* **The logits and the loss**: transformers computes the cross-entropy in float32 over the whole
  vocabulary, and its log-softmax output (b·s·V·4 bytes) is saved; at the start of backward two more
  tensors of that size exist at once (the loss's gradient and the logits' gradient). For SmolLM2 at
  batch 8 × 128 tokens that is 0.2 GB each - more than all 30 layers' attention.
* **Precision**: float32 training saves 4 bytes per number. bfloat16 autocast saves 2-byte copies - of each
  linear layer's input (one copy per call), and of every weight on the gradient's path (a bfloat16 copy of
  the weight, 2 bytes per parameter, kept until backward): on a small model at a small batch, autocast can
  *raise* the peak.
* **Checkpointing** keeps each layer's input (b·s·h numbers), and recomputes one layer at a time.
* **Pure bfloat16 full tuning** (``full-bf16``): the weights, their gradients and torch AdamW's two states
  are all bfloat16 (2 + 2 + 4 bytes per parameter, no float32 master copy); the activations are 16-bit too,
  except what RMSNorm and the loss compute in float32 (their float32 tensors are counted as above).

The step's peak is then the largest of a few moments (all on top of baseline + weights + optimizer
states): the start of backward (saved activations + 2 logit-sized buffers), the head's backward (its weight
gradient), the end of backward (the embedding's dense gradient; a tied embedding briefly needs three
vocabulary x hidden float32 tensors), the optimizer step (all gradients + the optimizer's scratch), and with
checkpointing, the recomputation of the top layer. :func:`estimate_step` returns the breakdown of the
winning moment. Tests check the activation count against ``torch.autograd.graph.saved_tensors_hooks`` on
small configs: it is exact, not fitted.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from course_utils import checks
from course_utils.architecture import DEFAULT_TARGETS, Architecture, Config, normalize_targets
from course_utils.memory import ALL_METHODS, MAX_LORA_RANK, OPTIMIZERS
from course_utils.units import GB

#: Resident memory of the measuring child process after ``import torch, transformers, peft, bitsandbytes``
#: on this course's CPU setup (torch 2.13 CPU, transformers 5.24, Python 3.11), measured: 0.43-0.45 GB.
CPU_BASELINE_BYTES = 440_000_000
#: What the same process holds after its first training step besides tensors - the machine code of the kernels
#: that step loaded, thread pools, allocator caches: 30-62 MB measured on CPU (scripts/memory_sweep.py).
CPU_RUNTIME_BYTES = 45_000_000
#: On CUDA the allocator counter starts at 0; the CUDA context (0.3-0.6 GB) lives outside it.
CUDA_BASELINE_BYTES = 0
#: bitsandbytes NF4: 4 bits per number + one float32 scale per block of 64 numbers ...
NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
#: ... + the 16-value NF4 code book (float32) that each quantized tensor carries.
NF4_CODE_BYTES = 16 * 4
#: bitsandbytes 8-bit optimizers keep float32 states for tensors smaller than this.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256
#: The largest batch and sequence length a step estimate accepts (the sequence is also bounded by the config).
MAX_BATCH = 1_000_000
MAX_SEQ = 10_000_000


# --------------------------------------------------------------------------------------------
# What autograd saves: a symbolic walk through one forward pass
# --------------------------------------------------------------------------------------------
@dataclass
class _T:
    """A symbolic activation: ``width`` numbers per token of ``nbytes`` each; ``rg``: requires grad."""

    key: int
    width: int
    nbytes: int
    rg: bool


class _Tape:
    """Records the tensors autograd would save, by identity (a tensor saved twice counts once)."""

    _ids = itertools.count(1)  # shared by all tapes: a tensor made on one tape may be saved on another

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.saved: dict[Any, tuple[str, int]] = {}

    def new(self, width: int, nbytes: int, rg: bool) -> _T:
        return _T(next(self._ids), width, nbytes, rg)

    def save(self, t: _T, what: str) -> None:
        self.saved[t.key] = (what, self.tokens * t.width * t.nbytes)

    def save_const(self, key: str, nbytes: int, what: str) -> None:
        self.saved[key] = (what, nbytes)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.saved.values())

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for what, b in self.saved.values():
            out[what] = out.get(what, 0) + b
        return out


@dataclass(frozen=True)
class _Plan:
    arch: Architecture
    batch: int
    seq: int
    method: str
    rank: int
    targets: tuple[str, ...]
    autocast: bool
    checkpointing: bool

    @property
    def full(self) -> bool:  # every weight trains
        return ALL_METHODS[self.method].trains_all

    @property
    def model_bytes(self) -> int:  # bytes of the hidden states / non-quantized weights
        return model_dtype_bytes(self.method)


def model_dtype_bytes(method: str) -> int:
    """Bytes per number of the model's hidden states and non-quantized weights: 2 for 16-bit bases, else 4."""
    return 2 if method in ("lora-bf16", "qlora", "full-bf16") else 4


def trained_dtype_bytes(method: str) -> int:
    """Bytes per trained number (its gradient and each AdamW state alike): 2 for ``full-bf16``, else 4."""
    return int(ALL_METHODS[method].trained_bytes)


class _Walk:
    """Walk a Llama-family forward pass and record what autograd saves (see the module doc)."""

    def __init__(self, plan: _Plan, tape: _Tape) -> None:
        self.p, self.tape = plan, tape

    def linear(self, x: _T, fan_in: int, fan_out: int, name: str, lora: bool, trainable: bool) -> _T:
        p, tape = self.p, self.tape
        xc = x
        if p.autocast and x.nbytes != 2:  # autocast casts the input for every call (no cache for activations)
            xc = tape.new(fan_in, 2, x.rg)
        if p.autocast and p.model_bytes == 4 and xc.rg:  # the bfloat16 weight copy, kept for the input's gradient
            tape.save_const(f"{name}.weight_bf16", fan_in * fan_out * 2, "bf16 weight copies (autocast)")
        if trainable:
            tape.save(xc, "linear inputs (trained weights)")
        out_bytes = 2 if (p.autocast or p.model_bytes == 2) else 4
        out = tape.new(fan_out, out_bytes, x.rg or trainable)
        if lora:
            xl = x if x.nbytes == 4 else tape.new(fan_in, 4, x.rg)  # peft casts to the adapter's float32
            xa = xl
            if p.autocast:
                xa = tape.new(fan_in, 2, xl.rg)
                if xa.rg:
                    tape.save_const(f"{name}.lora_A_bf16", p.rank * fan_in * 2, "bf16 weight copies (autocast)")
                tape.save_const(f"{name}.lora_B_bf16", fan_out * p.rank * 2, "bf16 weight copies (autocast)")
            tape.save(xa, "LoRA inputs")
            a = tape.new(p.rank, 2 if p.autocast else 4, True)
            tape.save(a, "LoRA inputs")
            out = tape.new(fan_out, out_bytes, True)
        return out

    def rmsnorm(self, x: _T, width: int, groups: int, trainable: bool) -> _T:
        tape = self.tape
        h = x if x.nbytes == 4 else tape.new(width, 4, x.rg)  # .to(float32)
        if h.rg:  # pow and the multiply keep the float32 input; rsqrt keeps 1/rms
            tape.save(h, "norms")
            tape.save(tape.new(groups, 4, True), "norms")
        hn = tape.new(width, 4, h.rg)
        hnc = hn if x.nbytes == 4 else tape.new(width, x.nbytes, hn.rg)
        if trainable:
            tape.save(hnc, "norms")
        return tape.new(width, max(self.p.model_bytes, x.nbytes), hnc.rg or trainable)

    def add(self, a: _T, b: _T) -> _T:
        return self.tape.new(a.width, max(a.nbytes, b.nbytes), a.rg or b.rg)

    def _proj(self, x: _T, name: str, layer: int) -> _T:
        fan_in, fan_out = self.p.arch.projection_shapes()[name]
        return self.linear(x, fan_in, fan_out, f"L{layer}.{name}", lora=not self.p.full and name in self.p.targets,
                           trainable=self.p.full)

    def attention(self, x: _T, layer: int) -> _T:
        p, tape, a = self.p, self.tape, self.p.arch
        q, k, v = (self._proj(x, n, layer) for n in ("q_proj", "k_proj", "v_proj"))
        if a.qk_norm:
            q = self.rmsnorm(q, a.q_width, a.heads, p.full)
            k = self.rmsnorm(k, a.kv_width, a.kv_heads, p.full)
        rope_bytes = p.model_bytes
        if q.rg or k.rg:  # q*cos and rotate_half(q)*sin keep cos and sin (shared by all layers)
            for key in ("cos", "sin"):
                tape.save_const(key, p.seq * a.head_dim * rope_bytes, "rotary cos/sin")
        qe = tape.new(a.q_width, max(q.nbytes, rope_bytes), q.rg)
        ke = tape.new(a.kv_width, max(k.nbytes, rope_bytes), k.rg)
        if p.autocast:  # SDPA runs in bfloat16: float32 inputs are cast (new tensors)
            qe = qe if qe.nbytes == 2 else tape.new(qe.width, 2, qe.rg)
            ke = ke if ke.nbytes == 2 else tape.new(ke.width, 2, ke.rg)
            v = v if v.nbytes == 2 else tape.new(v.width, 2, v.rg)
        any_rg = qe.rg or ke.rg or v.rg
        out = tape.new(a.q_width, qe.nbytes, any_rg)
        if any_rg:  # fused attention keeps q, k, v, its output and a log-sum-exp per head: no s x s matrix
            for t in (qe, ke, v, out):
                tape.save(t, "attention (q, k, v, output)")
            tape.save(tape.new(a.heads, 4, False), "attention (q, k, v, output)")
        return self._proj(out, "o_proj", layer)

    def mlp(self, x: _T, layer: int) -> _T:
        tape = self.tape
        g, u = self._proj(x, "gate_proj", layer), self._proj(x, "up_proj", layer)
        if g.rg:
            tape.save(g, "MLP (SwiGLU)")
        s = tape.new(g.width, g.nbytes, g.rg)
        if s.rg:
            tape.save(u, "MLP (SwiGLU)")
        if u.rg:
            tape.save(s, "MLP (SwiGLU)")
        prod = tape.new(g.width, max(s.nbytes, u.nbytes), s.rg or u.rg)
        return self._proj(prod, "down_proj", layer)

    def layer(self, x: _T, i: int) -> _T:
        a = self.p.arch
        h1 = self.rmsnorm(x, a.hidden, 1, self.p.full)
        x2 = self.add(x, self.attention(h1, i))
        h2 = self.rmsnorm(x2, a.hidden, 1, self.p.full)
        return self.add(x2, self.mlp(h2, i))


@dataclass
class Activations:
    """What the forward pass leaves for backward, in bytes."""

    total: int
    by_kind: dict[str, int]
    per_layer: int  # the last layer's saved bytes (what checkpointing recomputes at a time)
    logits_bytes: int  # B*S*V in the logits' own dtype
    logits_fp32_bytes: int  # B*S*V*4: the loss path's tensors
    logits_rg: bool
    lm_head_trainable: bool


def saved_activations(arch: Architecture, batch: int, seq: int, *, method: str = "lora", lora_rank: int = 8,
                      targets: Sequence[str] = ("q_proj", "v_proj"), autocast: bool = False,
                      checkpointing: bool = False) -> Activations:
    """Bytes autograd keeps for backward after the forward pass of one micro-batch (exact for Llama-family).

    Counted like ``saved_tensors_hooks`` sees them (each storage once, parameters excluded); with
    checkpointing, each checkpointed layer keeps its input instead of its insides.
    """
    plan = _Plan(arch, batch, seq, method, lora_rank, tuple(targets), bool(autocast), bool(checkpointing))
    tokens = batch * seq
    tape = _Tape(tokens)
    walk = _Walk(plan, tape)
    mb = plan.model_bytes
    if plan.full:
        tape.save_const("input_ids", tokens * 8, "token ids and labels")
    # with checkpointing, PEFT models make the embedding output require grad (enable_input_require_grads)
    x = tape.new(arch.hidden, mb, plan.full or (checkpointing and not plan.full))
    per_layer = 0  # the last layer's saved bytes (layers after the first are alike; the first also saves cos/sin)
    for i in range(arch.layers):
        if checkpointing:
            tape.save(x, "checkpointed layer inputs")
            sub = _Tape(tokens)
            x = _Walk(plan, sub).layer(x, i)
            per_layer = sub.total
        else:
            before = tape.total
            x = walk.layer(x, i)
            per_layer = tape.total - before
    xf = walk.rmsnorm(x, arch.hidden, 1, plan.full)
    lm_trainable = plan.full
    logits = walk.linear(xf, arch.hidden, arch.vocab, "lm_head", lora=False, trainable=lm_trainable)
    if logits.rg:  # log_softmax keeps its float32 output; nll_loss keeps the labels and a scalar
        tape.save(tape.new(arch.vocab, 4, True), "logits path (log-softmax, float32)")
        tape.save_const("labels", tokens * 8, "token ids and labels")
        tape.save_const("total_weight", 4, "token ids and labels")
    return Activations(total=tape.total, by_kind=tape.by_kind(), per_layer=per_layer,
                       logits_bytes=tokens * arch.vocab * logits.nbytes, logits_fp32_bytes=tokens * arch.vocab * 4,
                       logits_rg=logits.rg, lm_head_trainable=lm_trainable)


# --------------------------------------------------------------------------------------------
# The whole step
# --------------------------------------------------------------------------------------------
@dataclass
class StepEstimate:
    """The predicted peak of a training step, with the parts that make it up at the peak moment."""

    arch: Architecture
    method: str
    batch: int
    seq: int
    lora_rank: int
    targets: tuple[str, ...]
    checkpointing: bool
    optimizer: str
    autocast: bool
    accumulation: int
    device: str
    baseline_bytes: int
    runtime_bytes: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations: Activations
    trained_params: int
    moments: dict[str, dict[str, int]] = field(default_factory=dict)  # moment -> parts on top of the fixed ones
    peak_moment: str = ""

    @property
    def fixed_bytes(self) -> int:
        """Memory held for the whole step: baseline, runtime, weights, optimizer states."""
        return self.baseline_bytes + self.runtime_bytes + self.weights_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        return self.fixed_bytes + sum(self.moments[self.peak_moment].values())

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GB

    def parts(self) -> list[tuple[str, int]]:
        """(label, bytes) of everything in memory at the peak moment, in print order."""
        out = [("framework baseline" + (" (CPU process after imports)" if self.device == "cpu"
                                        else " (allocator counter; CUDA context not counted)"), self.baseline_bytes),
               *([("framework runtime after a first step (kernels, threads)", self.runtime_bytes)]
                 if self.runtime_bytes else []),
               (f"weights ({_weights_label(self.method)})", self.weights_bytes),
               (f"optimizer states ({self._optimizer_words} per trained number)", self.optimizer_bytes)]
        out += list(self.moments[self.peak_moment].items())
        return out

    @property
    def _optimizer_words(self) -> str:
        """'8-bit AdamW', or 'AdamW, 8 bytes' (torch AdamW's two states take the trained tensor's dtype)."""
        if self.optimizer == "adamw8bit":
            return "8-bit AdamW"
        return f"AdamW, {2 * trained_dtype_bytes(self.method)} bytes"

    def categories(self) -> dict[str, int]:
        """The peak in five parts, for a stacked bar: weights, gradients, optimizer, activations, overhead.

        "optimizer" is the states plus the update's scratch space; "activations" what backward needs from the
        forward pass (saved, or recomputed with checkpointing); "overhead" the framework baseline and the
        transient buffers of backward (the loss's and logits' gradients).
        """
        out = {"weights": self.weights_bytes, "gradients": 0, "optimizer": self.optimizer_bytes,
               "activations": 0, "overhead": self.baseline_bytes + self.runtime_bytes}
        for label, nbytes in self.moments[self.peak_moment].items():
            out[_category(label)] += nbytes
        return out

    def describe(self) -> str:
        meth = ALL_METHODS[self.method]
        what = (f"{self.arch.name}, {meth.label}"
                + ("" if meth.trains_all else f" (rank {self.lora_rank} on {', '.join(self.targets)})")
                + f", batch {self.batch} x {self.seq} tokens"
                + (f" x {self.accumulation} micro-batches" if self.accumulation > 1 else "")
                + f", {'8-bit AdamW' if self.optimizer == 'adamw8bit' else 'AdamW'}"
                + (", gradient checkpointing" if self.checkpointing else "")
                + (", bf16 autocast" if self.autocast else ""))
        return what

    def format(self) -> str:
        """The breakdown as text: one line per part, then the total."""
        lines = [f"Training-step estimate: {self.describe()} ({self.device})",
                 f"peak moment: {self.peak_moment}"]
        for label, b in self.parts():
            lines.append(f"  {label:<58} {b / GB:7.2f} GB")
        lines.append(f"  {'total (predicted peak)':<58} {self.peak_gb:7.2f} GB")
        return "\n".join(lines)


#: The parts of a step's peak, in the order a stacked bar draws them (see :meth:`StepEstimate.categories`).
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "overhead")


def _category(label: str) -> str:
    """The category of a part of a peak moment, by its label."""
    if "activations" in label:
        return "activations"
    if "optimizer" in label:
        return "optimizer"
    if "gradient" in label and "logits" not in label and "loss" not in label and "hidden states" not in label:
        return "gradients"
    return "overhead"


def _weights_label(method: str) -> str:
    return {"full": "float32", "full-bf16": "bfloat16", "lora": "float32 base + adapters",
            "lora-bf16": "bfloat16 base + float32 adapters",
            "qlora": "NF4 base, bfloat16 embedding/norms + float32 adapters"}[method]


def _optimizer_state_bytes(sizes: Iterable[int], optimizer: str, state_bytes: int = 4) -> int:
    """AdamW's states: torch keeps two of ``state_bytes`` (the parameter's dtype); bitsandbytes two 8-bit ones."""
    total = 0
    for n in sizes:
        if optimizer == "adamw":
            total += 2 * state_bytes * n + 4  # exp_avg, exp_avg_sq and a float32 step counter
        elif n < BNB_MIN_8BIT_SIZE:
            total += 8 * n + 4  # bitsandbytes keeps float32 states for small tensors, whatever their dtype
        else:
            total += 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK) + 4  # two uint8 states + block scales
    return total


def _optimizer_scratch_bytes(sizes: Sequence[int], optimizer: str, device: str, state_bytes: int = 4) -> int:
    """Temporary memory of one optimizer step, read from the implementations.

    torch AdamW on CPU (for-loop): ``exp_avg_sq.sqrt() / bias_correction`` makes two temporaries the size
    of the parameter being updated. On CUDA (foreach): one temporary per trained number (the list of
    square roots). Both in the states' dtype (``state_bytes``: 2 for bfloat16 parameters). bitsandbytes 8-bit on
    CPU: both states dequantized to float32, a float32 gradient copy and the two denominator temporaries
    (5 x 4 bytes x the largest tensor); on CUDA a fused kernel (0).
    """
    if not sizes:
        return 0
    largest = max(sizes)
    if optimizer == "adamw":
        return state_bytes * sum(sizes) if device == "cuda" else 2 * state_bytes * largest
    return 0 if device == "cuda" else 5 * 4 * largest


def estimate_device_for(device: Any = None) -> str:
    """The counter an estimate must predict to be compared with a measurement on ``device``.

    ``"cuda"`` (PyTorch's allocator counter, no process baseline) for a CUDA device; ``"cpu"`` (the peak
    resident memory of a process, baseline included) for anything else, because :mod:`course_utils.measure`
    reads the process's memory there. ``device`` None means :func:`course_utils.hardware.pick_device`: the
    device a measurement with ``device=None`` uses, so estimate and measurement always agree.
    """
    from course_utils.hardware import as_device

    return "cuda" if as_device(device).type == "cuda" else "cpu"


def _device_kind(device: Any) -> str:
    if type(device).__name__ == "device" and getattr(device, "type", None) in ("cpu", "cuda"):
        device = device.type  # a torch.device
    return checks.choice(device, "device", ("cpu", "cuda"))


def weights_bytes(arch: Architecture, method: str, adapter_sizes: Sequence[int]) -> int:
    """Bytes of the model's weights for ``method``: the base in its dtype, float32 adapters, rotary buffers."""
    if method != "qlora":
        base = model_dtype_bytes(method) * arch.params
    else:  # qlora: the layers' linear weights in NF4, the rest (embedding, norms) in bfloat16
        base = sum(round(NF4_BYTES_PER_PARAM * n) + NF4_CODE_BYTES if is_linear else 2 * n
                   for _, n, is_linear in arch.param_tensors())
    rotary_buffers = 2 * (arch.head_dim // 2) * 4  # inv_freq and its original copy, float32
    return base + 4 * sum(adapter_sizes) + rotary_buffers


def _backward_moments(arch: Architecture, acts: Activations, *, method: str, batch: int, seq: int,
                      checkpointing: bool, autocast: bool, grads: int, held_grads: int) -> dict[str, dict[str, int]]:
    """The candidate peak moments of backward, each as its parts on top of baseline + weights + optimizer states.

    A gradient has its weight's dtype: 4 bytes per number, 2 for ``full-bf16``.
    """
    saved = acts.total
    saved_before_loss = acts.total - acts.logits_fp32_bytes  # the log-softmax output is freed first
    kept = {"gradients kept across micro-batches": held_grads} if held_grads else {}
    head = arch.vocab * arch.hidden
    gb = trained_dtype_bytes(method)
    head_grad = {"output-layer weight gradient": gb * head} if acts.lm_head_trainable else {}
    moments: dict[str, dict[str, int]] = {}
    if acts.logits_rg:
        moments["start of backward (loss gradient over the vocabulary)"] = {
            "activations saved for backward": saved,
            "loss-path buffers in backward (2 x float32 logits)": 2 * acts.logits_fp32_bytes, **kept}
    if acts.lm_head_trainable:
        moments["head backward (its weight gradient)"] = {
            "activations saved for backward": saved_before_loss,
            "logits gradient": acts.logits_bytes,
            "output-layer weight gradient": gb * head + (2 * head if autocast and gb == 4 else 0), **kept}
    if checkpointing:
        moments["backward of the top layer (recomputed)"] = {
            "activations saved for backward": saved_before_loss,
            "one layer's recomputed activations": acts.per_layer,
            "gradient of the hidden states": batch * seq * arch.hidden * gb, **head_grad, **kept}
    if ALL_METHODS[method].trains_all:
        moments["end of backward (embedding gradient)"] = _embedding_gradient_moment(arch, grads, held_grads, gb)
    return moments


def _embedding_gradient_moment(arch: Architecture, grads: int, held_grads: int, grad_bytes: int = 4) -> dict[str, int]:
    """Full tuning: the embedding's backward makes a dense (vocab x hidden) gradient, ``grad_bytes`` per number.

    A tied embedding gets two contributions (head and embedding): autograd holds the head's until the
    embedding's arrives, then adds them into a third tensor. With accumulation, the .grad being added to
    exists as well.
    """
    emb = grad_bytes * arch.vocab * arch.hidden
    if arch.tied:
        end = {"gradients of the other weights": grads - emb,
               "tied embedding: 2 gradient contributions and their sum": 3 * emb}
        if held_grads:
            end["embedding gradient kept across micro-batches"] = emb
        return end
    return {"gradients": grads, **({"embedding gradient (dense) before accumulation": emb} if held_grads else {})}


def estimate_step(config: Config | Architecture = "smollm2-135m", *, method: str = "lora",
                  batch: int = 8, seq: int = 128, lora_rank: int = 8,
                  targets: str | Sequence[str] = DEFAULT_TARGETS, checkpointing: bool = False,
                  optimizer: str = "adamw", autocast: bool = False, accumulation: int = 1, device: Any = "cpu",
                  baseline_bytes: int | None = None) -> StepEstimate:
    """Predict the peak memory of one training step (steady state: the optimizer states already exist).

    Same arguments as :func:`course_utils.measure.measure_training_step`. ``device``: ``"cpu"`` (peak
    resident memory of a process, baseline = the imports) or ``"cuda"`` (PyTorch's allocator counter,
    baseline 0); a ``torch.device`` of either type is accepted too. To compare with a measurement, pass
    :func:`estimate_device_for` of the measured device. ``baseline_bytes`` overrides the framework baseline.
    """
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    checks.choice(method, "method", ALL_METHODS)
    checks.choice(optimizer, "optimizer", OPTIMIZERS)
    device = _device_kind(device)
    checks.integer(batch, "batch", 1, MAX_BATCH)
    checks.integer(seq, "seq", 1, arch.max_positions or MAX_SEQ)
    checks.integer(lora_rank, "lora_rank", 1, MAX_LORA_RANK)
    checks.integer(accumulation, "accumulation", 1, 100_000)
    targets = normalize_targets(targets)
    if baseline_bytes is None:
        baseline_bytes = CPU_BASELINE_BYTES if device == "cpu" else CUDA_BASELINE_BYTES
    trains_all = ALL_METHODS[method].trains_all
    trained_sizes = [n for _, n, _ in arch.param_tensors()] if trains_all else arch.adapter_tensors(lora_rank, targets)
    adapter_sizes = [] if trains_all else trained_sizes
    per = trained_dtype_bytes(method)
    grads = per * sum(trained_sizes)
    acts = saved_activations(arch, batch, seq, method=method, lora_rank=lora_rank, targets=targets,
                             autocast=autocast, checkpointing=checkpointing)
    moments = _backward_moments(arch, acts, method=method, batch=batch, seq=seq, checkpointing=checkpointing,
                                autocast=autocast, grads=grads, held_grads=grads if accumulation > 1 else 0)
    scratch = _optimizer_scratch_bytes(trained_sizes, optimizer, device, per)
    moments["optimizer step"] = {"gradients": grads, **({"optimizer scratch": scratch} if scratch else {})}
    peak = max(moments, key=lambda k: sum(moments[k].values()))
    return StepEstimate(arch=arch, method=method, batch=batch, seq=seq, lora_rank=lora_rank, targets=targets,
                        checkpointing=bool(checkpointing), optimizer=optimizer, autocast=bool(autocast),
                        accumulation=accumulation, device=device, baseline_bytes=int(baseline_bytes),
                        runtime_bytes=CPU_RUNTIME_BYTES if device == "cpu" else 0,
                        weights_bytes=weights_bytes(arch, method, adapter_sizes), grads_bytes=grads,
                        optimizer_bytes=_optimizer_state_bytes(trained_sizes, optimizer, per),
                        activations=acts, trained_params=sum(trained_sizes), moments=moments, peak_moment=peak)


def korthikanti_layer_bytes(arch: Architecture, batch: int, seq: int) -> dict[str, float]:
    """Korthikanti et al. (2022)'s per-layer activation bytes (16-bit, dropout, no recomputation), for comparison.

    ``sbh(34 + 5as/h)``: with full recomputation ``2sbh``. Returns both, and ``34sbh`` (selective recomputation).
    """
    sbh = seq * batch * arch.hidden
    return {"no recomputation": sbh * (34 + 5 * arch.heads * seq / arch.hidden),
            "selective recomputation": 34 * sbh, "full recomputation": 2 * sbh}


# --------------------------------------------------------------------------------------------
# Estimate vs measured
# --------------------------------------------------------------------------------------------
def error_percent(estimate_bytes: float, measured_bytes: float) -> float:
    """(estimate - measured) / measured, in percent."""
    if measured_bytes <= 0:
        raise ValueError(f"measured_bytes must be positive, got {measured_bytes}")
    return 100.0 * (estimate_bytes - measured_bytes) / measured_bytes


def comparison_line(estimate_bytes: float, measured_bytes: float) -> str:
    """The CLI's last line: ``estimate X GB, measured Y GB, error Z %``."""
    return (f"estimate {estimate_bytes / GB:.2f} GB, measured {measured_bytes / GB:.2f} GB, "
            f"error {error_percent(estimate_bytes, measured_bytes):+.1f} %")
