"""Notebook 04's auto-checked exercises: the right answer, the placeholder, and the typical slips with their hints."""

from __future__ import annotations

import pytest

from course_utils import memory as mem
from course_utils.lessons import memory_budget as ex


def bytes_per_parameter(base_bits, trained):
    """The notebook's worked solution, as written there."""
    if trained:
        return 4 + 4 + 4 + 4  # float32: the number, its gradient, AdamW's two averages
    return base_bits / 8  # a frozen weight: itself only, 8 bits a byte


def test_bytes_cases_are_the_estimators_figures() -> None:
    """The worked solution's bytes are memory.py's: 16 per parameter in full fine-tuning; a LoRA method's estimate
    is its frozen base at these bytes plus 12 per adapter number (the adapter's own 4 bytes left out there)."""
    n = mem.SMOLLM2_PARAMS
    assert [m for _, _, m, _ in ex.BYTES_CASES] == ["full", "lora", "lora-bf16", "qlora", "lora-bf16", "qlora"]
    assert mem.estimate(n, "full").gb * 1e9 == pytest.approx(n * bytes_per_parameter(32, True))
    for bits, trained, method, _ in ex.BYTES_CASES:
        if not trained:
            est = mem.estimate(n, method)
            assert est.gb * 1e9 == pytest.approx(n * bytes_per_parameter(bits, False) + 12 * est.trained)
        assert mem.METHODS[method].trained_bytes * 4 == bytes_per_parameter(bits, True) == 16


def test_check_bytes_per_parameter_passes_the_worked_solution_and_other_correct_forms() -> None:
    import numpy as np
    import torch

    fb = ex.check_bytes_per_parameter(bytes_per_parameter)
    assert fb and str(fb).startswith("Right: bytes_per_parameter gives each method's bytes on all 6 cases")
    others = [
        lambda bits, trained: 16.0 if trained else bits * 0.125,
        lambda bits, trained: torch.tensor(16) if trained else torch.tensor([bits / 8]),  # one-value tensors
        lambda bits, trained: np.float32(4 * 4 if trained else bits / 8),
        lambda bits, trained: (32 + 32 + 32 + 32) / 8 if trained else bits / 8,
    ]
    for fn in others:
        assert ex.check_bytes_per_parameter(fn), fn


def test_check_bytes_per_parameter_stub_says_not_answered() -> None:
    def stub(base_bits, trained):
        raise NotImplementedError  # your code here

    fb = ex.check_bytes_per_parameter(stub)
    assert not fb and not fb.answered
    assert str(fb) == (
        "Not answered yet: replace the `raise NotImplementedError` line in bytes_per_parameter with "
        "your code, then run this cell again."
    )
    assert not ex.check_bytes_per_parameter(...).answered
    assert not ex.check_bytes_per_parameter(lambda bits, trained: None).answered


