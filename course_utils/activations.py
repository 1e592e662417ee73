"""What autograd saves for backward in one forward pass of a Llama-family model: a symbolic walk, tensor by tensor.

The walk follows each op of the forward pass and records what its backward formula needs, only where a gradient
must flow (the rules, and where they depart from Korthikanti et al. 2022, are in :mod:`course_utils.step_memory`'s
module doc): fused SDPA keeps Q, K, V, its output and a log-sum-exp (no s x s matrix), the math backend
(:mod:`course_utils.attention`) float32 copies of the scaled Q and K, of V and the s x s softmax; frozen linears
keep no input;
RMSNorm keeps its float32 input; the loss keeps its float32 log-softmax. The dtype of every tensor follows the
method: float32, a 16-bit base, QLoRA with or without k-bit preparation (float32 or 16-bit residual stream), or
bfloat16 autocast. :func:`saved_activations` is exact against ``torch.autograd.graph.saved_tensors_hooks`` on
small configs (tests/test_step_memory.py). Arithmetic only: no torch.
"""

from dataclasses import dataclass
from typing import Sequence

from course_utils.architecture import Architecture
from course_utils.memory import ALL_METHODS


# --------------------------------------------------------------------------------------------
# What autograd saves: a symbolic walk through one forward pass
# --------------------------------------------------------------------------------------------
@dataclass(eq=False)  # eq=False: hashed by identity, so a walk can key the tensors it saves by the tensors
class _T:
    """A symbolic activation: ``width`` numbers per token of ``nbytes`` each; ``rg``: requires grad."""

    width: int
    nbytes: int
    rg: bool

    def cast(self, nbytes: int) -> "_T":
        """``.to(dtype)``: this tensor when it already has ``nbytes`` per number, else a new one."""
        return self if self.nbytes == nbytes else _T(self.width, nbytes, self.rg)


