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
  per head and token, and recomputes the scores in backward. The 5·as²b term disappears - where a fused kernel
  runs. Where SDPA falls back to its math backend (a T4; float32 attention with grouped-query heads on any card:
  :mod:`course_utils.attention` decides, and the estimate names its backend), float32 copies of Q, K, V and the
  float32 softmax (b·heads·s² numbers per layer) are saved, and backward briefly holds two more s×s gradients.
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
* **QLoRA as the course teaches it** (``qlora``, notebook 01b): the layers' linear weights in 4-bit NF4, then
  peft's ``prepare_model_for_kbit_training`` upcasts everything else (embedding, norms, an untied output layer)
  to float32. The float32 embedding makes the hidden states float32, and a bitsandbytes 4-bit layer casts its
  input to its 16-bit compute dtype and its output back to the input's dtype: the whole residual stream, the
  norms' outputs, the attention and MLP tensors, the checkpointed layer inputs and the logits are float32, twice
  the bytes of a 16-bit base. ``kbit_preparation=False`` prices the recipe without that step (Unsloth, some
  trainers): the rest stays bfloat16 and so do the activations.
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

import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from course_utils import checks
from course_utils.activations import Activations, saved_activations
from course_utils.attention import BACKENDS, AttentionChoice, choose_backend
from course_utils.architecture import DEFAULT_TARGETS, MAX_LORA_RANK, Architecture, Config, normalize_targets
from course_utils.memory import ALL_METHODS, OPTIMIZERS
from course_utils.units import GB

#: Resident memory of the measuring child process after ``import torch, transformers, peft, bitsandbytes``
#: calibrated on a 2-core Intel Xeon cloud CPU (torch 2.13 CPU, transformers 5.24, Python 3.11): 0.43-0.45 GB;
#: data/sweeps/smollm2-135m-cpu.json checks it on another CPU.
CPU_BASELINE_BYTES = 440_000_000
#: What the same process holds after its first training step besides tensors - the machine code of the kernels
#: that step loaded, thread pools, allocator caches: 30-62 MB measured on CPU (scripts/memory_sweep.py).
CPU_RUNTIME_BYTES = 45_000_000
#: bitsandbytes NF4: 4 bits per number + one float32 scale per block of 64 numbers ...
_NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
#: ... + the 16-value NF4 code book (float32) that each quantized tensor carries.
_NF4_CODE_BYTES = 16 * 4
#: bitsandbytes 8-bit optimizers keep float32 states for tensors smaller than this.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256
#: The largest batch and sequence length a step estimate accepts (the sequence is also bounded by the config).
MAX_BATCH = 1_000_000
MAX_SEQ = 10_000_000
#: The arguments of :func:`estimate_step` that do not describe the step itself (the rest are its ``spec``).
_NOT_THE_STEP = ("config", "device", "baseline_bytes", "attention", "capability")


