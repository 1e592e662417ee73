"""Exercises of notebook 04 (memory budgets): a model's training memory three ways, and the method that fits.

Every expected value comes from the course's estimator (:func:`course_utils.memory.estimate` and
:func:`course_utils.memory.fits`), never retyped, so the exercises stay true if the estimator's rules change.
Nothing here imports torch.
"""
from __future__ import annotations

from typing import Any, Sequence

from course_utils import checks
from course_utils import memory as mem
from course_utils.exercises import Feedback, check_choice, check_number, right, unanswered
from course_utils.units import GB

#: Exercise 1: a model of 3 billion parameters (not in the table), trained three ways; LoRA's adapter is assumed
#: at the lesson's share of the model (0.34 %, rank 8).
THREE_WAYS_PARAMS = 3_000_000_000
#: Exercise 1's answers: (variable name in the notebook, method).
THREE_WAYS = (("full_gb", "full"), ("lora_gb", "lora"), ("qlora_gb", "qlora"))
#: How close an answer must be, per method. LoRA's adapter is 1 % of its total, so its tolerance is tighter.
REL_TOL = {"full": 0.02, "lora": 0.005, "lora-bf16": 0.01, "qlora": 0.015}

#: Exercise 2 tries the methods in this order and takes the first whose estimate fits: each step down the list
#: gives up something (training every weight, then the precision of the frozen weights).
ORDER: tuple[str, ...] = tuple(mem.METHODS)
#: Exercise 2's options: a method, or "none" when no method fits.
CHOICES: tuple[str, ...] = (*ORDER, "none")
#: Exercise 2's cases: (variable name in the notebook, model of the lesson's table, memory in GB).
FIT_CASES = (("method_8gb", "a 1.7B model", 8.0), ("method_48gb", "a 70B model", 48.0))


# --------------------------------------------------------------------------------------------
# Exercise 1: a 3B model, three ways
# --------------------------------------------------------------------------------------------
def training_gb(method: str, params: float = THREE_WAYS_PARAMS) -> float:
    """The estimator's GB for training ``params`` parameters with ``method`` (LoRA's adapter assumed, rank 8)."""
    return mem.estimate(params, method).gb


def memory_mistakes(method: str, params: float = THREE_WAYS_PARAMS) -> list[tuple[float, str]]:
    """Typical wrong answers (GB) for :func:`training_gb` and the hint each one earns, most telling first.

    A slip that lands within the tolerance of the right answer, or of a slip listed before it, is left out: no
    answer can tell them apart.
    """
    meth = mem.METHODS[checks.choice(method, "method", mem.METHODS)]
    n = checks.positive(params, "params")
    expected = training_gb(method, n)
    slips: list[tuple[float, str]] = []
    if meth.trains_all:
        slips += [
            (12 * n / GB, "12 bytes per parameter: one of the four numbers is missing. Each trained weight keeps "
                          "itself (4 bytes), its gradient (4) and AdamW's two running averages (4 + 4)."),
            (8 * n / GB, "8 bytes per parameter: two of the four numbers are missing. AdamW keeps two running "
                         "averages per weight (8 bytes), on top of the weight and its gradient."),
            (4 * n / GB, "That is the weights alone. Training adds a gradient and AdamW's two averages to each "
                         "weight: 16 bytes in all."),
        ]
    else:
        base = meth.base_bytes
        adapter = mem.assumed_adapter_params(n)
        slips += [
            (base * n / GB, f"That is the frozen weights alone ({base:g} bytes each). Add the adapter: 12 bytes "
                            "(gradient + AdamW's two averages) for each of its numbers, 0.34 % of the model."),
            ((base + 12) * n / GB, "You gave every weight a gradient and AdamW states. The base is frozen: only the "
                                   "adapter's numbers (0.34 % of the model) get them."),
            ((base + 8) * n / GB, "You counted AdamW's states for the whole model. Only the adapter is trained, so "
                                  "only its numbers (0.34 % of the model) get states."),
            (12 * adapter / GB, f"That is the adapter alone. The frozen base is still in memory, at {base:g} bytes "
                                "a weight."),
            ((base * n + 4 * adapter) / GB, "You left out AdamW's two states for the adapter: 8 bytes per adapter "
                                            "number."),
            ((base * n + 8 * adapter) / GB, "You left out the adapter's gradients: 4 bytes per adapter number."),
        ]
        for other, bytes_text in (("lora", "float32, 4 bytes"), ("lora-bf16", "bfloat16, 2 bytes"),
                                  ("qlora", "4 bits, half a byte")):
            if other != method:
                slips.append((training_gb(other, n), f"That counts the base in {bytes_text} a weight; "
                                                     f"{meth.label} stores it at {base:g} bytes a weight."))
    slips += [
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
    ]
    tol = REL_TOL[method]
    kept: list[tuple[float, str]] = []
    for value, why in slips:
        if all(abs(value - v) > tol * max(abs(value), abs(v)) for v in [expected] + [k for k, _ in kept]):
            kept.append((value, why))
    return kept