@pytest.mark.parametrize(
    "slip,case,hint",
    [
        (lambda b, t: 4 + 4 + 4 if t else b / 8, "(32, True) = 12", "Forgot the gradient, or counted one average?"),
        (lambda b, t: 4 + 4 if t else b / 8, "(32, True) = 8", "AdamW's two running averages are missing"),
        (lambda b, t: b / 8, "(32, True) = 4", "That is the number alone"),
        (lambda b, t: b / 8 + 12 if t else b / 8, "(16, True) = 14", "The method keeps it in float32"),
        (
            lambda b, t: 4 * b / 8 if t else b / 8,
            "(16, True) = 8",
            "All four numbers in 16 bits? Only the frozen base is",
        ),
        (lambda b, t: b / 8 + 12 if t else b / 8, "(16, True) = 14", "the copy the optimizer updates"),
        (lambda b, t: 16 if t else b / 8 + 8, "(32, False) = 12", "AdamW's states for a frozen weight"),
        (lambda b, t: 16 if t else b / 8 + 4, "(32, False) = 8", "You gave the frozen weight a gradient:"),
        (lambda b, t: 16, "(32, False) = 16", "two averages: only trained numbers get them"),
        (lambda b, t: 16 if t else 4, "(16, False) = 4", "That stores the frozen weight in float32"),
        (lambda b, t: 16 if t else b / 8 + 12, "(32, False) = 16", "You gave the frozen weight a gradient and AdamW's"),
        (lambda b, t: 128 if t else b, "(32, True) = 128", "That is in bits (4 numbers x 32 bits)"),
        (lambda b, t: 16 if t else b, "(32, False) = 32", "That is in bits: divide by 8"),
        (lambda b, t: 16 if t else b // 8, "(4, False) = 0", "integer division drops the half byte"),
    ],
)
def test_check_bytes_per_parameter_names_each_slip(slip, case: str, hint: str) -> None:
    fb = ex.check_bytes_per_parameter(slip)
    assert not fb and fb.answered
    assert f"bytes_per_parameter{case} is a common slip" in fb.message and hint in fb.hint, fb


def test_check_bytes_per_parameter_other_wrong_answers() -> None:
    fb = ex.check_bytes_per_parameter(lambda b, t: 16 if t else b / 8 + 1)  # no slip the checker knows
    assert not fb and fb.hint.startswith("A trained number: 4 + 4 + 4 + 4 bytes, all float32")
    assert "for a frozen weight of LoRA's float32 base" in fb.message
    assert "should be a finite number" in ex.check_bytes_per_parameter(lambda b, t: "16").message
    assert "should be a finite number" in ex.check_bytes_per_parameter(lambda b, t: True).message
    assert "raised ZeroDivisionError" in ex.check_bytes_per_parameter(lambda b, t: 1 / 0).message
    right_but_qlora_adapter = ex.check_bytes_per_parameter(lambda b, t: (17 if b == 4 else 16) if t else b / 8)
    assert not right_but_qlora_adapter and "an adapter number of QLoRA" in right_but_qlora_adapter.message


def test_best_methods_come_from_the_estimator() -> None:
    assert ex.best_method(1.7e9, 8.0) == "lora-bf16"
    assert ex.best_method(70e9, 48.0) == "none"
    assert ex.best_method(mem.SMOLLM2_PARAMS, 16.0) == "full"
    assert ex.best_method(7e9, 16.0) == "qlora"


def test_check_best_methods_right_and_placeholder() -> None:
    fb = ex.check_best_methods(" LoRA-bf16", "None")  # case and spaces do not matter
    assert fb and "3.47 GB" in fb.message and "37.88 GB" in fb.message
    placeholder = ex.check_best_methods(..., ...)
    assert not placeholder and not placeholder.answered
    assert str(placeholder).startswith("Not answered yet: replace the ... in method_8gb and method_48gb")
    assert not ex.check_best_methods("lora-bf16", ...).answered


@pytest.mark.parametrize(
    "answers,hint",
    [
        (("lora", "none"), "over its 70 % line (5.6 GB)"),  # 6.87 GB fits 8 GB, not its 70 % line
        (("full", "none"), "more than the whole 8 GB"),
        (("qlora", "none"), "fits too (3.47 GB)"),  # fits, but not the first that does
        (("none", "none"), "within the 70 % line of 8 GB (5.6 GB)"),
        (("lora-bf16", "qlora"), "over its 70 % line (33.6 GB)"),  # 37.88 GB under 48 GB, over 33.6 GB
        (("lora-bf16", "lora-bf16"), "more than the whole 48 GB"),
    ],
)
def test_check_best_methods_hints(answers: tuple, hint: str) -> None:
    fb = ex.check_best_methods(*answers)
    assert not fb and fb.answered and hint in fb.hint, fb
    assert "usable" not in fb.hint  # the table's 70 % is a line, never "usable"


def test_check_best_methods_unknown_option() -> None:
    fb = ex.check_best_methods("adapter", "none")
    assert not fb and "not one of the options" in fb.message


# --------------------------------------------------------------------------------------------
# Charts and the two planners (their callbacks are plain functions)
# --------------------------------------------------------------------------------------------
def _peak_parts() -> list[tuple[str, float]]:
    from test_memory import _fake_measurement

    return mem.account_for_peak(_fake_measurement())


def test_methods_chart_has_title_labels_and_the_three_70_percent_lines() -> None:
    import matplotlib.pyplot as plt

    fig = ex.plot_methods_vs_budgets(mem.estimate_table([mem.MODELS[2]]))
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() == "memory (GB)"
    assert [round(p.get_height(), 2) for p in ax.patches] == [112.0, 28.29, 14.29, 3.79]
    assert sorted(round(line.get_ydata()[0], 1) for line in ax.get_lines()) == [11.2, 16.8, 56.0]
    plt.close(fig)
    with pytest.raises(TypeError, match="estimates"):
        ex.plot_methods_vs_budgets([])


def test_estimate_vs_measured_chart_draws_a_pair_per_case() -> None:
    """04 draws the team's run beside this machine's split peak; 05 its sweep, a case it did not run included."""
    import matplotlib.pyplot as plt

    fig = ex.plot_estimate_vs_measured([ex.TEAM_RUN, ("here", 0.5436, _peak_parts())], "t", counts="weights")
    ax = fig.axes[0]
    assert ax.get_title() == "t" and ax.get_ylabel() == "peak memory (GB)"
    assert [t.get_text() for t in ax.texts] == ["0.54", "1.88", "0.54", "1.90"]  # the split column tops at the peak
    assert [t.get_text() for t in ax.get_xticklabels()] == ["team's run", "here"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["estimate (weights)", "measured peak"] and labels[-1].startswith("other")
    plt.close(fig)
    fig = ex.plot_estimate_vs_measured([("LoRA b8", 2.56, 2.62), ("full b8", 3.5, None)])
    assert [t.get_text() for t in fig.axes[0].texts] == ["2.56", "2.62", "3.50", "not run"]
    plt.close(fig)
    with pytest.raises(ValueError, match="estimate"):
        ex.plot_estimate_vs_measured([("x", -1, 1.0)])
    with pytest.raises(ValueError, match="cases"):
        ex.plot_estimate_vs_measured([])
    with pytest.raises(ValueError, match="measured"):
        ex.plot_estimate_vs_measured([("x", 0.5, [])])


def test_planner_answers_and_draws() -> None:
    import matplotlib.pyplot as plt

    p = ex.plan("a 7B model", 1.0, "lora-bf16", 8, 16)
    assert not p.estimate.fits(16) and "14.29 GB" in p.text and "usable" not in p.text
    last = "Memory 16 GB, 70 % line 11.2 GB: does not fit (the estimate is 128 % of the line)."
    assert p.text.splitlines()[-1] == last
    assert [b.gb for b in p.budgets] == [16.0]
    assert "70 % line 16.8 GB: fits (" in ex.plan("a 7B model", 1.0, "lora-bf16", 8, 24).text
    smol = ex.plan("SmolLM2-135M (config)", 1.0, "lora", 8, 16)
    assert ": fits (" in smol.text and "0.54 GB" in smol.text
    assert "460,800 numbers (counted from the config)" in smol.text
    bf16 = ex.plan("a 7B model", 1.0, "full-bf16", 8, 80)
    assert bf16.estimate.gb == pytest.approx(56.0) and "trains all 7,000,000,000 parameters" in bf16.text
    assert ": fits (" in bf16.text  # 56 GB: exactly the 70 % line of 80 GB
    assert ": does not fit (" in ex.plan("a 7B model", 1.0, "full-bf16", 8, 64).text
    assert ("full fine-tuning (bfloat16)", "full-bf16") in ex.method_options()
    assert [k for _, k in ex.method_options()][:4] == list(mem.METHODS)
    custom = ex.plan(ex.CUSTOM, 3.2, "full", 8, 80)
    assert custom.estimate.gb == pytest.approx(51.2) and ": fits (" in custom.text and "a 3.2B model" in custom.text
    assert ex.plan("a 7B model", 1.0, "qlora", 16, 8).estimate.trained == pytest.approx(
        2 * mem.assumed_adapter_params(7e9)
    )
    text, fig = ex.planner_view("a 70B model", 1.0, "qlora", 8, 80)
    assert text == ex.plan("a 70B model", 1.0, "qlora", 8, 80).text
    ax = fig.axes[0]
    assert sum(round(p.get_height(), 2) for p in ax.patches) == pytest.approx(37.88, abs=0.02)
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == [56.0, 80.0]  # the 70 % line and the memory
    assert {"memory: 80 GB", "70 % line: 56 GB"} <= {t.get_text() for t in ax.get_legend().get_texts()}
    plt.close(fig)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"model": "GPT-9"}, ValueError, "model must be one of"),
        ({"method": "dpo"}, ValueError, "method"),
        ({"lora_rank": 0}, ValueError, "lora_rank"),
        ({"lora_rank": 2.0}, TypeError, "lora_rank"),
        ({"budget_gb": 0}, ValueError, "budget_gb"),
        ({"budget_gb": float("nan")}, ValueError, "budget_gb"),
        ({"model": "custom size (billions of parameters)", "billions": -1.0}, ValueError, "billions"),
        ({"billions": "7"}, TypeError, "billions"),
    ],
)
def test_planner_rejects_bad_input(kwargs, error, match) -> None:
    args = {"model": "a 7B model", "billions": 7.0, "method": "lora", "lora_rank": 8, "budget_gb": 16.0} | kwargs
    with pytest.raises(error, match=match):
        ex.plan(**args)