# --------------------------------------------------------------------------------------------
# The whole step
# --------------------------------------------------------------------------------------------
@dataclass
class StepEstimate:
    """The predicted peak of a training step, with the parts that make it up at the peak moment.

    ``spec`` holds the step as :func:`estimate_step` checked its arguments (``method``, ``batch``, ``seq``,
    ``lora_rank``, ``targets``, ``checkpointing``, ``optimizer``, ``autocast``, ``accumulation``,
    ``kbit_preparation``).
    """

    arch: Architecture
    spec: dict[str, Any]  # the step: estimate_step's checked arguments (method, batch, seq, ..., kbit_preparation)
    device: str
    baseline_bytes: int
    runtime_bytes: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations: Activations
    trained_params: int
    moments: dict[str, dict[str, int]]  # moment -> parts on top of the fixed ones
    peak_moment: str
    attention: AttentionChoice = AttentionChoice("flash", "assumed")  # the SDPA backend the estimate assumes

    @property
    def peak_bytes(self) -> int:
        """Everything in memory at the peak moment: the sum of :meth:`parts`."""
        return sum(nbytes for _, nbytes in self.parts())

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GB

    def parts(self) -> list[tuple[str, int]]:
        """(label, bytes) of everything in memory at the peak moment, in print order."""
        spec, method = self.spec, ALL_METHODS[self.spec["method"]]
        weights = method.weights.format(rest=_rest_dtype(spec))
        # torch AdamW's two states take the trained tensor's dtype: 8 bytes per trained number, 4 for full-bf16
        adamw = "8-bit AdamW" if spec["optimizer"] == "adamw8bit" else f"AdamW, {2 * method.trained_bytes} bytes"
        runtime = ("framework runtime after a first step (kernels, threads)", self.runtime_bytes)
        counter = "CPU process after imports" if self.device == "cpu" else "allocator counter; CUDA context not counted"
        return [
            (f"framework baseline ({counter})", self.baseline_bytes),
            *([runtime] if self.runtime_bytes else []),
            (f"weights ({weights})", self.weights_bytes),
            (f"optimizer states ({adamw} per trained number)", self.optimizer_bytes),
            *self.moments[self.peak_moment].items(),
        ]

    def categories(self) -> dict[str, int]:
        """The peak in five parts, for a stacked bar: weights, gradients, optimizer, activations, overhead.

        "optimizer" is the states plus the update's scratch space; "activations" what backward needs from the
        forward pass (saved, or recomputed with checkpointing); "overhead" the framework baseline and the
        transient buffers of backward (the loss's and logits' gradients).
        """
        out = dict.fromkeys(("weights", "gradients", "optimizer", "activations", "overhead"), 0)
        for label, nbytes in self.parts():
            out[part_category(label)] += nbytes
        return out

    def describe(self) -> str:
        """The step in words: model, method (rank and targets for LoRA), batch, optimizer, tricks."""
        spec, meth = self.spec, ALL_METHODS[self.spec["method"]]
        no = "" if spec["kbit_preparation"] else "no "
        prep = f", {no}k-bit preparation ({_rest_dtype(spec)} embedding and norms)"
        return (
            f"{self.arch.name}, {meth.label}"
            + ("" if meth.trains_all else f" (rank {spec['lora_rank']} on {', '.join(spec['targets'])})")
            + (prep if spec["method"] == "qlora" else "")
            + f", batch {spec['batch']} x {spec['seq']} tokens"
            + (f" x {spec['accumulation']} micro-batches" if spec["accumulation"] > 1 else "")
            + f", {'8-bit AdamW' if spec['optimizer'] == 'adamw8bit' else 'AdamW'}"
            + (", gradient checkpointing" if spec["checkpointing"] else "")
            + (", bf16 autocast" if spec["autocast"] else "")
        )

    def format(self) -> str:
        """The breakdown as text: one line per part, then the total."""
        lines = [f"Training-step estimate: {self.describe()} ({self.device})", self.attention.line()]
        lines.append(f"peak moment: {self.peak_moment}")
        rows = [*self.parts(), ("total (predicted peak)", self.peak_bytes)]
        return "\n".join(lines + [f"  {label:<58} {b / GB:7.2f} GB" for label, b in rows])


def _rest_dtype(spec: dict[str, Any]) -> str:
    """The dtype of a QLoRA step's embedding and norms: float32 after the k-bit preparation, else bfloat16."""
    return "float32" if spec["kbit_preparation"] else "bfloat16"


def part_category(label: str) -> str:
    """The category of a part of a peak (see :meth:`StepEstimate.categories`), by its label."""
    if label.startswith("weights"):
        return "weights"
    if "activations" in label:
        return "activations"
    if "optimizer" in label:
        return "optimizer"
    if "gradient" in label and "logits" not in label and "loss" not in label and "hidden states" not in label:
        return "gradients"
    return "overhead"


def _optimizer_state_bytes(sizes: Iterable[int], optimizer: str, state_bytes: int) -> int:
    """AdamW's states: torch keeps two of ``state_bytes`` (the parameter's dtype); bitsandbytes two 8-bit ones.

    Each tensor's states also carry a float32 step counter (4 bytes).
    """
    if optimizer == "adamw":
        return sum(2 * state_bytes * n + 4 for n in sizes)  # exp_avg and exp_avg_sq
    # bitsandbytes keeps float32 states for small tensors, whatever their dtype; else two uint8 states + block scales
    return sum(8 * n + 4 if n < _BNB_MIN_8BIT_SIZE else 2 * n + 2 * 4 * math.ceil(n / _BNB_BLOCK) + 4 for n in sizes)


