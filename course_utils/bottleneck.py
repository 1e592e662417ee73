"""What is my bottleneck? Name what does not fit a memory budget, and which tricks move a step under it.

The budget someone gives is a GPU's memory (the card's); the step is judged against its **usable** memory, that
less the 0.5 GB CUDA context, by :func:`course_utils.memory.step_verdict`: a step or an option "fits" up to 90 %
of usable, is "tight" from 90 % to 100 % (the caching allocator's reserve and fragmentation can still run out of
memory: not a fix to recommend), and "does not fit" above.

Pure estimates from :mod:`course_utils.step_memory` (nothing is run or measured): the step's parts at its peak
moment, then every combination of gradient checkpointing, 8-bit AdamW, smaller micro-batches with gradient
accumulation and cheaper methods (full -> LoRA -> LoRA on a 16-bit base -> QLoRA), ranked.

Time is estimated from the arithmetic of a step (see :func:`arithmetic_time_factor`). That is a fair first guess for
checkpointing (one more forward) and for a change of method, but not for gradient accumulation: it does the
same arithmetic in more, smaller steps, and a smaller micro-batch uses the hardware less well while every step
adds fixed work (launching kernels, reading every weight again, adding into the kept gradients). How much
slower depends on the micro-batch and the machine, so an option with accumulation gives its arithmetic factor
as a floor ("x1.00 or more") and says to measure it, instead of a number it cannot know.
"""

import itertools
from dataclasses import dataclass, field
from typing import Any

from course_utils import checks
from course_utils.attention import sixteen_bit
from course_utils.memory import METHODS, STEP_VERDICTS, TIGHT_SHARE, step_limit_gb, step_verdict
from course_utils.step_memory import estimate_step
from course_utils.units import GB


@dataclass
class Option:
    """A way to make the step fit: the changes, the new estimate, its verdict (:func:`step_verdict`) and its
    estimated time cost."""

    changes: tuple[str, ...]
    peak_gb: float
    verdict: str
    time_factor: float
    cost: str
    method_changed: bool
    micro_batches: int
    kinds: frozenset[str]  # the kinds of change (keys of _MOVES): what _rank compares

    @property
    def fits(self) -> bool:
        """True when the option's estimate is at most 90 % of usable memory ("tight" is not "fits")."""
        return self.verdict == "fits"

    def time_text(self) -> str:
        """The time estimate in words: ``time x1.33``, or ``time x1.00 or more`` with accumulation (the option splits
        the batch into micro-batches, so ``time_factor`` is only a lower bound)."""
        return f"time x{self.time_factor:.2f}" + (" or more" if self.micro_batches > 1 else "")


@dataclass
class Diagnosis:
    """The answer of :func:`what_is_my_bottleneck`: ``budget_gb`` is the memory given (a GPU's: the card's),
    ``usable_gb`` what the step may use of it (:func:`course_utils.memory.step_limit_gb`)."""

    estimate: Any
    budget_gb: float
    usable_gb: float
    verdict: str
    options: list[Option] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """True when the step itself is at most 90 % of usable memory: no trick needed."""
        return self.verdict == "fits"

    def text(self, limit: int = 3) -> str:
        """The diagnosis in a few short lines: the estimate against usable memory, the three biggest parts at the
        peak moment, the options that fit (each with its estimated peak and time factor), then the tight ones."""
        est, usable, on_gpu = self.estimate, self.usable_gb, self.estimate.device == "cuda"
        where = "GPU allocator counter" if on_gpu else "CPU process memory"
        of = f"GPU {self.budget_gb:g} GB, usable {usable:.4g} GB" if on_gpu else f"budget {usable:g} GB"
        share = f"{100 * est.peak_gb / usable:.0f} % of {'usable' if on_gpu else 'it'}"
        head = f"{est.describe()}: {est.peak_gb:.2f} GB ({where}; {est.attention.backend} attention); {of}: {share}"
        if self.fits:
            return head + "\nIt fits: no trick needed for memory."
        big = sorted(est.parts(), key=lambda p: -p[1])[:3]
        over = f"it does not fit ({est.peak_gb - usable:.2f} GB over)"
        state = "tight: it may still run out of memory" if self.verdict == "tight" else over
        biggest = " | ".join(f"{_short(label)} {b / GB:.2f} GB" for label, b in big)
        lines = [f"{head}, {state}", f"biggest at the peak ({_short(est.peak_moment)}): {biggest}"]
        # same method first, then fewest changes (see _rank); then the nearest miss, "tight"
        shown = [o for o in self.options if o.fits][:limit] + [o for o in self.options if o.verdict == "tight"][:1]
        if not any(o.fits for o in shown):
            lines.append("no combination of the tricks fits: a smaller model, shorter sequences or a bigger machine")
        if shown:
            width, tight = max(len(" + ".join(o.changes)) for o in shown), round(100 * TIGHT_SHARE)
            lines.append(f"options (fits: at most {tight} % of usable; tight: {tight}-100 %, may still run out):")
            for o in shown:
                changes, costs = " + ".join(o.changes), "; ".join(map(_short, o.cost.split("; ")))
                row = f"  {o.verdict:<5}  {changes:<{width}}  {o.peak_gb:6.2f} GB  {o.time_text():<18} ({costs})"
                lines.append(row)
        return "\n".join(lines)


