"""Notebook 05 (memory tricks): its charts, the "what is my bottleneck?" planner and the exercises.

The numbers come from :mod:`course_utils.step_memory`, :mod:`course_utils.bottleneck` and
:mod:`course_utils.tricks`; this module draws and wires. It draws with 04's charts and controls
(:mod:`course_utils.lessons.memory_budget`): the estimate against the measured peak, the step against a budget,
a timeline's stacked kinds, the step planner's controls. Nothing here imports torch.
"""

from typing import Any

from course_utils import checks, datasheets, memory
from course_utils.architecture import Architecture
from course_utils.bottleneck import arithmetic_time_factor, what_is_my_bottleneck
from course_utils.configs import config_presets, read_config
from course_utils.lessons import kit
from course_utils.lessons.kit import Feedback
from course_utils.lessons.memory_budget import plot_estimate_vs_measured as plot_estimate_vs_measured
from course_utils.lessons.memory_budget import plot_step_against_budgets, stack_by_kind, step_controls
from course_utils.lessons.memory_budget import timeline_chart as timeline_chart, timeline_text as timeline_text
from course_utils.step_memory import estimate_step, saved_activations
from course_utils.timeline import Timeline, predicted_timeline, tensor_total
from course_utils.units import GB

#: The GPU memories the planner offers, in GB (each judged against its usable memory, less the CUDA context).
BUDGETS = (8.0, 16.0, 24.0, 40.0, 80.0)


def bottleneck_view(
    config: str = "smollm2-135m",
    method: str = "full",
    batch: int = 8,
    seq: int = 512,
    budget_gb: float = 16.0,
    checkpointing: bool = False,
    optimizer: str = "adamw",
    show_chart: bool = True,
    limit: int = 3,
) -> str:
    """The planner's callback: print and return the diagnosis; draw the predicted peak against the budget's usable
    memory (with 04's chart). ``budget_gb`` is the GPU's memory; usable is that less the 0.5 GB CUDA context, and a
    step fits up to 90 % of it (:func:`course_utils.memory.step_verdict`). ``config`` is a shipped preset; bounded:
    ``batch`` 1-256 and ``seq`` up to 8192, so a click cannot ask for an absurd estimate.
    """
    checks.choice(config, "config", config_presets())  # the method is checked by what_is_my_bottleneck
    checks.integer(batch, "batch", 1, 256)
    checks.integer(seq, "seq", 1, 8192)
    step = {"seq": seq, "checkpointing": checkpointing, "optimizer": optimizer, "device": "cuda"}
    diag = what_is_my_bottleneck(config, method, batch, budget_gb, **step)
    text = diag.text(limit)
    print(text)
    if show_chart:
        plot_step_against_budgets(diag.estimate, [memory.Budget(f"GPU {budget_gb:g} GB", budget_gb)])
        kit.plt.show()
    return text


def bottleneck_planner() -> Any:
    """The widget: 04's step controls and a budget, wired to :func:`bottleneck_view` (GPU allocator view)."""
    import ipywidgets as w

    controls = step_controls("smollm2-135m", "full", 8, 512, methods=memory.METHODS)
    controls["budget_gb"] = w.Dropdown(options=BUDGETS, value=16.0, description="GB")
    return kit.interact_panel(bottleneck_view, **controls)


# ------------------------------------ Exercise 1: read a step's peak (reset the counter, run the step, read the peak)
#: The step the check replays: 05's miniature of SmolLM2 (4 of its 30 layers, a vocabulary of 8,192), full
#: fine-tuning, batch 4 x 256; once as it is and once with a trick (gradient checkpointing).
_PEAK_STEP = {"method": "full", "batch": 4, "seq": 256}
_PEAK_TRICKS = {"the baseline step": False, "the step with checkpointing": True}
#: Earlier work's tensor, freed before each call: the peak a counter that is never reset still reports.
EARLIER_BYTES = 1_000_000_000


