"""The predicted timeline of one step (course_utils.timeline): one model with the step estimate, so the same peak."""

from __future__ import annotations

import itertools

import pytest

from course_utils.step_memory import estimate_step
from course_utils.timeline import KINDS, PHASES, Timeline, TimelinePoint, predicted_timeline, tensor_total

STEPS = [
    dict(method=method, batch=batch, seq=seq, checkpointing=ck, accumulation=acc, device=dev, attention=att)
    for method, batch, seq, ck, acc, dev, att in itertools.product(
        ["full", "lora", "qlora", "full-bf16"],
        [1, 16],
        [32, 1024],
        [False, True],
        [1, 4],
        ["cpu", "cuda"],
        ["flash", "math"],
    )
]


@pytest.mark.parametrize("config", ["smollm2-135m", "qwen2.5-1.5b-instruct"])
def test_the_timelines_peak_is_the_estimates_peak(config: str) -> None:
    """Every step shape: the same bytes at the same moment (the moments are the estimate's own)."""
    for step in STEPS:
        est = estimate_step(config, **step)
        peak = predicted_timeline(est).peak
        assert (peak.total, peak.label) == (est.peak_bytes, est.peak_moment), step


def test_phases_run_in_order_and_the_fixed_parts_stay() -> None:
    est = estimate_step("smollm2-135m", method="full", batch=8, seq=128)
    tl = predicted_timeline(est)
    order = [PHASES.index(p.phase) for p in tl.points]
    assert order == sorted(order) and set(order) == set(range(len(PHASES)))
    assert {p.by_kind["weights"] for p in tl.points} == {est.weights_bytes}
    assert {p.by_kind["optimizer states"] for p in tl.points} == {est.optimizer_bytes}  # the steady state
    forward = [p.by_kind["activations"] for p in tl.points if p.phase == "forward"]
    logits = 8 * 128 * est.arch.vocab * 4  # the model's float32 output, alive at the loss
    assert forward == sorted(forward) and forward[-1] == est.activations.total + logits  # they pile up, layer by layer
    backward = [p for p in tl.points if p.label.endswith(" backward") and p.label.startswith("layer")]
    assert len(backward) == est.arch.layers
    assert [p.by_kind["gradients"] for p in backward] == sorted(p.by_kind["gradients"] for p in backward)
    assert tl.points[-1].by_kind.get("gradients", 0) == 0  # zero_grad(set_to_none=True) frees them


def test_each_trick_changes_its_own_kind() -> None:
    """Checkpointing lowers the activations; 8-bit AdamW the optimizer states; accumulation keeps gradients alive."""
    base = dict(method="full", batch=8, seq=256, device="cuda")
    plain = predicted_timeline(estimate_step("smollm2-135m", **base))
    ck = predicted_timeline(estimate_step("smollm2-135m", **base, checkpointing=True))
    eight = predicted_timeline(estimate_step("smollm2-135m", **base, optimizer="adamw8bit"))
    acc = predicted_timeline(estimate_step("smollm2-135m", **{**base, "batch": 2}, accumulation=4))
    assert ck.kind_max("activations") < plain.kind_max("activations") / 3
    assert eight.kind_max("optimizer states") < plain.kind_max("optimizer states") / 3
    assert acc.points[0].by_kind["gradients"] > 0 == plain.points[0].by_kind["gradients"]


def test_tensor_total_leaves_out_the_framework() -> None:
    est = estimate_step("smollm2-135m", batch=2, seq=64)  # a CPU estimate: the process's own memory included
    point = predicted_timeline(est).points[0]
    assert point.by_kind["framework"] == est.baseline_bytes + est.runtime_bytes > 0
    assert tensor_total(point) == point.total - point.by_kind["framework"]
    assert set(point.by_kind) <= set(KINDS)


def test_a_timeline_finds_its_peak() -> None:
    tl = Timeline(
        [TimelinePoint("a", "forward", {"activations": 2}), TimelinePoint("b", "backward", {"activations": 3})],
        "two points",
    )
    assert tl.peak.label == "b" and tl.kind_max("activations") == 3 and tl.kind_max("weights") == 0