def _short(text: str) -> str:
    """``text`` up to its first ``" ("`` or ``":"``: a part's name, or one of an option's costs, without its
    explanation."""
    return text.split(" (")[0].split(":")[0]


#: Each move: its name in an option's changes, and its estimated time cost (see :func:`what_is_my_bottleneck`).
_MOVES = {
    "checkpointing": ("gradient checkpointing", "one extra forward of every layer"),
    "adamw8bit": ("8-bit AdamW", "about the same time on a GPU (fused kernel)"),
    "accumulation": (
        "micro-batch {micro} x {k} accumulation steps",
        "same arithmetic in {k} smaller steps: each step adds fixed work and a smaller "
        "micro-batch uses the hardware less well: measure how much slower",
    ),
    "lora": ("LoRA", "no weight gradients for the frozen base: about 2/3 of full fine-tuning's arithmetic"),
    "lora-bf16": ("LoRA on a {half} base", "like LoRA; {half} matmuls use the tensor cores"),
    "qlora": ("QLoRA", "like LoRA, plus unpacking every 4-bit weight at each use (slower per step: measure it)"),
}


def arithmetic_time_factor(
    method: str, new_method: str, checkpointing: bool = False, new_checkpointing: bool = False
) -> float:
    """Relative time of a step from its arithmetic: forward = 1; backward = 2 (weights trained) or about 1 (frozen);
    checkpointing adds one forward. Full fine-tuning with checkpointing: 4/3; LoRA instead of full: 2/3.

    Splitting the batch into micro-batches does not change this arithmetic, so it does not enter here: for
    accumulation this factor is a floor (see :meth:`Option.time_text`). The methods are :data:`METHODS`'.
    """
    checks.choice(method, "method", METHODS)
    checks.choice(new_method, "new_method", METHODS)

    def cost(m: str, ck: bool) -> float:
        return 1.0 + (2.0 if m == "full" else 1.0) + (1.0 if ck else 0.0)  # forward + backward (+ a forward again)

    return cost(new_method, new_checkpointing) / cost(method, checkpointing)


