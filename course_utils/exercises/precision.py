"""Auto-checked exercises of notebook 02 (mixed precision): a tiny update on a small weight, and a loss scale.

The expected answers come from :mod:`course_utils.precision` (real torch arithmetic and ``torch.finfo``), not
from numbers typed here.
"""
from __future__ import annotations

from typing import Any

from course_utils import precision
from course_utils.exercises import Feedback, check_choice

# ------------------------------------------------------------------------------ 1. a tiny update on a small weight
#: The exercise: an update of UPDATE on a weight of WEIGHT (a typical initial weight), in the two 16-bit formats.
WEIGHT, UPDATE = 0.02, 1e-5
#: The answers offered, each naming the 16-bit formats in which the update survives.
SURVIVAL_OPTIONS = ("both", "bfloat16 only", "float16 only", "neither")


def survival_answer(w: float = WEIGHT, update: float = UPDATE) -> str:
    """The option naming the 16-bit formats in which ``w - update`` changes the stored weight."""
    bf16, fp16 = (precision.survives(w, update, name) for name in ("bfloat16", "float16"))
    return {(True, True): "both", (True, False): "bfloat16 only", (False, True): "float16 only",
            (False, False): "neither"}[(bf16, fp16)]


def check_small_weight_update(answer: Any) -> Feedback:
    """Check which 16-bit formats keep an update of 1e-5 on a weight of 0.02 (one of SURVIVAL_OPTIONS)."""
    bf16_needs = precision.smallest_surviving_update(WEIGHT, "bfloat16")
    fp16_needs = precision.smallest_surviving_update(WEIGHT, "float16")
    scale = "The gap between neighbouring numbers is relative: about 2^-8 of the weight in bfloat16, 2^-11 in float16."
    hints = {
        "neither": (f"{UPDATE:g} is smaller than the 1e-4 that vanished on a weight of 1.0, but this weight is 50 "
                    f"times smaller, and so are its gaps. {scale}"),
        "both": (f"bfloat16 keeps only 8 significant bits: on {WEIGHT} it needs an update of at least "
                 f"{bf16_needs:.2g}. {scale}"),
        "bfloat16 only": ("bfloat16's strength is range, not precision: it has 3 fewer fraction bits than float16, "
                          f"so its gaps are 8 times wider. {scale}"),
    }
    return check_choice(answer, survival_answer(), name="answer", options=SURVIVAL_OPTIONS, hints=hints,
                        why=f"On {WEIGHT}, bfloat16 needs an update of at least {bf16_needs:.2g}, float16 only "
                            f"{fp16_needs:.2g}: the gaps shrink with the weight, by the same factor in each format.")


# ------------------------------------------------------------------------------ 2. a loss scale for float16
#: The exercise: bring a gradient of TINY_GRADIENT into float16's normal range without overflowing LARGE_GRADIENT.
TINY_GRADIENT, LARGE_GRADIENT = 1e-8, 1.0
#: The loss scales offered (powers of two, as GradScaler uses): 2**10, 2**13, 2**16, 2**20.
SCALE_OPTIONS = (1024, 8192, 65536, 1048576)


def scale_fits(scale: float) -> bool:
    """True when ``TINY_GRADIENT * scale`` is a normal float16 number and ``LARGE_GRADIENT * scale`` is finite."""
    f16 = precision.format_facts("float16")
    tiny = abs(precision.cast_value(TINY_GRADIENT * scale, "float16"))
    large = abs(precision.cast_value(LARGE_GRADIENT * scale, "float16"))
    return tiny >= f16.smallest_normal and large <= f16.max


def scale_answer() -> int:
    """The one option in SCALE_OPTIONS that fits (see :func:`scale_fits`)."""
    fitting = [s for s in SCALE_OPTIONS if scale_fits(s)]
    if len(fitting) != 1:  # guards the exercise itself: exactly one option must be right
        raise RuntimeError(f"expected exactly one fitting loss scale among {SCALE_OPTIONS}, got {fitting}")
    return fitting[0]


def check_loss_scale(answer: Any) -> Feedback:
    """Check the loss scale that lifts a 1e-8 gradient into float16's normal range without overflowing 1.0."""
    f16 = precision.format_facts("float16")
    hints = {
        1024: f"1e-8 x 1,024 is about 1e-5: still subnormal (fewer bits). To reach float16's smallest normal, "
              f"{f16.smallest_normal:.2g}, the scale must be at least {f16.smallest_normal / TINY_GRADIENT:,.0f}.",
        65536: f"The tiny gradient is fine, but the gradient of 1.0 becomes 65,536, above float16's largest value "
               f"{f16.max:,.0f}: inf. GradScaler starts at 65,536 too, and halves the scale when a step overflows "
               "like this.",
        1048576: f"1.0 x 1,048,576 is far above float16's largest value {f16.max:,.0f}: it overflows to inf.",
    }
    expected = scale_answer()
    return check_choice(answer, expected, name="scale", options=SCALE_OPTIONS, hints=hints,
                        why=f"1e-8 x {expected:,} = {TINY_GRADIENT * expected:.2g} is a normal float16 number, and "
                            f"1.0 x {expected:,} stays below {f16.max:,.0f}.")
