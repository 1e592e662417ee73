"""Exercises of notebook 05 (memory tricks): what checkpointing keeps, what 8-bit AdamW stores, which trick fits.

Every expected value comes from the course's estimator (:mod:`course_utils.step_memory`), never retyped, so the
exercises stay true if the estimator's rules change. Nothing here imports torch.
"""
from __future__ import annotations

from typing import Any

from course_utils.architecture import Architecture
from course_utils.bottleneck import arithmetic_time_factor
from course_utils.exercises import Feedback, check_choice, check_number
from course_utils.step_memory import estimate_step, saved_activations
from course_utils.units import GB

#: Exercise 1: SmolLM2-135M, full fine-tuning in float32, batch 8 x 512 tokens, with gradient checkpointing.
CHECKPOINT_CASE = {"config": "smollm2-135m", "batch": 8, "seq": 512}
#: Exercise 2: 8-bit AdamW for SmolLM2-135M with every number trained (full fine-tuning).
ADAMW8BIT_CASE = {"config": "smollm2-135m"}
#: Exercise 3: Kwame's step - Qwen2.5-1.5B, full fine-tuning, batch 8 x 512 tokens, on a 24 GB GPU.
KWAME_CASE = {"config": "qwen2.5-1.5b-instruct", "method": "full", "batch": 8, "seq": 512, "budget_gb": 24.0}
#: Exercise 3's choices, each as the change it makes to :func:`~course_utils.step_memory.estimate_step`'s arguments.
KWAME_OPTIONS: dict[str, dict[str, Any]] = {
    "checkpointing": {"checkpointing": True},
    "8-bit AdamW": {"optimizer": "adamw8bit"},
    "bf16 autocast": {"autocast": True},
    "accumulation": {"batch": 1, "accumulation": 8},
    "checkpointing + 8-bit AdamW": {"checkpointing": True, "optimizer": "adamw8bit"},
}


def checkpointed_inputs_gb() -> float:
    """GB that gradient checkpointing keeps in exercise 1: each layer's float32 input (the estimator's count)."""
    arch = Architecture.from_config(CHECKPOINT_CASE["config"])
    acts = saved_activations(arch, CHECKPOINT_CASE["batch"], CHECKPOINT_CASE["seq"], method="full",
                             checkpointing=True)
    return acts.by_kind["checkpointed layer inputs"] / GB


def check_checkpointed_inputs(kept_gb: Any) -> Feedback:
    """Exercise 1: the GB of layer inputs that gradient checkpointing keeps for SmolLM2 at batch 8 x 512."""
    arch = Architecture.from_config(CHECKPOINT_CASE["config"])
    expected = checkpointed_inputs_gb()
    without = saved_activations(arch, CHECKPOINT_CASE["batch"], CHECKPOINT_CASE["seq"], method="full").total / GB
    mistakes = [
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
        (expected / 4, "That is the count of numbers (in billions); each float32 number takes 4 bytes."),
        (expected / 2, "Full fine-tuning here runs in float32: 4 bytes per number, not 2."),
        (expected / arch.layers, f"That is one layer's input; checkpointing keeps the input of each of the "
                                 f"{arch.layers} layers."),
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (without, "That is everything the layers save *without* checkpointing; with it, each layer keeps only "
                  "its input (batch x tokens x hidden numbers)."),
    ]
    return check_number(kept_gb, expected, name="kept_gb", what="the GB of layer inputs checkpointing keeps",
                        mistakes=mistakes, unit="GB",
                        hint="Per layer: batch x tokens x hidden size numbers, 4 bytes each; then times the layers.")


def adamw8bit_state_gb() -> float:
    """GB of 8-bit AdamW states in exercise 2, from the estimator (small tensors stay float32 there)."""
    est = estimate_step(ADAMW8BIT_CASE["config"], method="full", optimizer="adamw8bit", batch=1, seq=1,
                        device="cuda")
    return est.optimizer_bytes / GB


def check_adamw8bit_state(state_gb: Any) -> Feedback:
    """Exercise 2: the GB of optimizer states 8-bit AdamW keeps for SmolLM2-135M, every number trained."""
    n = Architecture.from_config(ADAMW8BIT_CASE["config"]).params
    expected = adamw8bit_state_gb()
    mistakes = [
        (8 * n / GB, "That is AdamW in float32 (2 states x 4 bytes); 8-bit AdamW keeps 1 byte per state."),
        (2 * n / GB, "Close: 2 states x 1 byte is right, but each state also keeps one float32 scale per block "
                     "of 256 numbers."),
        (n / GB, "AdamW keeps two states per trained number (the running mean and the running square)."),
        (4 * n / GB, "Each 8-bit state takes 1 byte per number, not 2."),
        (6 * n / GB, "That is roughly what 8-bit AdamW *saves* (8 - 2 bytes per number); the question asks what "
                     "it keeps."),
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
    ]
    # tight tolerance: forgetting the block scales is only 1.6 % off
    return check_number(state_gb, expected, name="state_gb", what="the GB of 8-bit AdamW states",
                        rel_tol=0.005, mistakes=mistakes, unit="GB",
                        hint="Per trained number: 2 states x 1 byte, plus 2 x 4 bytes for every block of 256 numbers.")


def kwame_estimates_gb() -> dict[str, float]:
    """Exercise 3: the estimated peak (GB, GPU allocator counter) of Kwame's step with each choice."""
    case = {k: v for k, v in KWAME_CASE.items() if k not in ("config", "budget_gb")}
    return {name: estimate_step(KWAME_CASE["config"], device="cuda", **{**case, **change}).peak_gb
            for name, change in KWAME_OPTIONS.items()}


def kwame_answer() -> str:
    """Exercise 3's answer: the one choice whose estimate fits the budget."""
    fitting = [name for name, gb in kwame_estimates_gb().items() if gb <= KWAME_CASE["budget_gb"]]
    if len(fitting) != 1:  # pragma: no cover - guards the exercise against a change of the estimator
        raise RuntimeError(f"exercise 3 needs exactly one fitting choice, the estimator gives {fitting}")
    return fitting[0]


def check_kwame_choice(choice: Any) -> Feedback:
    """Exercise 3: which one change fits Kwame's full fine-tuning of Qwen2.5-1.5B into 24 GB."""
    gb = kwame_estimates_gb()
    budget = KWAME_CASE["budget_gb"]
    left = {
        "checkpointing": "the AdamW states, the weights and, at the optimizer step, all gradients stay",
        "8-bit AdamW": "the activations saved for backward are the biggest part, and they stay",
        "bf16 autocast": "activations shrink to 2 bytes, but autocast adds a 16-bit copy of every weight and "
                         "the states stay",
        "accumulation": "the activations shrink, but the AdamW states, the weights and the gradients stay",
    }
    hints = {name: f"{name[0].upper() + name[1:]} alone: estimated {gb[name]:.1f} GB, still over {budget:g} GB - "
                   f"{why}. The two biggest parts need two tricks." for name, why in left.items()}
    answer = kwame_answer()
    slower = arithmetic_time_factor("full", "full", False, True)
    return check_choice(choice, answer, name="choice", options=tuple(KWAME_OPTIONS), hints=hints,
                        why=f"Estimated {gb[answer]:.1f} GB: checkpointing removes the saved activations, 8-bit "
                            f"AdamW shrinks the states; about {slower:.2f}x the time (one extra forward).")