def test_planner_widget_builds_and_redraws_when_a_control_moves(capsys) -> None:
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    box = ex.budget_planner()
    assert len(box.children) == 3
    assert "Memory 16 GB" in capsys.readouterr().out  # outside a notebook the Output widget passes text through
    budget = box.children[1].children[2]
    assert budget.description == "memory (GB)"
    budget.value = 24.0
    assert "Memory 24 GB, 70 % line 16.8 GB: fits" in capsys.readouterr().out
    plt.close("all")


def test_moving_the_size_slider_switches_the_planner_to_a_custom_size() -> None:
    box = ex.budget_planner(model="a 7B model")
    model_dropdown, size_slider = box.children[0].children
    size_slider.value = 30.0
    assert model_dropdown.value == ex.CUSTOM


def test_step_planner_answers_against_each_gpu_and_draws_five_parts() -> None:
    import matplotlib.pyplot as plt

    p = ex.step_plan("qwen2.5-1.5b-instruct", "lora", 8, 1024)
    assert [b.label for b in p.budgets] == ["T4 15.83 GB", "L4 24 GB", "A100-40GB 40 GB", "H100 80 GB"]
    assert "  T4 15.83 GB, usable 15.33 GB: does not fit (" in p.text  # usable: the card's memory less 0.5 GB
    assert "  L4 24 GB, usable 23.5 GB: does not fit (" in p.text and "  H100 80 GB, usable 79.5 GB: fits (" in p.text
    assert p.estimate.device == "cuda" and sum(p.estimate.categories().values()) == p.estimate.peak_bytes
    _, fig = ex.step_planner_view("smollm2-135m", "full", 4, 512, True, "adamw8bit")
    ax = fig.axes[0]
    categories = list(ex.step_plan("smollm2-135m").estimate.categories())
    assert [t.get_text().split(":")[0] for t in ax.get_legend().get_texts()][-5:] == categories
    assert sum(patch.get_height() for patch in ax.patches) == pytest.approx(
        ex.step_plan("smollm2-135m", "full", 4, 512, True, "adamw8bit").estimate.peak_gb
    )
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == pytest.approx(
        [15.328, 23.5, 39.5, 79.5], abs=1e-3
    )  # usable memory
    plt.close(fig)
    bf16 = ex.step_plan("smollm2-135m", "full-bf16", 8, 128)
    assert bf16.text.startswith("smollm2-135m, full fine-tuning (bfloat16), batch 8 x 128 tokens, AdamW: predicted")
    assert bf16.estimate.optimizer_bytes < ex.step_plan("smollm2-135m", "full", 8, 128).estimate.optimizer_bytes / 1.9