def miniature() -> dict[str, Any]:
    """Notebook 05's miniature of SmolLM2-135M: 4 of its 30 layers, a vocabulary of 8,192."""
    return {**read_config("smollm2-135m"), "num_hidden_layers": 4, "vocab_size": 8192}


class StandInCounter:
    """A stand-in for ``torch.cuda``'s allocator counter, the same on every machine: the bytes a replayed step's
    tensors hold (:meth:`step`) and the most since the last reset, read through torch.cuda's own method names.

    It starts with ``in_use`` bytes held and an earlier ``peak``; one step holds each of ``step_bytes`` in turn.
    """

    def __init__(self, in_use: int, peak: int, step_bytes: list[int]) -> None:
        self.in_use, self.peak, self.step_bytes, self.used = in_use, peak, step_bytes, False

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """Forget earlier peaks: from now on the peak starts at what is in use."""
        self.used, self.peak = True, self.in_use

    def max_memory_allocated(self, device: Any = None) -> int:
        """The most bytes held since the last reset."""
        self.used = True
        return self.peak

    def memory_allocated(self, device: Any = None) -> int:
        """The bytes held now."""
        self.used = True
        return self.in_use

    def synchronize(self, device: Any = None) -> None:
        """Nothing to wait for: the replay runs no GPU work."""

    def step(self) -> None:
        """The step the learner's function runs: the tensors hold each of ``step_bytes`` in turn."""
        for nbytes in self.step_bytes:
            self.in_use, self.peak = nbytes, max(self.peak, nbytes)


def check_step_peak(fn: Any) -> Feedback:
    """Exercise 1: ``fn(step, counter)`` resets the peak counter, runs ``step()`` once and returns the peak in bytes."""
    name = "step_peak"
    hint = "Three lines: counter.reset_peak_memory_stats(), step(), return counter.max_memory_allocated() (bytes)."
    use_counter = "Call the counter argument's methods (counter.max_memory_allocated()): the check passes a stand-in."
    peaks: list[str] = []
    for what, checkpointing in _PEAK_TRICKS.items():
        est = estimate_step(miniature(), **_PEAK_STEP, checkpointing=checkpointing, device="cuda")
        timeline = predicted_timeline(est)
        before, peak = tensor_total(timeline.points[0]), tensor_total(timeline.peak)  # before: weights, AdamW states
        after = before + est.grads_bytes
        # the step: forward, backward, the optimizer step; then the gradients stay until the next zero_grad
        counter = StandInCounter(before, before + EARLIER_BYTES, [*map(tensor_total, timeline.points[1:-1]), after])
        call = f"{name}(step, counter) on {what}"
        got, feedback = kit.call_answer(fn, (counter.step, counter), name=name, call=call, hint=hint)
        if feedback is not None:  # not written yet, or it raised: without touching the counter, that is the slip
            return feedback if not feedback.answered or counter.used else kit.wrong(feedback.message, use_counter)
        if not counter.used:
            return kit.wrong(f"{name} never used the counter it was given.", use_counter)
        mistakes = [
            (
                before + EARLIER_BYTES,
                "That is an earlier, larger peak: the counter keeps the most since its last reset, and earlier work "
                "set it. Reset first: counter.reset_peak_memory_stats().",
            ),
            (
                before,
                "That is what the tensors held before the step (weights and AdamW states): read the peak after step().",
            ),
            (
                after,
                "That is the memory in use after the step (memory_allocated, or a reset after it): the activations "
                "are freed by then. Read counter.max_memory_allocated() after step(), with no reset between.",
            ),
            (
                peak - before,
                "That is the peak above what was in use before the step: the weights and AdamW states count too.",
            ),
        ]
        for unit, size in (("GB", GB), ("GiB", 2**30), ("MB", 10**6), ("MiB", 2**20)):
            mistakes.append((peak / size, f"That is in {unit}: return the bytes the counter gives, unconverted."))
        verdict = kit.check_number(
            got, peak, name=f"{name} on {what}", what="a number of bytes", rel_tol=1e-3, mistakes=mistakes, hint=hint
        )
        if not verdict.correct:
            return verdict
        peaks.append(f"{what}, {peak:,} bytes ({timeline.peak.phase})")
    return kit.right(f"{name} reads the peak of each replayed step: {'; '.join(peaks)}.")