@dataclass
class _Walk:
    """Walk a Llama-family forward pass of ``tokens`` tokens, ``seq`` a sequence, and record what autograd saves
    (module doc).

    ``saved`` maps each saved tensor - by identity, so a tensor saved twice counts once - or the name of a
    constant to its kind and bytes.
    """

    arch: Architecture
    tokens: int
    seq: int
    method: str
    rank: int
    targets: Sequence[str]
    autocast: bool
    kbit_preparation: bool
    math_attention: bool
    attention_bytes: int = 0  # bytes per number of Q, K and V where SDPA gets them (set by attention())

    def __post_init__(self) -> None:
        method = ALL_METHODS[self.method]
        self.full = method.trains_all  # every weight trains
        # bytes per number of the layers' linear weights (0: 4-bit), and of the other weights (embedding, norms,
        # output layer) and so of the hidden states: float32 after QLoRA's k-bit preparation, else the base's dtype
        self.linear_bytes = 0 if self.method == "qlora" else method.model_bytes
        self.rest_bytes = 4 if self.method == "qlora" and self.kbit_preparation else method.model_bytes
        self.saved: dict[_T | str, tuple[str, int]] = {}

    def save(self, t: _T, what: str) -> None:
        self.saved[t] = (what, self.tokens * t.width * t.nbytes)

    def save_const(self, key: str, nbytes: int, what: str) -> None:
        self.saved[key] = (what, nbytes)

    @property
    def total(self) -> int:
        return sum(b for _, b in self.saved.values())

    def linear(self, x: _T, fan_in: int, fan_out: int, name: str, weight_bytes: int, lora: bool = False) -> _T:
        """A linear layer whose weight has ``weight_bytes`` per number (0: 4-bit, which saves nothing autograd sees:
        bitsandbytes casts the input to its compute dtype and its output back to the input's dtype)."""
        xc = x.cast(2) if self.autocast else x  # autocast casts the input for every call (no cache for activations)
        if self.autocast and weight_bytes == 4 and xc.rg:  # the bfloat16 weight copy, kept for the input's gradient
            self.save_const(f"{name}.weight_bf16", fan_in * fan_out * 2, "bf16 weight copies (autocast)")
        if self.full:
            self.save(xc, "linear inputs (trained weights)")
        out_bytes = x.nbytes if not weight_bytes else 2 if self.autocast else weight_bytes
        if not lora:
            return _T(fan_out, out_bytes, x.rg or self.full)
        # peft casts to the adapter's float32 (autocast: back to 16 bits)
        xa = x.cast(4).cast(2 if self.autocast else 4)
        if self.autocast:
            if xa.rg:
                self.save_const(f"{name}.lora_A_bf16", self.rank * fan_in * 2, "bf16 weight copies (autocast)")
            self.save_const(f"{name}.lora_B_bf16", fan_out * self.rank * 2, "bf16 weight copies (autocast)")
        self.save(xa, "LoRA inputs")
        self.save(_T(self.rank, 2 if self.autocast else 4, True), "LoRA inputs")
        return _T(fan_out, out_bytes, True)

    def rmsnorm(self, x: _T, groups: int) -> _T:
        h = x.cast(4)  # .to(float32)
        if h.rg:  # pow and the multiply keep the float32 input; rsqrt keeps 1/rms
            self.save(h, "norms")
            self.save(_T(groups, 4, True), "norms")
        hn = _T(x.width, 4, h.rg).cast(x.nbytes)  # normalized, back in the input's dtype
        if self.full:
            self.save(hn, "norms")
        return _T(x.width, max(self.rest_bytes, x.nbytes), hn.rg or self.full)  # weight * normalized

    def _proj(self, x: _T, name: str, layer: int) -> _T:
        fan_in, fan_out = self.arch.projection_shapes()[name]
        lora = not self.full and name in self.targets
        return self.linear(x, fan_in, fan_out, f"L{layer}.{name}", self.linear_bytes, lora)

    def attention(self, x: _T, layer: int) -> _T:
        a, rope_bytes = self.arch, self.rest_bytes  # cos and sin take the embedding output's dtype
        q, k, v = (self._proj(x, n, layer) for n in ("q_proj", "k_proj", "v_proj"))
        if a.qk_norm:
            q, k = self.rmsnorm(q, a.heads), self.rmsnorm(k, a.kv_heads)
        if q.rg or k.rg:  # q*cos and rotate_half(q)*sin keep cos and sin (shared by all layers)
            for key in ("cos", "sin"):
                self.save_const(key, self.seq * a.head_dim * rope_bytes, "rotary cos/sin")
        q, k = (_T(t.width, max(t.nbytes, rope_bytes), t.rg) for t in (q, k))
        if self.autocast:  # SDPA runs in bfloat16: float32 inputs are cast (new tensors)
            q, k, v = (t.cast(2) for t in (q, k, v))
        self.attention_bytes = q.nbytes
        out = _T(a.q_width, q.nbytes, q.rg or k.rg or v.rg)
        if self.math_attention:
            self._math_sdpa(q, k, v)
        elif out.rg:  # fused attention keeps q, k, v, its output and a log-sum-exp per head: no s x s matrix
            for t in (q, k, v, out, _T(a.heads, 4, False)):
                self.save(t, "attention (q, k, v, output)")
        return self._proj(out, "o_proj", layer)

    def _math_sdpa(self, q: _T, k: _T, v: _T) -> None:
        """The math backend: ``softmax((q*c) @ (k*c)^T) @ v`` in float32 (16-bit inputs are upcast), K and V
        expanded to every query head; each matmul keeps one factor where the other needs a gradient."""
        width, scores_rg = self.arch.q_width, q.rg or k.rg
        what = "attention (math: float32 q, k, v and s x s softmax)"
        # (q*c) @ kT keeps the scaled q for k's gradient and the scaled, expanded k for q's; softmax @ v keeps the
        # (float32, expanded) v for the scores' gradient
        for needed in (k.rg, q.rg, scores_rg):
            if needed:
                self.save(_T(width, 4, True), what)
        if scores_rg or v.rg:  # the softmax keeps its output; softmax @ v keeps it for v's gradient
            self.save(_T(self.arch.heads * self.seq, 4, True), what)

    def mlp(self, x: _T, layer: int) -> _T:
        g, u = self._proj(x, "gate_proj", layer), self._proj(x, "up_proj", layer)
        s = _T(g.width, g.nbytes, g.rg)  # silu(gate)
        # silu keeps its input; silu(gate) * up keeps each factor when the other one needs a gradient
        for t, kept in ((g, g.rg), (u, s.rg), (s, u.rg)):
            if kept:
                self.save(t, "MLP (SwiGLU)")
        return self._proj(_T(g.width, max(s.nbytes, u.nbytes), s.rg or u.rg), "down_proj", layer)

    def layer(self, x: _T, i: int) -> _T:
        x2 = _add(x, self.attention(self.rmsnorm(x, 1), i))
        return _add(x2, self.mlp(self.rmsnorm(x2, 1), i))