@pytest.mark.parametrize("share,verdict", [(0.89, "fits"), (0.95, "tight"), (1.01, "does not fit")])
def test_step_planner_says_fits_up_to_90_percent_of_usable_then_tight(monkeypatch, share: float, verdict: str) -> None:
    import matplotlib.pyplot as plt

    from course_utils import datasheets

    peak = ex.step_plan("smollm2-135m", "full", 4, 512).estimate.peak_gb
    card = peak / share + 0.5  # a card whose usable memory puts the peak at `share` of it
    monkeypatch.setitem(datasheets.DATASHEETS, "X1", datasheets.Datasheet("Test X1", 1.0, 1.0, card))
    monkeypatch.setattr(ex, "_STEP_GPUS", ("X1",))
    text, fig = ex.step_planner_view("smollm2-135m", "full", 4, 512, False, "adamw")
    line = f"  X1 {card:.4g} GB, usable {card - 0.5:.4g} GB: {verdict} ({100 * share:.0f} % of usable)"
    assert text.splitlines()[-1] == line
    ax = fig.axes[0]
    assert [line.get_ydata()[0] for line in ax.get_lines()] == pytest.approx([card - 0.5])
    assert ax.get_legend().get_texts()[0].get_text() == f"X1 {card:.4g} GB, usable {card - 0.5:.4g} GB: {verdict}"
    plt.close(fig)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"method": "dpo"}, ValueError, "method"),
        ({"batch": 0}, ValueError, "batch"),
        ({"checkpointing": 1}, TypeError, "checkpointing"),
    ],
)
def test_step_planner_rejects_bad_input(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        ex.step_plan(**kwargs)


def test_step_planner_widget_redraws_when_a_control_moves(capsys) -> None:
    import matplotlib.pyplot as plt

    box = ex.step_planner("smollm2-135m", "lora", 8, 512)
    assert "predicted peak" in capsys.readouterr().out
    method = box.children[0].children[1]
    assert ("full fine-tuning (bfloat16)", "full-bf16") in method.options
    method.value = "full-bf16"
    assert "full fine-tuning (bfloat16)" in capsys.readouterr().out
    box.children[1].children[3].value = True  # gradient checkpointing
    assert "gradient checkpointing" in capsys.readouterr().out
    plt.close("all")


def test_a_whole_process_timeline_and_predicted_points_placed_in_measured_time() -> None:
    import matplotlib.pyplot as plt

    from course_utils import step_memory, timeline

    est = step_memory.estimate_step("smollm2-135m", method="lora", batch=2, seq=64, device="cpu")
    predicted = timeline.predicted_timeline(est)
    fig = ex.timeline_chart(predicted, whole_process=True, measured_peak_bytes=2 * 10**9)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "framework" and labels[-2:] == ["predicted total", "measured peak"]
    assert ax.get_ylabel() == "GB alive" and [t.get_text() for t in ax.texts] == ["predicted peak: backward"]
    plt.close(fig)
    assert "framework" in ex.timeline_text(predicted, whole_process=True).splitlines()[0]
    assert "framework" not in ex.timeline_text(predicted).splitlines()[0]
    times = dict(zip(timeline.PHASES, [0.0, 1.0, 2.0, 3.0, 4.0]))  # one measured moment per phase
    points = [timeline.TimelinePoint(phase, phase, {"weights": 1}) for phase in times]
    measured = timeline.Timeline(points, "made up", times_s=list(times.values()))
    assert ex._predicted_x(predicted, measured) == [times[p.phase] for p in predicted.points]
