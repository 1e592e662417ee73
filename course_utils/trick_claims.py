"""Notebook 05's memory tricks as the lesson states them: each trick as one change to a training step, next to the
lesson's claim about it, and the closing table that compares every trick of the course.

Measuring them is :mod:`course_utils.trick_runs`'s job; what the measurements show, in words,
:mod:`course_utils.trick_verdicts`'.
"""

from typing import Any, Mapping, NamedTuple


class Trick(NamedTuple):
    """One trick: what it changes in a step, and the lesson's claim about it."""

    label: str
    change: Mapping[str, Any]
    claim: str


#: The tricks by key. The 16-bit trick keeps the claim's name ("bf16"); its dtype is the device's ("auto": bfloat16
#: on a CPU or Ampere+, float16 with loss scaling on a T4, see course_utils.step_model._step_precision). Labels stay
#: short: every table of notebook 05 prints them. The baseline trains with AdamW, like the other rows.
TRICKS: dict[str, Trick] = {
    "baseline": Trick("baseline (float32)", {}, "the reference step"),
    "checkpointing": Trick(
        "gradient checkpointing", {"checkpointing": True}, "~50 % memory reduction at ~30 % speed cost"
    ),
    "bf16": Trick(
        "16-bit autocast",
        {"autocast": "auto"},
        "roughly 2x speed on hardware that supports it (Ampere+), almost no quality cost",
    ),
    "adamw8bit": Trick(
        "8-bit AdamW", {"optimizer": "adamw8bit"}, "8-bit Adam state; saves a lot when training big models"
    ),
    "compile": Trick(
        "torch.compile", {"compile": True}, "1.2-1.5x speed-up on stable shapes; sometimes hurts on dynamic shapes"
    ),
    "accumulation": Trick(
        "accumulation (4 micro-batches)",
        {"accumulation": 4},
        "big-batch gradients with small-batch memory; the cost is time",
    ),
}

#: The closing table of the module: the lesson's three tricks, then this notebook's three, same columns.
COMPARISON: tuple[tuple[str, str, str, str], ...] = (
    ("Quantization", "How numbers are stored", "Less memory, faster inference", "Some quality loss"),
    (
        "Mixed precision",
        "The precision of the maths",
        "Faster training, less activation memory",
        "Numerical care: loss scaling and the right GPU",
    ),
    (
        "Gradient accumulation",
        "When the weights are updated",
        "Big batches on a small GPU",
        "Slower than a real big batch",
    ),
    (
        "Gradient checkpointing",
        "What is kept for backward",
        "Each layer keeps only its input",
        "One extra forward (~30 % slower)",
    ),
    (
        "8-bit optimizer",
        "How optimizer states are stored",
        "2 instead of 8 bytes per trained number",
        "Needs bitsandbytes; small gain for LoRA",
    ),
    ("torch.compile", "How the step runs", "Faster steps on stable shapes", "Compile time; new shapes recompile"),
)


def comparison_table() -> str:
    """:data:`COMPARISON` as a Markdown table (first three rows: the lesson's)."""
    rows = [("Technique", "What changes?", "Main benefit", "Main trade-off"), ("---",) * 4, *COMPARISON]
    return "\n".join(f"| {' | '.join(row)} |" for row in rows)