# ---- Exercise 2 and going deeper's: what checkpointing keeps, what 8-bit AdamW keeps (SmolLM2-135M, full fine-tuning)
def check_checkpointed_inputs(kept_gb: Any) -> Feedback:
    """Exercise 2: the GB of layer inputs that gradient checkpointing keeps for SmolLM2 at batch 8 x 512."""
    arch = Architecture.from_config("smollm2-135m")
    # the answer: each layer's float32 input, as the estimator counts it
    kept = saved_activations(arch, 8, 512, method="full", checkpointing=True)
    expected = kept.by_kind["checkpointed layer inputs"] / GB
    without = saved_activations(arch, 8, 512, method="full").total / GB
    mistakes = [
        (expected / 4, "That is the count of numbers (in billions); each float32 number takes 4 bytes."),
        (expected / 2, "Full fine-tuning here runs in float32: 4 bytes per number, not 2."),
        (expected / arch.layers, f"One layer's input; checkpointing keeps one for each of the {arch.layers} layers."),
        (
            without,
            "That is everything the layers save *without* checkpointing; with it, each layer keeps only its input "
            "(batch x tokens x hidden numbers).",
        ),
    ]
    hint = "Per layer: batch x tokens x hidden size numbers, 4 bytes each; then times the layers."
    what = "the GB of layer inputs checkpointing keeps"
    return kit.check_number(kept_gb, expected, name="kept_gb", what=what, mistakes=mistakes, unit="GB", hint=hint)


def check_adamw8bit_state(state_gb: Any) -> Feedback:
    """Going deeper's exercise: the GB of optimizer states 8-bit AdamW keeps for SmolLM2-135M, every number trained."""
    n = Architecture.from_config("smollm2-135m").params
    # the answer, from the estimator (small tensors stay float32 there)
    step = estimate_step("smollm2-135m", method="full", optimizer="adamw8bit", batch=1, seq=1, device="cuda")
    expected = step.optimizer_bytes / GB
    slips = {  # bytes per trained number: the hint each one earns
        8: "That is AdamW in float32 (2 states x 4 bytes); 8-bit AdamW keeps 1 byte per state.",
        2: "Close: 2 states x 1 byte is right, but each state also keeps one float32 scale per block of 256 numbers.",
        1: "AdamW keeps two states per trained number (the running mean and the running square).",
        4: "Each 8-bit state takes 1 byte per number, not 2.",
        6: "That is roughly what 8-bit AdamW *saves* (8 - 2 bytes per number); the question asks what it keeps.",
    }
    mistakes = [(per_number * n / GB, slip) for per_number, slip in slips.items()]
    hint = "Per trained number: 2 states x 1 byte, plus 2 x 4 bytes for every block of 256 numbers."
    what = "the GB of 8-bit AdamW states"
    # tight tolerance: forgetting the block scales is only 1.6 % off
    return kit.check_number(
        state_gb, expected, name="state_gb", what=what, rel_tol=0.005, mistakes=mistakes, unit="GB", hint=hint
    )


# -------------------- Exercise 3: Kwame's step - Qwen2.5-1.5B, full fine-tuning, batch 8 x 512 tokens, on a 24 GB GPU
_KWAME_STEP = {"method": "full", "batch": 8, "seq": 512}
_KWAME_GB = 24.0
#: Exercise 3's choices, each as the change it makes to :func:`~course_utils.step_memory.estimate_step`'s arguments.
_KWAME_OPTIONS: dict[str, dict[str, Any]] = {
    "checkpointing": {"checkpointing": True},
    "8-bit AdamW": {"optimizer": "adamw8bit"},
    "bf16 autocast": {"autocast": True},
    "accumulation": {"batch": 1, "accumulation": 8},
    "checkpointing + 8-bit AdamW": {"checkpointing": True, "optimizer": "adamw8bit"},
}


