"""One training step's memory over time, by kind: predicted from the step estimate, or measured.

A :class:`Timeline` is a list of points, each the bytes alive at one moment of one step, split into
:data:`KINDS`, with the moment's label and its :data:`PHASES` entry. :func:`predicted_timeline` builds one from
:func:`course_utils.step_memory.estimate_step`'s own model, so its peak is the estimate's peak exactly;
:mod:`course_utils.timeline_measure` measures one (the profiler's memory timeline on a CPU, the allocator's history
on a GPU) into the same kinds, so the two can be drawn on the same axes. Arithmetic only here: no torch.
"""

from collections import Counter
from dataclasses import dataclass, field
from course_utils.step_memory import StepEstimate, part_category

#: What is alive, in the order a stacked chart draws it (bottom first). "framework" is the process's own memory
#: (a CPU estimate's baseline and runtime): a profiler counts tensors only, so a measured timeline has none.
KINDS = ("framework", "weights", "optimizer states", "gradients", "activations", "temporaries")
#: The phases of one step, in order. A point's phase says where in the step it is.
PHASES = ("before the step", "forward", "backward", "optimizer step", "after zero_grad")


@dataclass(frozen=True)
class TimelinePoint:
    """The bytes alive at one moment of a step, by kind (keys of :data:`KINDS`; a missing kind is 0)."""

    label: str
    phase: str
    by_kind: dict[str, int]

    @property
    def total(self) -> int:
        """Every kind together."""
        return sum(self.by_kind.values())


@dataclass
class Timeline:
    """A step's memory over time: ``points`` in order; ``times_s`` their seconds since the step began (measured),
    or None (predicted: one point per moment of the model); ``source`` says which, in words."""

    points: list[TimelinePoint]
    source: str
    times_s: list[float] | None = None
    files: dict[str, str] = field(default_factory=dict)  # what a measurement saved: name -> path

    @property
    def peak(self) -> TimelinePoint:
        """The point with the most bytes alive (the first, on a tie)."""
        return max(self.points, key=lambda p: p.total)

    def kind_max(self, kind: str) -> int:
        """The most bytes of ``kind`` alive at any point."""
        return max(p.by_kind.get(kind, 0) for p in self.points)


def tensor_total(point: TimelinePoint) -> int:
    """The bytes of ``point`` in every tensor kind: the framework left out."""
    return sum(point.by_kind.get(k, 0) for k in KINDS[1:])


# --------------------------------------------------------------------------------------------
# The predicted timeline: the step estimate's own parts, moment by moment
# --------------------------------------------------------------------------------------------
#: The part of a tied embedding's backward that holds its two gradient contributions and their sum.
_TIED_SUM = "tied embedding: 2 gradient contributions and their sum"
#: The head's gradient, which a tied embedding holds as a contribution (not yet a ``.grad``) until the sum.
_HEAD_GRAD = "output-layer weight gradient"


def _moment_kinds(parts: dict[str, int], tied: bool = False) -> dict[str, int]:
    """A moment of a step estimate (part label -> bytes) as bytes by kind. ``tied``: a tied embedding that trains,
    whose gradient contributions are autograd's temporaries until they are summed into the one ``.grad``."""
    out: Counter[str] = Counter()
    for label, nbytes in parts.items():
        if tied and label == _TIED_SUM:  # the sum is the .grad; the two contributions are temporaries
            out["gradients"] += nbytes // 3
            out["temporaries"] += nbytes - nbytes // 3
        elif tied and label == _HEAD_GRAD:
            out["temporaries"] += nbytes
        else:
            # by the estimate's own category: activations and gradients are those kinds; the rest ("optimizer", its
            # scratch space, and "overhead", the short-lived buffers of backward) are temporaries
            category = part_category(label)
            out[category if category in ("activations", "gradients") else "temporaries"] += nbytes
    return dict(out)


def _layer_gradient_bytes(est: StepEstimate) -> int:
    """The gradient bytes of one decoder layer's trained tensors (full tuning: every weight; LoRA: its adapters)."""
    arch = est.arch
    if est.trained_params != arch.params:  # adapters only, all inside the layers
        return est.grads_bytes // arch.layers
    outside = sum(n for name, n, _ in arch.param_tensors() if name in ("embed_tokens", "norm", "lm_head"))
    return est.grads_bytes * (arch.params - outside) // arch.params // arch.layers


def predicted_timeline(est: StepEstimate) -> Timeline:
    """The step of ``est`` over time, from the estimate's own model: one point before the step, one after each
    layer's forward, the loss, the estimate's moments of backward in step order with a point after each layer's
    backward between them, the optimizer step, and after ``zero_grad``. Steady state: the optimizer states exist
    throughout (and with accumulation, the gradients kept from the earlier micro-batches: this is the last one).
    Its peak is the estimate's peak, the same bytes at the same moment.
    """
    acts, arch, moments = est.activations, est.arch, est.moments
    tied = arch.tied and est.trained_params == arch.params  # the embedding trains, and is the head too
    # with checkpointing, peft makes the frozen embedding's output require grad: a leaf, which keeps its gradient
    leaf_input = est.spec["checkpointing"] and est.trained_params != arch.params
    tokens = est.spec["batch"] * est.spec["seq"]
    logits = tokens * arch.vocab * (2 if est.spec["autocast"] else acts.hidden_bytes)  # the model's output
    framework = est.baseline_bytes + est.runtime_bytes
    fixed = {"framework": framework, "weights": est.weights_bytes, "optimizer states": est.optimizer_bytes}
    kept = est.grads_bytes if est.spec["accumulation"] > 1 else 0

    def point(label: str, phase: str, kinds: dict[str, int]) -> TimelinePoint:
        return TimelinePoint(label, phase, {**fixed, **kinds})

    points = [point("before the step", "before the step", {"gradients": kept})]
    for i, saved in enumerate(acts.cumulative[1:], start=1):
        points.append(point(f"layer {i} forward", "forward", {"gradients": kept, "activations": saved}))
    loss = "the loss (its float32 log-softmax kept, the logits alive)"
    points.append(point(loss, "forward", {"gradients": kept, "activations": acts.total + logits}))
    in_backward = [m for m in moments if m not in ("optimizer step", "end of backward (embedding gradient)")]
    points += [point(m, "backward", _moment_kinds(moments[m], tied)) for m in in_backward]
    head = moments.get("head backward (its weight gradient)", {}).get(_HEAD_GRAD, 0)
    per_layer, hidden = _layer_gradient_bytes(est), tokens * arch.hidden
    for i in range(arch.layers - 1, -1, -1):  # after layer i's backward: its saved tensors freed, its gradients made
        # (with accumulation the kept .grad tensors take each new gradient in place: no new ones appear)
        grads = kept or (0 if tied else head) + (arch.layers - i) * per_layer
        flowing = hidden * acts.hidden_bytes  # the gradient of the hidden states, passed down
        if i == 0 and leaf_input:  # it ends as the .grad of the embedding's output (a leaf that requires grad)
            grads, flowing = grads + flowing, 0
        temporaries = flowing + (head if tied and not kept else 0)
        kinds = {"activations": acts.cumulative[i], "gradients": grads, "temporaries": temporaries}
        points.append(point(f"layer {i + 1} backward", "backward", kinds))
    for m, phase in (("end of backward (embedding gradient)", "backward"), ("optimizer step", "optimizer step")):
        if m in moments:
            points.append(point(m, phase, _moment_kinds(moments[m], tied)))
    points.append(point("after zero_grad", "after zero_grad", {}))
    return Timeline(points, f"predicted: {est.describe()} ({est.device})")
