"""Notebook 05's auto-checked exercises: the right answer, the placeholder, and the typical slips with their hints."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.architecture import Architecture
from course_utils.lessons import memory_tricks as ex
from course_utils.step_memory import estimate_step, saved_activations
from course_utils.units import GB

SMOL = Architecture.from_config("smollm2-135m")


def test_checkpointed_inputs_is_each_layers_float32_input() -> None:
    # by hand: 30 layers x batch 8 x 512 tokens x hidden 576, 4 bytes each - the estimator agrees exactly
    kept = saved_activations(SMOL, 8, 512, method="full", checkpointing=True)
    assert kept.by_kind["checkpointed layer inputs"] == 30 * 8 * 512 * 576 * 4


def test_check_checkpointed_inputs() -> None:
    assert ex.check_checkpointed_inputs(30 * 8 * 512 * 576 * 4 / 1e9)
    assert ex.check_checkpointed_inputs(0.283)
    placeholder = ex.check_checkpointed_inputs(...)
    assert not placeholder and not placeholder.answered and str(placeholder).startswith("Not answered yet")
    for value, hint in (
        (0.0708, "4 bytes"),
        (0.1416, "not 2"),
        (0.00944, "each of the 30 layers"),
        (0.2637, "GiB"),
        (283_115_520, "bytes"),
        (6.31, "without"),
    ):
        fb = ex.check_checkpointed_inputs(value)
        assert not fb and fb.answered and hint in fb.hint, (value, fb)
    assert "batch x tokens x hidden" in ex.check_checkpointed_inputs(0.5).hint
    assert "finite number" in ex.check_checkpointed_inputs("0.28").message


def test_adamw8bit_state_counts_bytes_and_block_scales() -> None:
    n = SMOL.params
    simple = (2 * n + 2 * 4 * math.ceil(n / 256)) / GB  # the formula the notebook asks for
    est = estimate_step("smollm2-135m", method="full", optimizer="adamw8bit", batch=1, seq=1, device="cuda")
    assert est.optimizer_bytes / GB == pytest.approx(simple, rel=0.002)
    assert ex.check_adamw8bit_state(simple)


def test_check_adamw8bit_state() -> None:
    n = SMOL.params
    assert ex.check_adamw8bit_state(0.2734)
    assert not ex.check_adamw8bit_state(None).answered
    for value, hint in (
        (2 * n / GB, "block of 256"),
        (8 * n / GB, "float32"),
        (n / GB, "two states"),
        (4 * n / GB, "not 2"),
        (6 * n / GB, "saves"),
        (0.2547, "GiB"),
    ):
        fb = ex.check_adamw8bit_state(value)
        assert not fb and fb.answered and hint in fb.hint, (value, fb)
    assert ex.check_adamw8bit_state(0.5).hint.startswith("Per trained number")


def step_peak(step, counter=torch.cuda):
    """The notebook's worked solution, as written there."""
    counter.reset_peak_memory_stats()  # 1. forget earlier peaks
    step()  # 2. train one step
    return counter.max_memory_allocated()  # 3. the most bytes tensors held since the reset


def _replayed_peaks() -> dict[bool, tuple[int, int, int]]:
    """(before, peak, after) bytes of the replayed miniature step, without and with checkpointing (GPU counter)."""
    out = {}
    for checkpointing in (False, True):
        est = estimate_step(
            MINI_CASE["config"], method="full", batch=4, seq=256, checkpointing=checkpointing, device="cuda"
        )
        before = est.weights_bytes + est.optimizer_bytes
        out[checkpointing] = (before, est.peak_bytes, before + est.grads_bytes)
    return out


def test_the_replayed_step_makes_every_slip_a_different_number() -> None:
    """The peak is the step estimate's; each slip reads another number, at least ten times the 0.1 % tolerance away."""
    for before, peak, after in _replayed_peaks().values():
        readings = [
            peak,
            before + ex.EARLIER_BYTES,
            before,
            after,
            peak - before,
            peak / 1e9,
            peak / 2**20,
            peak / 1e6,
            peak / 2**30,
        ]
        for i, a in enumerate(readings):
            assert all(not math.isclose(a, b, rel_tol=0.01) for b in readings[i + 1 :]), readings


def test_check_step_peak_passes_the_worked_solution_and_other_correct_forms() -> None:
    fb = ex.check_step_peak(step_peak)
    peaks = _replayed_peaks()
    assert fb and str(fb) == (
        f"Right: step_peak reads the peak of each replayed step: the baseline step, "
        f"{peaks[False][1]:,} bytes (backward); the step with checkpointing, "
        f"{peaks[True][1]:,} bytes (optimizer step)."
    )

    def with_sync(step, counter=torch.cuda):
        counter.synchronize()
        counter.reset_peak_memory_stats()
        step()
        counter.synchronize()
        return float(counter.max_memory_allocated())

    def as_tensor(step, counter=torch.cuda):
        counter.reset_peak_memory_stats()
        step()
        return torch.tensor([counter.max_memory_allocated()], dtype=torch.float64)  # a one-value tensor

    def two_steps(step, counter=torch.cuda):  # a second step cannot raise the peak of the same step
        counter.reset_peak_memory_stats()
        step()
        step()
        return counter.max_memory_allocated()

    for fn in (with_sync, as_tensor, two_steps):
        assert ex.check_step_peak(fn), fn