def _optimizer_scratch_bytes(sizes: Sequence[int], optimizer: str, device: str, state_bytes: int) -> int:
    """Temporary memory of one optimizer step, read from the implementations.

    torch AdamW on CPU (for-loop): ``exp_avg_sq.sqrt() / bias_correction`` makes two temporaries the size
    of the parameter being updated. On CUDA (foreach): one temporary per trained number (the list of
    square roots). Both in the states' dtype (``state_bytes``: 2 for bfloat16 parameters). bitsandbytes 8-bit on
    CPU: both states dequantized to float32, a float32 gradient copy and the two denominator temporaries
    (5 x 4 bytes x the largest tensor); on CUDA a fused kernel (0).
    """
    if optimizer == "adamw":
        return state_bytes * sum(sizes) if device == "cuda" else 2 * state_bytes * max(sizes)
    return 0 if device == "cuda" else 5 * 4 * max(sizes)


def estimate_device_for(device: Any = None) -> str:
    """The counter an estimate must predict to be compared with a measurement on ``device``.

    ``"cuda"`` (PyTorch's allocator counter, no process baseline) for a CUDA device; ``"cpu"`` (the peak
    resident memory of a process, baseline included) for anything else, because :mod:`course_utils.measure`
    reads the process's memory there. ``device`` None means :func:`course_utils.hardware.pick_device`: the
    device a measurement with ``device=None`` uses, so estimate and measurement always agree.
    """
    from course_utils.hardware import as_device

    return "cuda" if as_device(device).type == "cuda" else "cpu"