def check_training_gb(answer_gb: Any, method: str, params: float = THREE_WAYS_PARAMS, *,
                      name: str = "answer_gb") -> Feedback:
    """Check one training-memory answer in GB against the estimator, with a hint for each usual slip."""
    method = checks.choice(method, "method", mem.METHODS)
    label = mem.METHODS[method].label
    return check_number(answer_gb, training_gb(method, params), name=name, unit="GB",
                        what=f"the GB of {label} (a number)", rel_tol=REL_TOL[method],
                        mistakes=memory_mistakes(method, params),
                        hint="Full fine-tuning: 16 bytes per parameter. LoRA and QLoRA: the frozen base (4 or 0.5 "
                             "bytes a weight) + 12 bytes per adapter number (0.34 % of the model). GB = 10^9 bytes.")


def _together(results: Sequence[tuple[str, Feedback]], what: str) -> Feedback:
    """One verdict for several answers: the first that is not right (saying which are), or all right."""
    names = [name for name, _ in results]
    if all(not fb.answered for _, fb in results):
        return unanswered(", ".join(names[:-1]) + " and " + names[-1], what)
    done: list[str] = []
    for name, fb in results:
        if not fb.correct:
            prefix = f"{' and '.join(done)} {'is' if len(done) == 1 else 'are'} right; " if done else ""
            return Feedback(False, prefix + fb.message, fb.hint, fb.answered)
        done.append(name)
    return right(" ".join(fb.message for _, fb in results))


def check_three_ways(full_gb: Any, lora_gb: Any, qlora_gb: Any) -> Feedback:
    """Exercise 1: the training memory (GB) of a 3B model with full fine-tuning, LoRA (float32 base) and QLoRA."""
    answers = {"full_gb": full_gb, "lora_gb": lora_gb, "qlora_gb": qlora_gb}
    return _together([(name, check_training_gb(answers[name], method, name=name)) for name, method in THREE_WAYS],
                     "numbers of GB")


# --------------------------------------------------------------------------------------------
# Exercise 2: the method that fits
# --------------------------------------------------------------------------------------------
def _model(name: str) -> mem.ModelSize:
    return next(m for m in mem.MODELS if m.name == checks.choice(name, "model", [m.name for m in mem.MODELS]))


def best_method(params: float, budget_gb: float) -> str:
    """The first method of :data:`ORDER` whose estimate fits ``budget_gb`` (at most 70 % of it), else 'none'."""
    budget_gb = checks.positive(budget_gb, "budget_gb")
    return next((m for m in ORDER if mem.estimate(params, m).fits(budget_gb)), "none")


def choice_hints(params: float, budget_gb: float) -> dict[str, str]:
    """The hint each wrong option earns, from the estimates: over the budget, inside it but over 70 %, or too far."""
    answer = best_method(params, budget_gb)
    usable = mem.usable_gb(budget_gb)
    est = {m: mem.estimate(params, m) for m in ORDER}
    hints: dict[str, str] = {}
    for m in ORDER:
        gb, label = est[m].gb, est[m].label[0].upper() + est[m].label[1:]
        if gb > budget_gb:
            hints[m] = f"{label} needs {gb:.2f} GB: more than the whole {budget_gb:g} GB."
        elif gb > usable:
            hints[m] = (f"{label} needs {gb:.2f} GB: under {budget_gb:g} GB, but over the usable 70 % "
                        f"({usable:g} GB). The other 30 % is for activations and the program itself.")
        elif m != answer:
            hints[m] = (f"{label} fits ({gb:.2f} GB), but {est[answer].label} fits too ({est[answer].gb:.2f} GB) "
                        "and comes first in the order: it gives up less.")
    if answer != "none":
        hints["none"] = (f"{est[answer].label} needs {est[answer].gb:.2f} GB, within the usable 70 % of "
                         f"{budget_gb:g} GB ({usable:g} GB).")
    return hints


def check_method_for(answer: Any, model: str, budget_gb: float, *, name: str = "method") -> Feedback:
    """Check a choice among :data:`CHOICES`: the first method in :data:`ORDER` that fits ``model`` in ``budget_gb``."""
    params = _model(model).params
    expected = best_method(params, budget_gb)
    if expected == "none":
        why = f"Even QLoRA needs {mem.estimate(params, 'qlora').gb:.2f} GB, over {mem.usable_gb(budget_gb):g} GB."
    else:
        why = (f"{mem.estimate(params, expected).label}: {mem.estimate(params, expected).gb:.2f} GB, within "
               f"{mem.usable_gb(budget_gb):g} GB.")
    return check_choice(answer, expected, name=name, options=CHOICES, hints=choice_hints(params, budget_gb), why=why)


def check_best_methods(method_8gb: Any, method_48gb: Any) -> Feedback:
    """Exercise 2: the first method that fits the 1.7B model on an 8 GB laptop, and the 70B model on a 48 GB GPU."""
    answers = {"method_8gb": method_8gb, "method_48gb": method_48gb}
    return _together([(name, check_method_for(answers[name], model, gb, name=name)) for name, model, gb in FIT_CASES],
                     "one of " + ", ".join(repr(c) for c in CHOICES))