def what_is_my_bottleneck(
    config: Any = "smollm2-135m",
    method: str = "full",
    batch: int = 8,
    budget_gb: float = 16.0,
    *,
    seq: int = 512,
    optimizer: str = "adamw",
    checkpointing: bool = False,
    device: str = "cuda",
    capability: tuple[int, int] | None = None,
) -> Diagnosis:
    """Name what does not fit ``budget_gb`` and which tricks (alone or together) move the step under it.

    ``budget_gb`` is the GPU's memory (the card's, 0.5 GB to 10,000 GB); the step and each option are judged
    against its usable memory, that less the CUDA context, by :func:`course_utils.memory.step_verdict`: "fits" up
    to 90 % of it, "tight" up to 100 % (listed apart: not a fix to count on). On ``device="cpu"`` the whole memory
    is the limit.

    Moves tried: gradient checkpointing, 8-bit AdamW, smaller micro-batches with gradient accumulation (same
    examples per optimizer step; the fewest micro-batches that fit, and fewer that are only tight), and cheaper
    methods (full -> LoRA -> LoRA on a 16-bit base -> QLoRA), alone and together. Options that keep the method come
    first (a new method changes what is trained, not only the cost), then those with fewer changes. Time factors
    come from the arithmetic of a step (:func:`arithmetic_time_factor`); with accumulation that factor is only a
    floor (same arithmetic, more and smaller steps: slower by an amount only a measurement tells). ``device``
    ``"cuda"`` compares against the allocator counter (no process baseline), ``"cpu"`` includes it. (``lora-bf16``
    means a 16-bit base: bfloat16, or float16 on a T4; both take 2 bytes per number. LoRA is
    :func:`estimate_step`'s: rank 8 on the default targets.) ``capability``: the GPU's compute capability, which
    decides its attention kernel and 16-bit dtype (None: the GPU present, else an Ampere-or-newer card).
    """
    checks.choice(method, "method", METHODS)
    checks.flag(checkpointing, "checkpointing")
    common = {"seq": seq, "device": device, "capability": capability}  # LoRA: estimate_step's default rank, targets
    half = {"float16": "fp16", "bfloat16": "bf16"}[sixteen_bit(getattr(device, "type", device), capability)]
    usable = step_limit_gb(budget_gb, getattr(device, "type", device))  # a GPU: the card's memory less the context
    est = estimate_step(config, method=method, batch=batch, optimizer=optimizer, checkpointing=checkpointing, **common)
    diag = Diagnosis(est, float(budget_gb), usable, step_verdict(est.peak_gb, usable))
    if diag.fits:
        return diag
    later = list(itertools.dropwhile(lambda m: m != method, METHODS))  # this method and the cheaper ones
    flags = sorted({checkpointing, True}), sorted({optimizer == "adamw8bit", True})  # checkpointing, 8-bit AdamW
    splits = [k for k in (1, 2, 4, 8, 16, 32, 64) if batch % k == 0]
    for new_method, ck, eight_bit in itertools.product(later, *flags):
        step = {**common, "method": new_method, "checkpointing": ck, "optimizer": "adamw8bit" if eight_bit else "adamw"}
        factor = arithmetic_time_factor(method, new_method, checkpointing, ck)
        tried: list[tuple[int, Any, str]] = []  # (micro-batches, estimate, verdict), fewest micro-batches first
        for k in splits:  # accumulation costs time on a real GPU: as few micro-batches as possible
            new = estimate_step(config, batch=batch // k, accumulation=k, **step)
            tried.append((k, new, step_verdict(new.peak_gb, usable)))
            if tried[-1][2] == "fits":
                break
        # the first that is tight (when it comes before a fit) and the first that fits; else the last try
        kept = [t for t in tried if t[2] == "fits"] + [t for t in tried if t[2] == "tight"][:1]
        for k, new, verdict in kept or tried[-1:]:
            changed = {
                new_method: new_method != method,
                "checkpointing": ck and not checkpointing,
                "adamw8bit": eight_bit and optimizer != "adamw8bit",
                "accumulation": k > 1,
            }
            kinds = [kind for kind, on in changed.items() if on]
            if not kinds:  # a combination that changes nothing is the step itself
                continue
            moves = [[text.format(micro=batch // k, k=k, half=half) for text in _MOVES[kind]] for kind in kinds]
            names, costs = zip(*moves)
            cost = "; ".join(costs)
            option = Option(names, new.peak_gb, verdict, factor, cost, new_method != method, k, frozenset(kinds))
            diag.options.append(option)
    diag.options = _rank(diag.options)
    return diag


def _rank(options: list[Option]) -> list[Option]:
    """Fitting options first, then tight ones; keep the method if possible (a new method changes the result, not
    only the cost); then fewest changes, fewest micro-batches, least time. An option is dropped when a fitting or
    tight one makes a subset of its changes with a verdict at least as good (and is not the same option)."""
    level = {verdict: i for i, verdict in enumerate(STEP_VERDICTS)}
    better = [o for o in options if o.verdict != "does not fit"]

    def beaten(o: Option) -> bool:
        """Whether a fitting or tight option makes fewer of its changes at least as well, or the same ones better."""
        at_least_as_good = [f for f in better if level[f.verdict] <= level[o.verdict]]
        return any(f.kinds < o.kinds or (f.kinds == o.kinds and f.verdict != o.verdict) for f in at_least_as_good)

    def order(o: Option) -> tuple:
        return (level[o.verdict], o.method_changed, len(o.changes), o.micro_batches, o.time_factor, o.peak_gb)

    return sorted((o for o in options if not beaten(o)), key=order)