def _weights_bytes(arch: Architecture, method: str, adapter_params: int, rest: int) -> int:
    """Bytes of the model's weights for ``method``: the base in its dtype, float32 adapters, rotary buffers.

    QLoRA: the layers' linear weights in NF4; the rest (embedding, norms, an untied output layer) in ``rest`` bytes
    (4 after the k-bit preparation, else 2); a 4-bit layer's bias in the compute dtype (bitsandbytes casts it there
    at its first forward, after the preparation's upcast).
    """
    if method != "qlora":
        base = ALL_METHODS[method].model_bytes * arch.params
    else:
        base = sum(
            round(_NF4_BYTES_PER_PARAM * n) + _NF4_CODE_BYTES
            if is_linear
            else (2 if name.endswith(".bias") else rest) * n
            for name, n, is_linear in arch.param_tensors()
        )
    return base + 4 * adapter_params + 2 * (arch.head_dim // 2) * 4  # + rotary inv_freq and its copy, float32


def _backward_moments(
    arch: Architecture, acts: Activations, spec: dict[str, Any], grads: int
) -> dict[str, dict[str, int]]:
    """The candidate peak moments of backward, each as its parts on top of baseline + weights + optimizer states.

    A gradient has its weight's dtype: 4 bytes per number, 2 for ``full-bf16``. Full tuning also trains the
    head and the embedding, whose backward makes a dense (vocab x hidden) gradient. A tied embedding gets two
    contributions (head and embedding): autograd holds the head's until the embedding's arrives, then adds
    them into a third tensor. With accumulation, the .grad being added to exists as well. The gradient of the hidden
    states has their dtype (``acts.hidden_bytes``; QLoRA: 4 bytes after the k-bit preparation, else 2). ``spec`` is
    the step as :func:`estimate_step` checked it; ``grads`` the bytes of all the gradients.
    """
    method, tokens, autocast = ALL_METHODS[spec["method"]], spec["batch"] * spec["seq"], spec["autocast"]
    full, gb = method.trains_all, method.trained_bytes  # bytes per gradient number
    logits_fp32 = tokens * arch.vocab * 4  # the loss path's tensors
    saved_before_loss = acts.total - logits_fp32  # the log-softmax output is freed first
    held = spec["accumulation"] > 1
    kept = {"gradients kept across micro-batches": grads} if held else {}
    head = arch.vocab * arch.hidden  # numbers in the head's weight (and the embedding's)
    head_grad = {"output-layer weight gradient": gb * head} if full else {}
    # what the backward of a layer near the top holds besides the saved activations
    layer = {"gradient of the hidden states": tokens * arch.hidden * acts.hidden_bytes, **head_grad, **kept}
    moments = {
        "start of backward (loss gradient over the vocabulary)": {
            "activations saved for backward": acts.total,
            "loss-path buffers in backward (2 x float32 logits)": 2 * logits_fp32,
            **kept,
        }
    }
    if full:
        moments["head backward (its weight gradient)"] = {
            "activations saved for backward": saved_before_loss,
            "logits gradient": tokens * arch.vocab * (2 if autocast else method.model_bytes),
            "output-layer weight gradient": gb * head + (2 * head if autocast and gb == 4 else 0),
            **kept,
        }
    if spec["checkpointing"]:
        moments["backward of the top layer (recomputed)"] = {
            "activations saved for backward": saved_before_loss,
            "one layer's recomputed activations": acts.per_layer,
            **layer,
        }
    if acts.scores_bytes:  # math attention: the softmax's and the scores' gradients, s x s each, float32
        moments["backward of the top layer's attention (math: s x s gradients)"] = {
            "activations saved for backward": saved_before_loss,
            "attention score gradients (2 x s x s, float32)": 2 * acts.scores_bytes,
            **layer,
        }
    if full and arch.tied:
        moments["end of backward (embedding gradient)"] = {
            "gradients of the other weights": grads - gb * head,
            "tied embedding: 2 gradient contributions and their sum": 3 * gb * head,
            **({"embedding gradient kept across micro-batches": gb * head} if held else {}),
        }
    elif full:
        moments["end of backward (embedding gradient)"] = {
            "gradients": grads,
            **({"embedding gradient (dense) before accumulation": gb * head} if held else {}),
        }
    return moments


def estimate_step(
    config: Config | Architecture = "smollm2-135m",
    *,
    method: str = "lora",
    batch: int = 8,
    seq: int = 128,
    lora_rank: int = 8,
    targets: str | Sequence[str] = DEFAULT_TARGETS,
    checkpointing: bool = False,
    optimizer: str = "adamw",
    autocast: bool = False,
    accumulation: int = 1,
    device: Any = "cpu",
    baseline_bytes: int | None = None,
    kbit_preparation: bool = True,
    attention: str = "auto",
    capability: tuple[int, int] | None = None,
) -> StepEstimate:
    """Predict the peak memory of one training step (steady state: the optimizer states already exist).

    Same arguments as :func:`course_utils.measure.measure_training_step`. ``kbit_preparation`` (``qlora``
    only; the other methods load no 4-bit weights and ignore it): True prices notebook 01b's recipe, peft's
    ``prepare_model_for_kbit_training`` after the 4-bit load (float32 embedding, norms and output layer, so
    float32 hidden states and logits); False the 4-bit load and LoRA without it (bfloat16 rest and activations).
    ``device``: ``"cpu"`` (peak resident memory of a process, baseline = the imports) or ``"cuda"`` (PyTorch's
    allocator counter, baseline 0); a ``torch.device`` of either type is accepted too. To compare with a
    measurement, pass :func:`estimate_device_for` of the measured device. ``baseline_bytes`` overrides the
    framework baseline. ``attention``: the SDPA backend to assume (one of :data:`course_utils.attention.BACKENDS`),
    or ``"auto"``: the one the device gets (:func:`course_utils.attention.choose_backend`); on CUDA for the card of
    compute capability ``capability`` (None: the GPU present, else an Ampere-or-newer card, said in the reason).
    """
    spec = {k: v for k, v in locals().items() if k not in _NOT_THE_STEP}
    arch = config if isinstance(config, Architecture) else Architecture.from_config(config)
    device = checks.choice(getattr(device, "type", device), "device", ("cpu", "cuda"))  # a torch.device: its type
    checks.choice(method, "method", ALL_METHODS)
    checks.choice(optimizer, "optimizer", OPTIMIZERS)
    checks.integer(batch, "batch", 1, MAX_BATCH)
    checks.integer(seq, "seq", 1, arch.max_positions or MAX_SEQ)
    checks.integer(lora_rank, "lora_rank", 1, MAX_LORA_RANK)
    checks.integer(accumulation, "accumulation", 1, 100_000)
    checks.choice(attention, "attention", ("auto", *BACKENDS))
    checks.flag(kbit_preparation, "kbit_preparation")
    spec.update(targets=normalize_targets(targets), checkpointing=bool(checkpointing), autocast=bool(autocast))
    # on CUDA the allocator counter starts at 0: the CUDA context (0.3-0.6 GB) lives outside it
    if baseline_bytes is None:
        baseline_bytes = CPU_BASELINE_BYTES if device == "cpu" else 0
    trains_all, per = ALL_METHODS[method].trains_all, ALL_METHODS[method].trained_bytes  # per: bytes per trained number
    trained_sizes = (
        [n for _, n, _ in arch.param_tensors()] if trains_all else arch.adapter_tensors(lora_rank, spec["targets"])
    )
    grads = per * sum(trained_sizes)  # a gradient, like each AdamW state, has the trained tensor's dtype
    walk = {k: spec[k] for k in ("method", "lora_rank", "targets", "autocast", "checkpointing", "kbit_preparation")}
    acts = saved_activations(arch, batch, seq, **walk)
    if attention == "auto":  # the SDPA backend the device gets
        if device == "cuda" and capability is None:
            capability = _present_capability()
        shape = {"heads": arch.heads, "kv_heads": arch.kv_heads, "head_dim": arch.head_dim}
        choice = choose_backend(device=device, dtype_bytes=acts.attention_bytes, capability=capability, **shape)
    else:
        choice = AttentionChoice(attention, "as asked")
    spec["attention"] = choice.backend
    if choice.keeps_scores:
        acts = saved_activations(arch, batch, seq, **walk, math_attention=True)
    moments = _backward_moments(arch, acts, spec, grads)
    scratch = _optimizer_scratch_bytes(trained_sizes, optimizer, device, per)
    moments["optimizer step"] = {"gradients": grads, **({"optimizer scratch": scratch} if scratch else {})}
    return StepEstimate(
        arch=arch,
        spec=spec,
        device=device,
        baseline_bytes=int(baseline_bytes),
        runtime_bytes=CPU_RUNTIME_BYTES if device == "cpu" else 0,
        weights_bytes=_weights_bytes(arch, method, 0 if trains_all else sum(trained_sizes), acts.hidden_bytes),
        grads_bytes=grads,
        optimizer_bytes=_optimizer_state_bytes(trained_sizes, optimizer, per),
        activations=acts,
        trained_params=sum(trained_sizes),
        moments=moments,
        peak_moment=max(moments, key=lambda k: sum(moments[k].values())),
        attention=choice,
    )


def estimate_step_for(kwargs: Mapping[str, Any], config: Config | Architecture, device: Any = None) -> StepEstimate:
    """The estimate for a measurement's keyword arguments (:func:`course_utils.measure.measure_training_step`'s;
    those it does not model, such as ``compile``, are left out), for the counter a measurement on ``device`` reads
    (:func:`estimate_device_for`; None: :func:`course_utils.hardware.pick_device`, where a measurement runs)."""
    keys = ("method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer", "accumulation")
    step = {k: kwargs[k] for k in keys if k in kwargs}
    return estimate_step(config, **step, autocast=bool(kwargs.get("autocast")), device=estimate_device_for(device))


def _present_capability() -> tuple[int, int] | None:
    """The compute capability of the CUDA GPU present, or None (no GPU, torch cannot tell, or torch was never
    imported here: then no GPU was used, and an estimate stays free of torch's import)."""
    torch = sys.modules.get("torch")
    try:
        return tuple(torch.cuda.get_device_capability()) if torch and torch.cuda.is_available() else None
    except (RuntimeError, AssertionError):
        return None


def korthikanti_layer_bytes(arch: Architecture, batch: int, seq: int) -> dict[str, float]:
    """Korthikanti et al. (2022)'s per-layer activation bytes (16-bit, dropout, no recomputation), for comparison.

    ``sbh(34 + 5as/h)``: with full recomputation ``2sbh``. Returns both, and ``34sbh`` (selective recomputation).
    """
    sbh = seq * batch * arch.hidden
    return {
        "no recomputation": sbh * (34 + 5 * arch.heads * seq / arch.hidden),
        "selective recomputation": 34 * sbh,
        "full recomputation": 2 * sbh,
    }


# --------------------------------------------------------------------------------------------
# Estimate vs measured
# --------------------------------------------------------------------------------------------
def error_percent(estimate_bytes: float, measured_bytes: float) -> float:
    """(estimate - measured) / measured, in percent."""
    measured_bytes = checks.positive(measured_bytes, "measured_bytes")
    return 100.0 * (estimate_bytes - measured_bytes) / measured_bytes


def comparison_line(estimate_bytes: float, measured_bytes: float) -> str:
    """The CLI's last line: ``estimate X GB, measured Y GB, error Z %``."""
    error = error_percent(estimate_bytes, measured_bytes)
    return f"estimate {estimate_bytes / GB:.2f} GB, measured {measured_bytes / GB:.2f} GB, error {error:+.1f} %"