def _add(a: _T, b: _T) -> _T:
    return _T(a.width, max(a.nbytes, b.nbytes), a.rg or b.rg)


@dataclass
class Activations:
    """What the forward pass leaves for backward, in bytes."""

    total: int
    by_kind: dict[str, int]
    per_layer: int  # the last layer's saved bytes (what checkpointing recomputes at a time)
    hidden_bytes: int  # bytes per number of the hidden states (and of the embedding, norms and output layer)
    attention_bytes: int  # bytes per number of Q, K and V where SDPA gets them (4: float32, 2: 16-bit)
    scores_bytes: int  # one layer's s x s float32 scores (math attention), else 0
    cumulative: tuple[int, ...]  # saved bytes before the first layer, then once each layer's forward is done


def saved_activations(
    arch: Architecture,
    batch: int,
    seq: int,
    *,
    method: str = "lora",
    lora_rank: int = 8,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    autocast: bool = False,
    checkpointing: bool = False,
    kbit_preparation: bool = True,
    math_attention: bool = False,
) -> Activations:
    """Bytes autograd keeps for backward after the forward pass of one micro-batch (exact for Llama-family).

    Counted like ``saved_tensors_hooks`` sees them (each storage once, parameters excluded); with
    checkpointing, each checkpointed layer keeps its input instead of its insides. ``kbit_preparation``: see
    :func:`estimate_step` (``qlora`` only). ``math_attention``: SDPA's math backend runs (it keeps the s x s scores,
    see :mod:`course_utils.attention`), not a fused one.
    """
    walk = _Walk(arch, batch * seq, seq, method, lora_rank, tuple(targets), autocast, kbit_preparation, math_attention)
    if walk.full:
        walk.save_const("input_ids", walk.tokens * 8, "token ids and labels")
    # with checkpointing, PEFT models make the embedding output require grad (enable_input_require_grads)
    x = _T(arch.hidden, walk.rest_bytes, walk.full or checkpointing)
    cumulative = [walk.total]
    for i in range(arch.layers):
        outer = walk.saved
        if checkpointing:  # the layer keeps its input; its insides are recomputed in backward, counted apart
            walk.save(x, "checkpointed layer inputs")
            walk.saved = {}
        before = walk.total
        x = walk.layer(x, i)
        # the last layer's saved bytes, in the end (layers after the first are alike; the first also saves cos/sin)
        per_layer = walk.total - before
        walk.saved = outer
        cumulative.append(walk.total)
    walk.linear(walk.rmsnorm(x, 1), arch.hidden, arch.vocab, "lm_head", walk.rest_bytes)
    # the logits always need a gradient (LoRA puts adapters in every layer): log_softmax keeps its float32
    # output; nll_loss keeps the labels and a scalar
    walk.save(_T(arch.vocab, 4, True), "logits path (log-softmax, float32)")
    walk.save_const("labels", walk.tokens * 8, "token ids and labels")
    walk.save_const("total_weight", 4, "token ids and labels")
    by_kind: dict[str, int] = {}
    for what, nbytes in walk.saved.values():
        by_kind[what] = by_kind.get(what, 0) + nbytes
    scores = batch * arch.heads * seq * seq * 4 if math_attention else 0
    return Activations(walk.total, by_kind, per_layer, walk.rest_bytes, walk.attention_bytes, scores, tuple(cumulative))