def test_check_step_peak_stub_says_not_answered() -> None:
    def stub(step, counter=torch.cuda):
        raise NotImplementedError  # your code here

    fb = ex.check_step_peak(stub)
    assert not fb and not fb.answered
    assert str(fb) == (
        "Not answered yet: replace the `raise NotImplementedError` line in step_peak with your code, "
        "then run this cell again."
    )
    assert not ex.check_step_peak(...).answered


def _no_reset(step, counter):
    step()
    return counter.max_memory_allocated()


def _read_before(step, counter):
    counter.reset_peak_memory_stats()
    peak = counter.max_memory_allocated()
    step()
    return peak


def _in_use_after(step, counter):
    counter.reset_peak_memory_stats()
    step()
    return counter.memory_allocated()


def _reset_after(step, counter):
    counter.reset_peak_memory_stats()
    step()
    counter.reset_peak_memory_stats()
    return counter.max_memory_allocated()


def _above_start(step, counter):
    counter.reset_peak_memory_stats()
    start = counter.memory_allocated()
    step()
    return counter.max_memory_allocated() - start


def _in_unit(size):
    def fn(step, counter):
        counter.reset_peak_memory_stats()
        step()
        return counter.max_memory_allocated() / size

    return fn


@pytest.mark.parametrize(
    "slip,hint",
    [
        (_no_reset, "That is an earlier, larger peak"),
        (_read_before, "That is what the tensors held before the step"),
        (_in_use_after, "That is the memory in use after the step"),
        (_reset_after, "That is the memory in use after the step"),
        (_above_start, "That is the peak above what was in use before the step"),
        (_in_unit(1e9), "That is in GB:"),
        (_in_unit(2**30), "That is in GiB:"),
        (_in_unit(1e6), "That is in MB:"),
        (_in_unit(2**20), "That is in MiB:"),
    ],
)
def test_check_step_peak_names_each_slip(slip, hint: str) -> None:
    fb = ex.check_step_peak(slip)
    assert not fb and fb.answered
    assert "step_peak on the baseline step = " in fb.message and "is a common slip" in fb.message
    assert fb.hint.startswith(hint), fb


def test_check_step_peak_other_wrong_answers() -> None:
    def torch_cuda_itself(step, counter=torch.cuda):  # ignores the counter it is given: raises on a CPU
        torch.cuda.reset_peak_memory_stats()
        step()
        return torch.cuda.max_memory_allocated()

    fb = ex.check_step_peak(torch_cuda_itself)
    assert not fb and fb.answered and "raised" in fb.message and fb.hint.startswith("Call the counter argument's")
    fb = ex.check_step_peak(lambda step, counter: (step(), 567_000_000)[1])  # a number typed in
    assert not fb and "never used the counter" in fb.message
    fb = ex.check_step_peak(lambda step, counter: counter.max_memory_reserved())
    assert not fb and "max_memory_reserved" in fb.message and "counter.max_memory_allocated()" in fb.hint

    def minus_after(step, counter):
        counter.reset_peak_memory_stats()
        step()
        return counter.max_memory_allocated() - counter.memory_allocated()

    fb = ex.check_step_peak(minus_after)
    assert not fb and "is not it" in fb.message and fb.hint.startswith("Three lines:")
    assert "finite number" in ex.check_step_peak(lambda step, counter: str(counter.memory_allocated())).message

    def right_only_without_the_trick(step, counter):  # the checkpointing step catches a number typed in
        counter.reset_peak_memory_stats()
        step()
        return _replayed_peaks()[False][1]

    fb = ex.check_step_peak(right_only_without_the_trick)
    assert not fb and "on the step with checkpointing" in fb.message


def test_kwame_has_one_fitting_choice_and_the_others_do_not_fit() -> None:
    # 24 GB GPU: usable 23.5 GB; fits up to 90 % of it (21.15 GB). No choice is merely "tight".
    verdicts = {k: ex.memory.step_verdict(v, 23.5) for k, v in ex.kwame_estimates_gb().items()}
    assert verdicts == {
        "checkpointing": "does not fit",
        "8-bit AdamW": "does not fit",
        "bf16 autocast": "does not fit",
        "accumulation": "does not fit",
        "checkpointing + 8-bit AdamW": "fits",
    }


