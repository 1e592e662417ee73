"""course_utils.bottleneck: a step or an option "fits" only at <= 90 % of usable memory; 90-100 % is "tight".

The budget given is the GPU's memory; usable is that less the 0.5 GB CUDA context. QLoRA's numbers are left out of
exact checks here (its estimate is refined elsewhere).
"""

from __future__ import annotations

import pytest

from course_utils.bottleneck import what_is_my_bottleneck
from course_utils.step_memory import estimate_step

FULL_8x512 = {"config": "smollm2-135m", "method": "full", "batch": 8}


def _peak(**step) -> float:
    return estimate_step(step.pop("config"), device="cuda", seq=512, **step).peak_gb


@pytest.mark.parametrize("share,verdict", [(0.5, "fits"), (0.89, "fits"), (0.95, "tight"), (1.01, "does not fit")])
def test_the_step_fits_up_to_90_percent_of_usable_and_is_tight_up_to_100(share: float, verdict: str) -> None:
    memory = _peak(**FULL_8x512) / share + 0.5  # a GPU whose usable memory puts the peak at `share` of it
    diag = what_is_my_bottleneck(**FULL_8x512, budget_gb=memory, seq=512)
    assert diag.verdict == verdict and diag.fits == (verdict == "fits")
    assert diag.budget_gb == memory and diag.usable_gb == pytest.approx(memory - 0.5)
    head = diag.text().splitlines()[0]
    assert f"GPU {memory:g} GB, usable {memory - 0.5:.4g} GB: {100 * share:.0f} % of usable" in head
    assert head.endswith(
        {"fits": "of usable", "tight": "tight: it may still run out of memory", "does not fit": "GB over)"}[verdict]
    )
    assert (diag.options == []) == (verdict == "fits")  # tight is not fits: the planner still looks for a fix
    assert ("It fits: no trick needed" in diag.text()) == (verdict == "fits")


def test_a_tight_step_lists_the_options_that_really_fit() -> None:
    memory = _peak(**FULL_8x512) / 0.95 + 0.5
    diag = what_is_my_bottleneck(**FULL_8x512, budget_gb=memory, seq=512)
    assert diag.options and all(o.peak_gb <= 0.9 * diag.usable_gb for o in diag.options if o.fits)
    assert "options (fits: at most 90 % of usable; tight: 90-100 %" in diag.text()
    assert diag.text().splitlines()[3].startswith("  fits   ")


@pytest.mark.parametrize("share,verdict", [(0.89, "fits"), (0.95, "tight"), (1.01, "does not fit")])
def test_an_option_fits_only_up_to_90_percent_of_usable(share: float, verdict: str) -> None:
    # full fine-tuning at batch 16 does not fit; checkpointing alone brings it to `share` of usable memory
    step = {"config": "smollm2-135m", "method": "full", "batch": 16}
    memory = _peak(**step, checkpointing=True) / share + 0.5
    diag = what_is_my_bottleneck(**step, budget_gb=memory, seq=512)
    assert diag.verdict == "does not fit"
    ck = [o for o in diag.options if o.changes == ("gradient checkpointing",)]
    shown = [line[:9] for line in diag.text().splitlines() if line[9:].startswith("gradient checkpointing  ")]
    if verdict == "does not fit":
        assert ck == [] or ck[0].verdict == "does not fit"
        assert shown == []  # shown nowhere
    else:
        assert [o.verdict for o in ck] == [verdict] and ck[0].fits == (verdict == "fits")
        assert shown == [f"  {verdict:<5}  "]


def test_notebook_05s_8_gb_case_checkpointing_alone_is_tight() -> None:
    """SmolLM2 full fine-tuning at 16 x 512 on an 8 GB GPU (usable 7.5 GB): checkpointing alone, 7.07 GB, is 94 %."""
    diag = what_is_my_bottleneck("smollm2-135m", "full", 16, 8.0, seq=512)
    assert diag.verdict == "does not fit" and diag.usable_gb == 7.5
    fitting = [o for o in diag.options if o.fits]
    # float32 attention with grouped-query heads runs SDPA's math backend on a GPU: the s x s scores are kept, so
    # micro-batches of 4 (7.43 GB, 99 % of usable) are only tight, micro-batches of 2 fit
    assert diag.estimate.attention.backend == "math"
    assert fitting[0].changes == ("micro-batch 2 x 8 accumulation steps",) and not fitting[0].method_changed
    assert all(o.peak_gb <= 0.9 * 7.5 for o in fitting)
    ck = next(o for o in diag.options if o.changes == ("gradient checkpointing",))
    assert ck.verdict == "tight" and round(ck.peak_gb, 2) == 7.07 and not ck.fits
    assert ("gradient checkpointing", "8-bit AdamW") in [o.changes for o in fitting]  # the pair fits where one is tight
    text = diag.text()
    assert text.splitlines()[0].endswith(
        "(GPU allocator counter; math attention); GPU 8 GB, "
        "usable 7.5 GB: 303 % of usable, it does not fit (15.24 GB over)"
    )
    assert text.splitlines()[3].startswith("  fits   micro-batch 2 x 8 accumulation steps  ")
    assert text.splitlines()[-1].startswith("  tight  gradient checkpointing  ")
    # ranking: every fitting option before every tight one, the same method before a new one
    verdicts = [o.verdict for o in diag.options]
    assert verdicts == sorted(verdicts, key=["fits", "tight", "does not fit"].index)


def test_a_tight_option_gives_way_to_the_same_changes_that_fit() -> None:
    """Kwame (05): 8-bit AdamW with micro-batches of 2 is 22.95 GB, tight on 24 GB; with micro-batches of 1 it fits."""
    diag = what_is_my_bottleneck("qwen2.5-1.5b-instruct", "full", 8, 24.0, seq=512)
    assert diag.usable_gb == 23.5
    eight_bit = [o for o in diag.options if "8-bit AdamW" in o.changes and o.kinds == {"adamw8bit", "accumulation"}]
    assert [(o.verdict, o.changes[1]) for o in eight_bit] == [("fits", "micro-batch 1 x 8 accumulation steps")]
    assert diag.options[0].changes == ("gradient checkpointing", "8-bit AdamW") and diag.options[0].fits


def test_the_budget_is_the_cards_memory_and_must_exceed_the_cuda_context() -> None:
    with pytest.raises(ValueError, match=r"^budget_gb must be a finite number > 0.5"):
        what_is_my_bottleneck("smollm2-135m", "full", 8, 0.5)
    with pytest.raises(ValueError, match="budget_gb"):
        what_is_my_bottleneck("smollm2-135m", "full", 8, 1e30)
    cpu = what_is_my_bottleneck("smollm2-135m", "lora", 1, 16.0, seq=128, device="cpu")
    assert cpu.usable_gb == 16.0 and cpu.fits  # a CPU has no CUDA context: the whole memory
    assert "(CPU process memory; flash attention); budget 16 GB: 8 % of it\nIt fits" in cpu.text()
    assert "usable" not in cpu.text()