def kwame_estimates_gb() -> dict[str, float]:
    """Exercise 3: the estimated peak (GB, GPU allocator counter) of Kwame's step with each choice."""
    return {
        name: estimate_step("qwen2.5-1.5b-instruct", device="cuda", **{**_KWAME_STEP, **change}).peak_gb
        for name, change in _KWAME_OPTIONS.items()
    }


def check_kwame_choice(choice: Any) -> Feedback:
    """Exercise 3: which one change fits Kwame's full fine-tuning of Qwen2.5-1.5B into 24 GB (usable 23.5 GB)."""
    gb = kwame_estimates_gb()
    usable = datasheets.usable_gb(_KWAME_GB)
    left = {
        "checkpointing": "the AdamW states, the weights and, at the optimizer step, all gradients stay",
        "8-bit AdamW": "the activations saved for backward are the biggest part, and they stay",
        "bf16 autocast": "activations halve, but autocast adds a 16-bit copy of every weight and the states stay",
        "accumulation": "the activations shrink, but the AdamW states, the weights and the gradients stay",
    }
    hints = {}
    for name, why in left.items():
        alone = f"{name[0].upper() + name[1:]} alone: estimated {gb[name]:.1f} GB, still over the usable {usable:g} GB"
        hints[name] = f"{alone} - {why}. The two biggest parts need two tricks."
    # the one that fits, at most 90 % of usable (a test holds it to one, and every other over usable)
    answer = next(name for name, peak in gb.items() if memory.step_verdict(peak, usable) == "fits")
    slower = arithmetic_time_factor("full", "full", False, True)
    why = (
        f"Estimated {gb[answer]:.1f} GB, {100 * gb[answer] / usable:.0f} % of the usable {usable:g} GB: checkpointing "
        f"removes the saved activations, 8-bit AdamW shrinks the states; about {slower:.2f}x the time (one extra "
        "forward)."
    )
    return kit.check_choice(choice, answer, name="choice", options=tuple(_KWAME_OPTIONS), hints=hints, why=why)


# ------------------------------------------------------------ Each trick's step over time, predicted: small multiples
#: The tricks of the small multiples, by their keys in course_utils.tricks.TRICKS.
TIMELINE_TRICKS = ("baseline", "checkpointing", "adamw8bit", "accumulation")


def trick_timelines(config: Any, base: dict[str, Any], device: Any = "cpu") -> dict[str, Timeline]:
    """The predicted timeline of the step ``base`` with each of :data:`TIMELINE_TRICKS`, by the trick's label."""
    from course_utils import tricks  # its measuring half imports torch

    timelines = {}
    for key in TIMELINE_TRICKS:
        est = tricks.estimate_step_for(tricks.trick_kwargs(key, base), config, device)
        timelines[tricks.TRICKS[key].label] = predicted_timeline(est)
    return timelines


def timeline_grid(timelines: dict[str, Timeline]) -> Any:
    """Small multiples: one predicted timeline per trick, on the same y scale, each peak marked."""
    fig, axes = kit.plt.subplots(1, len(timelines), figsize=(3.0 * len(timelines), 2.8), sharey=True)
    for ax, (label, tl) in zip(axes, timelines.items()):
        stack_by_kind(ax, tl, range(len(tl.points)), whole_process=False, step="post")
        ax.plot(tl.points.index(tl.peak), tensor_total(tl.peak) / GB, "x", color="black")
        ax.set(title=label, xlabel=f"moments (peak: {tl.peak.phase})")
    axes[0].set_ylabel("GB of tensors (predicted)")
    return kit.finish(fig, axes[-1], fontsize=7, loc="upper right")