def test_check_kwame_choice() -> None:
    right = ex.check_kwame_choice("Checkpointing + 8-bit AdamW ")  # case and spaces do not matter
    assert right and "1.33x" in str(right) and "% of the usable 23.5 GB" in str(right)
    assert not ex.check_kwame_choice(...).answered
    for wrong, says in (
        ("checkpointing", "states"),
        ("8-bit AdamW", "activations"),
        ("bf16 autocast", "16-bit copy"),
        ("accumulation", "gradients stay"),
    ):
        fb = ex.check_kwame_choice(wrong)
        assert not fb and fb.answered and "still over the usable 23.5 GB" in fb.hint and says in fb.hint, (wrong, fb)
    other = ex.check_kwame_choice("LoRA")
    assert not other and "not one of the options" in other.message


#: 05's miniature of SmolLM2: 4 of its 30 layers, a vocabulary of 8,192.
MINI_CASE = {"config": ex.miniature()}


# --------------------------------------------------------------------------------------------
# Charts and the bottleneck planner (its callback is a plain function)
# --------------------------------------------------------------------------------------------
def test_timeline_chart_marks_both_peaks_and_the_text_names_their_phases() -> None:
    import matplotlib.pyplot as plt

    from course_utils.timeline import Timeline, TimelinePoint, predicted_timeline

    predicted = predicted_timeline(estimate_step(MINI_CASE["config"], method="full", batch=4, seq=256))
    points = [
        TimelinePoint("start", "before the step", {"weights": 100}),
        TimelinePoint("fwd", "forward", {"weights": 100, "activations": 300}),
        TimelinePoint("bwd", "backward", {"weights": 100, "activations": 250, "temporaries": 80}),
        TimelinePoint("opt", "optimizer step", {"weights": 100, "gradients": 90}),
    ]
    measured = Timeline(points, "made up", times_s=[0.0, 0.1, 0.2, 0.3])
    fig = ex.timeline_chart(predicted, measured)
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert notes == ["predicted peak: backward", "measured peak: backward"]
    assert fig.axes[0].get_xlabel() == "seconds into the step"
    plt.close(fig)
    text = ex.timeline_text(predicted, measured)
    assert "Measured peak 0.00 GB in backward (bwd)" in text and "predicted peak" in text and "%" in text
    assert ex.timeline_text(predicted).splitlines()[1].startswith("Predicted peak ")


def test_trick_timelines_each_shrink_their_kind() -> None:
    import matplotlib.pyplot as plt

    tls = ex.trick_timelines(MINI_CASE["config"], {"method": "full", "batch": 4, "seq": 256})
    plain, ck, eight, acc = tls.values()
    assert ck.kind_max("activations") < plain.kind_max("activations")
    assert eight.kind_max("optimizer states") < plain.kind_max("optimizer states") / 3
    assert acc.points[0].by_kind["gradients"] > 0
    fig = ex.timeline_grid(tls)
    assert len(fig.axes) == 4 and all(ax.get_xlabel().startswith("moments (peak: ") for ax in fig.axes)
    plt.close(fig)


def test_bottleneck_view_prints_the_diagnosis_and_draws_with_04s_chart(capsys, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
    text = ex.bottleneck_view("smollm2-135m", "full", 16, 512, 8.0, show_chart=False)
    assert "does not fit" in capsys.readouterr().out and "gradient checkpointing" in text
    assert not plt.get_fignums()
    monkeypatch.setattr(plt, "show", lambda: None)
    ex.bottleneck_view("smollm2-135m", "full", 16, 512, 8.0)
    ax = plt.gcf().axes[0]
    assert ax.get_title() == "Predicted peak of one training step: smollm2-135m"
    assert [line.get_ydata()[0] for line in ax.get_lines()] == [7.5]  # usable: 8 GB less the 0.5 GB CUDA context
    assert ax.get_legend().get_texts()[0].get_text() == "GPU 8 GB, usable 7.5 GB: does not fit"
    plt.close("all")
    with pytest.raises(ValueError, match="batch"):
        ex.bottleneck_view(batch=1000, show_chart=False)
    with pytest.raises(ValueError, match="config"):
        ex.bottleneck_view(config="gpt-5", show_chart=False)


def test_bottleneck_planner_has_04s_step_controls_and_a_budget(capsys) -> None:
    import matplotlib.pyplot as plt

    box = ex.bottleneck_planner()
    controls = {c.description: c for c in box.children[0].children}
    assert list(controls) == ["model", "method", "batch", "tokens", "optimizer", "gradient checkpointing", "GB"]
    assert [key for _, key in controls["method"].options] == list(ex.memory.METHODS)
    capsys.readouterr()
    controls["GB"].value = 8.0
    assert "GPU 8 GB, usable 7.5 GB" in capsys.readouterr().out
    plt.close("all")
