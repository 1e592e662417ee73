"""course_utils.memory: the lesson's estimator, its table, exact counts from configs, and bad input."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from course_utils import memory as mem
from course_utils.architecture import lora_adapter_params

# The lesson's table, value by value: (model, method) -> GB to the hundredth, fits on 16 / 24 / 80 GB.
LESSON_ROWS = [
    ("SmolLM2-135M", "full", "2.15", (True, True, True)),
    ("SmolLM2-135M", "lora", "0.54", (True, True, True)),
    ("SmolLM2-135M", "lora-bf16", "0.27", (True, True, True)),
    ("SmolLM2-135M", "qlora", "0.07", (True, True, True)),
    ("a 1.7B model", "full", "27.20", (False, False, True)),
    ("a 1.7B model", "lora", "6.87", (True, True, True)),
    ("a 1.7B model", "lora-bf16", "3.47", (True, True, True)),
    ("a 1.7B model", "qlora", "0.92", (True, True, True)),
    ("a 7B model", "full", "112.00", (False, False, False)),
    ("a 7B model", "lora", "28.29", (False, False, True)),
    ("a 7B model", "lora-bf16", "14.29", (False, True, True)),
    ("a 7B model", "qlora", "3.79", (True, True, True)),
    ("a 70B model", "full", "1120.00", (False, False, False)),
    ("a 70B model", "lora", "282.88", (False, False, False)),
    ("a 70B model", "lora-bf16", "142.88", (False, False, False)),
    ("a 70B model", "qlora", "37.88", (False, False, True)),
]

LESSON_TABLE_TOP = """\
ESTIMATE: weights + gradients + AdamW states. Activations are not included (measure them).
model          method                             GB  laptop 16 GB     GPU 24 GB     GPU 80 GB
SmolLM2-135M   full fine-tuning (float32)       2.15          fits          fits          fits
SmolLM2-135M   LoRA, base in float32            0.54          fits          fits          fits
SmolLM2-135M   LoRA, base in bfloat16           0.27          fits          fits          fits
SmolLM2-135M   QLoRA, base in 4 bits            0.07          fits          fits          fits
a 1.7B model   full fine-tuning (float32)      27.20            no            no          fits
a 1.7B model   LoRA, base in float32            6.87          fits          fits          fits
a 1.7B model   LoRA, base in bfloat16           3.47          fits          fits          fits
a 1.7B model   QLoRA, base in 4 bits            0.92          fits          fits          fits
a 7B model     full fine-tuning (float32)     112.00            no            no            no
a 7B model     LoRA, base in float32           28.29            no            no          fits
a 7B model     LoRA, base in bfloat16          14.29            no          fits          fits
a 7B model     QLoRA, base in 4 bits            3.79          fits          fits          fits
a 70B model    full fine-tuning (float32)    1120.00            no            no            no
a 70B model    LoRA, base in float32          282.88            no            no            no
a 70B model    LoRA, base in bfloat16         142.88            no            no            no
a 70B model    QLoRA, base in 4 bits           37.88            no            no          fits
fits = the estimate uses at most 70% of the memory (the rest: activations, the system)."""


@pytest.mark.parametrize("model,method,gb,fit", LESSON_ROWS, ids=[f"{r[0]}-{r[1]}" for r in LESSON_ROWS])
def test_every_value_of_the_lesson_table(model: str, method: str, gb: str, fit: tuple[bool, ...]) -> None:
    size = next(m for m in mem.MODELS if m.name == model)
    est = mem.estimate_model(size, method)
    assert f"{est.gb:.2f}" == gb
    assert tuple(est.fits(b.gb) for b in mem.BUDGETS) == fit


def test_lesson_table_text_is_the_lessons_table() -> None:
    text = mem.format_table(mem.estimate_table(), mem.BUDGETS)
    assert text.startswith(LESSON_TABLE_TOP + "\n")
    # "QLoRA is not an option on a CPU" is out of date: bitsandbytes 0.50 runs 4 bits on x86 CPUs.
    assert text.splitlines()[-1] == mem.FOOTNOTE_QLORA
    assert "x86 CPUs" in mem.FOOTNOTE_QLORA and "not an option" not in mem.FOOTNOTE_QLORA
    assert len(text.splitlines()) == 20


def test_full_fine_tuning_is_16_bytes_per_parameter() -> None:
    est = mem.estimate(1_000_000, "full")
    assert est.total_bytes == 16_000_000
    assert (est.weights_bytes, est.gradient_bytes, est.optimizer_bytes) == (4e6, 4e6, 8e6)
    assert mem.estimate(mem.SMOLLM2_PARAMS, "full").total_bytes == 134_515_008 * 16
    assert round(mem.estimate(7e9, "full").gb, 2) == 112.0


def test_full_bf16_is_8_bytes_per_parameter() -> None:
    """Pure bfloat16: weight 2, gradient 2, AdamW's two states 2 + 2 bytes (torch keeps them in the weight's dtype)."""
    est = mem.estimate(1_000_000, "full-bf16")
    assert (est.weights_bytes, est.gradient_bytes, est.optimizer_bytes) == (2e6, 2e6, 4e6)
    assert est.trained == 1_000_000 and not est.adapter_assumed
    assert est.label == "full fine-tuning (bfloat16)" and mem.ALL_METHODS["full-bf16"].trains_all
    assert mem.estimate(7e9, "full-bf16").gb == pytest.approx(56.0)  # half of float32's 112 GB


def test_the_lessons_table_keeps_its_four_methods() -> None:
    assert tuple(mem.METHODS) == ("full", "lora", "lora-bf16", "qlora")
    assert tuple(mem.ALL_METHODS) == (*mem.METHODS, *mem.EXTRA_METHODS) and "full-bf16" in mem.EXTRA_METHODS
    assert len(mem.estimate_table()) == 16 and {e.method for e in mem.estimate_table()} == set(mem.METHODS)
    assert "(bfloat16)" not in mem.format_table(mem.estimate_table(), mem.BUDGETS) and len(mem.what_fits(80)) == 12


@pytest.mark.parametrize("method,base", [("lora", 4.0), ("lora-bf16", 2.0), ("qlora", 0.5)])
def test_lora_is_frozen_base_plus_12_bytes_per_adapter_number(method: str, base: float) -> None:
    est = mem.estimate(mem.SMOLLM2_PARAMS, method, adapter=mem.SMOLLM2_ADAPTER)
    assert est.weights_bytes == base * mem.SMOLLM2_PARAMS
    assert est.gradient_bytes + est.optimizer_bytes == 12 * mem.SMOLLM2_ADAPTER
    assert not est.adapter_assumed


def test_adapter_share_is_the_lessons_assumption() -> None:
    assert round(100 * mem.ADAPTER_SHARE, 2) == 0.34
    assert mem.assumed_adapter_params(mem.SMOLLM2_PARAMS) == pytest.approx(460_800)
    assert mem.assumed_adapter_params(mem.SMOLLM2_PARAMS, 16) == pytest.approx(921_600)  # linear in the rank
    assert mem.estimate(7e9, "lora").adapter_assumed


def test_smollm2_lora_and_the_7b_frozen_weights() -> None:
    assert round(mem.estimate(mem.SMOLLM2_PARAMS, "lora").gb, 2) == 0.54
    assert mem.estimate(7e9, "lora").weights_bytes / mem.GB == 28.0
    assert round(mem.estimate(7e9, "qlora").gb, 2) == 3.79


def test_usable_and_fits_at_70_percent() -> None:
    assert [mem.usable_gb(b.gb) for b in mem.BUDGETS] == [11.2, 16.8, 56.0]
    assert mem.fits(11.2, 16) and not mem.fits(11.21, 16)
    assert mem.fits(0, 16)


def test_a_t4_is_budgeted_at_what_a_process_can_use_and_the_70_percent_rule_applies_on_top() -> None:
    """Colab's T4 exposes 15,095 MiB (15.83 GB); the CUDA context takes 0.5 GB outside the allocator counter."""
    from course_utils.datasheets import CUDA_CONTEXT_GB, T4_EXPOSED_GB, lookup

    t4 = mem.gpu_budget("T4")
    assert round(T4_EXPOSED_GB, 2) == 15.83 and CUDA_CONTEXT_GB == 0.5
    assert t4.label == "T4 15.33 GB" and t4.gb == pytest.approx(15.83 - 0.5, abs=0.005)
    assert t4.usable_gb == pytest.approx(0.7 * t4.gb) and round(t4.usable_gb, 2) == 10.73
    assert lookup("T4").memory_gb == 16.0  # the datasheet's figure stays what the datasheet says
    assert mem.gpu_budget("L4").label == "L4 24 GB"  # no measured exposed memory: the datasheet's figure


def test_what_fits() -> None:
    names = {(e.model, e.method) for e in mem.what_fits(16)}
    assert ("a 7B model", "qlora") in names and ("a 7B model", "lora-bf16") not in names
    assert len(mem.what_fits(80)) == 12


def test_parts_add_up() -> None:
    est = mem.estimate(7e9, "qlora")
    assert sum(est.parts_gb().values()) == pytest.approx(est.gb)
    assert list(est.parts_gb()) == ["weights", "gradients", "AdamW states"]


def test_model_from_config_counts_exactly() -> None:
    model = mem.model_from_config("smollm2-135m")
    assert (model.name, model.params, model.adapter) == ("smollm2-135m", 134_515_008, 460_800)


# --------------------------------------------------------------------------------------------
# Measured peak accounting
# --------------------------------------------------------------------------------------------
def _fake_measurement(**over):
    base = dict(peak_bytes=1.9e9, baseline_bytes=0.45e9, weights_bytes=0.54e9, grads_bytes=1.8e6,
                optimizer_bytes=3.7e6, saved_activations_bytes=0.6e9)
    base.update(over)
    return SimpleNamespace(**base)


def test_account_for_peak_adds_up_to_the_peak() -> None:
    parts = mem.account_for_peak(_fake_measurement())
    assert sum(v for _, v in parts) == pytest.approx(1.9)
    assert parts[-1][0].startswith("other") and parts[-1][1] == pytest.approx(1.9 - 0.45 - 0.54 - 0.0055 - 0.6)


@pytest.mark.parametrize("field,value,error", [("peak_bytes", -1, ValueError),
                                               ("grads_bytes", float("nan"), ValueError),
                                               ("weights_bytes", None, TypeError)])
def test_account_for_peak_rejects_bad_measurements(field: str, value, error) -> None:
    with pytest.raises(error, match=f"measured.{field}"):
        mem.account_for_peak(_fake_measurement(**{field: value}))


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params", [0, -1, float("nan"), float("inf"), 999, 1e14 + 1e6, 1e30])
def test_estimate_rejects_bad_sizes(params) -> None:
    with pytest.raises(ValueError, match="params"):
        mem.estimate(params, "full")


def test_absurd_sizes_name_the_argument_and_the_range() -> None:
    with pytest.raises(ValueError, match=r"^params must be a finite number between 1000 and 1e\+14, got 1e\+30$"):
        mem.estimate(1e30, "lora")
    with pytest.raises(ValueError, match="params must be"):
        mem.assumed_adapter_params(1e18)
    with pytest.raises(ValueError, match=r"^budget_gb must be a finite number between 0.01 and 10000, got 1e\+30$"):
        mem.fits(1.0, 1e30)
    with pytest.raises(ValueError, match="budget"):
        mem.budgets_from_gb([16, 1e6])
    assert mem.estimate(mem.MIN_PARAMS, "full").total_bytes == 16_000 and mem.estimate(mem.MAX_PARAMS, "qlora").gb > 0


def test_estimate_rejects_bad_types_and_methods() -> None:
    with pytest.raises(TypeError, match="params"):
        mem.estimate("7e9", "full")
    with pytest.raises(ValueError, match="method must be one of"):
        mem.estimate(7e9, "dpo")
    with pytest.raises(ValueError, match="adapter"):
        mem.estimate(7e9, "lora", adapter=0)
    with pytest.raises(ValueError, match="lora_rank"):
        mem.estimate(7e9, "lora", lora_rank=0)
    with pytest.raises(TypeError, match="lora_rank"):
        mem.estimate(7e9, "lora", lora_rank=8.0)


@pytest.mark.parametrize("budget", [0, -16, float("nan")])
def test_budget_must_be_positive(budget) -> None:
    with pytest.raises(ValueError, match="budget_gb"):
        mem.fits(1.0, budget)
    with pytest.raises(ValueError, match="budget"):
        mem.budgets_from_gb([budget])


# --------------------------------------------------------------------------------------------
# Charts and the budget planner (its callback is a plain function)
# --------------------------------------------------------------------------------------------
def test_methods_chart_has_title_labels_and_the_three_70_percent_lines() -> None:
    import matplotlib.pyplot as plt

    from course_utils.lessons.memory_budget import plot_methods_vs_budgets

    rows = mem.estimate_table([mem.MODELS[2]])
    fig = plot_methods_vs_budgets(rows)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel() == "memory (GB)"
    assert [round(p.get_height(), 2) for p in ax.patches] == [112.0, 28.29, 14.29, 3.79]
    assert sorted(round(line.get_ydata()[0], 1) for line in ax.get_lines()) == [11.2, 16.8, 56.0]
    plt.close(fig)
    with pytest.raises(TypeError, match="estimates"):
        plot_methods_vs_budgets([])


def test_estimate_vs_measured_chart() -> None:
    import matplotlib.pyplot as plt

    from course_utils.lessons.memory_budget import plot_estimate_vs_measured

    parts = mem.account_for_peak(_fake_measurement())
    fig = plot_estimate_vs_measured(0.5436, parts)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["0.54 GB", "1.88 GB", "0.54 GB", "1.90 GB"]
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["team's run:\nestimate", "team's run:\nmeasured"]
    plt.close(fig)
    with pytest.raises(ValueError, match="estimate_gb"):
        plot_estimate_vs_measured(-1, parts)
    with pytest.raises(ValueError, match="parts_gb"):
        plot_estimate_vs_measured(0.5, [])


def test_planner_answers_and_draws() -> None:
    import matplotlib.pyplot as plt

    from course_utils.lessons import memory_budget as wm

    p = wm.plan("a 7B model", 1.0, "lora-bf16", 8, 16)
    assert not p.fits and "14.29 GB" in p.text and "does NOT fit" in p.text and "11.2 GB" in p.text
    assert wm.plan("a 7B model", 1.0, "lora-bf16", 8, 24).fits
    smol = wm.plan("SmolLM2-135M (config)", 1.0, "lora", 8, 16)
    assert smol.fits and "460,800 numbers (counted from the config)" in smol.text and "0.54 GB" in smol.text
    bf16 = wm.plan("a 7B model", 1.0, "full-bf16", 8, 80)
    assert bf16.estimate.gb == pytest.approx(56.0) and "trains all 7,000,000,000 parameters" in bf16.text
    assert bf16.fits and not wm.plan("a 7B model", 1.0, "full-bf16", 8, 64).fits  # 56 GB: exactly 70 % of 80 GB
    assert ("full fine-tuning (bfloat16)", "full-bf16") in wm.method_options()
    assert [k for _, k in wm.method_options()][:4] == list(mem.METHODS)
    custom = wm.plan(wm.CUSTOM, 3.2, "full", 8, 80)
    assert custom.estimate.gb == pytest.approx(51.2) and custom.fits and "a 3.2B model" in custom.text
    assert wm.plan("a 7B model", 1.0, "qlora", 16, 8).estimate.trained == pytest.approx(
        2 * mem.assumed_adapter_params(7e9))
    fig = wm.planner_view("a 70B model", 1.0, "qlora", 8, 80)
    heights = [round(p.get_height(), 2) for p in fig.axes[0].patches]
    assert sum(heights) == pytest.approx(37.88, abs=0.02)
    plt.close(fig)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"model": "GPT-9"}, ValueError, "model must be one of"),
    ({"method": "dpo"}, ValueError, "method"),
    ({"lora_rank": 0}, ValueError, "lora_rank"),
    ({"lora_rank": 2.0}, TypeError, "lora_rank"),
    ({"budget_gb": 0}, ValueError, "budget_gb"),
    ({"budget_gb": float("nan")}, ValueError, "budget_gb"),
    ({"model": "custom size (billions of parameters)", "billions": -1.0}, ValueError, "billions"),
    ({"billions": "7"}, TypeError, "billions"),
])
def test_planner_rejects_bad_input(kwargs, error, match) -> None:
    from course_utils.lessons import memory_budget as wm

    args = {"model": "a 7B model", "billions": 7.0, "method": "lora", "lora_rank": 8, "budget_gb": 16.0} | kwargs
    with pytest.raises(error, match=match):
        wm.plan(**args)


def test_planner_widget_builds_and_redraws_when_a_control_moves(capsys) -> None:
    pytest.importorskip("ipywidgets")
    import matplotlib.pyplot as plt

    from course_utils.lessons.memory_budget import budget_planner

    box = budget_planner()
    assert len(box.children) == 3
    assert "Budget 16 GB" in capsys.readouterr().out  # outside a notebook the Output widget passes text through
    budget = box.children[1].children[2]
    assert budget.description == "memory (GB)"
    budget.value = 24.0
    assert "Budget 24 GB, usable 70% = 16.8 GB: FITS" in capsys.readouterr().out
    plt.close("all")


def test_moving_the_size_slider_switches_the_planner_to_a_custom_size() -> None:
    from course_utils.lessons import memory_budget as wm

    box = wm.budget_planner(model="a 7B model")
    model_dropdown, size_slider = box.children[0].children
    size_slider.value = 30.0
    assert model_dropdown.value == wm.CUSTOM


def test_step_planner_answers_against_each_gpu_and_draws_five_parts() -> None:
    import matplotlib.pyplot as plt

    from course_utils.step_memory import CATEGORIES
    from course_utils.lessons import memory_budget as wm

    p = wm.step_plan("qwen2.5-1.5b-instruct", "lora", 8, 1024)
    assert [b.label for b in p.budgets] == ["T4 15.33 GB", "L4 24 GB", "A100-40GB 40 GB", "H100 80 GB"]
    assert "T4 15.33 GB: does NOT fit" in p.text and "H100 80 GB: fits" in p.text
    assert p.estimate.device == "cuda" and sum(p.estimate.categories().values()) == p.estimate.peak_bytes
    fig = wm.step_planner_view("smollm2-135m", "full", 4, 512, True, "adamw8bit")
    ax = fig.axes[0]
    assert [t.get_text().split(":")[0] for t in ax.get_legend().get_texts()][-5:] == list(CATEGORIES)
    assert sum(patch.get_height() for patch in ax.patches) == pytest.approx(
        wm.step_plan("smollm2-135m", "full", 4, 512, True, "adamw8bit").estimate.peak_gb)
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == pytest.approx([15.328, 24.0, 40.0, 80.0],
                                                                                   abs=1e-3)
    plt.close(fig)
    bf16 = wm.step_plan("smollm2-135m", "full-bf16", 8, 128)
    assert bf16.text.startswith("smollm2-135m, full fine-tuning (bfloat16), batch 8 x 128 tokens, AdamW: predicted")
    assert bf16.estimate.optimizer_bytes < wm.step_plan("smollm2-135m", "full", 8, 128).estimate.optimizer_bytes / 1.9


@pytest.mark.parametrize("kwargs,error,match", [({"method": "dpo"}, ValueError, "method"),
                                                ({"batch": 0}, ValueError, "batch"),
                                                ({"checkpointing": 1}, TypeError, "checkpointing"),
                                                ({"gpus": ("T4", "X9")}, ValueError, "X9")])
def test_step_planner_rejects_bad_input(kwargs, error, match) -> None:
    from course_utils.lessons import memory_budget as wm

    with pytest.raises(error, match=match):
        wm.step_plan(**kwargs)


def test_step_planner_widget_redraws_when_a_control_moves(capsys) -> None:
    import matplotlib.pyplot as plt

    from course_utils.lessons import memory_budget as wm

    box = wm.step_planner("smollm2-135m", "lora", 8, 512)
    assert "predicted peak" in capsys.readouterr().out
    method = box.children[0].children[1]
    assert ("full fine-tuning (bfloat16)", "full-bf16") in method.options
    method.value = "full-bf16"
    assert "full fine-tuning (bfloat16)" in capsys.readouterr().out
    box.children[1].children[3].value = True  # gradient checkpointing
    assert "gradient checkpointing" in capsys.readouterr().out
    plt.close("all")


def test_rounded_peak_parts_add_up_to_the_rounded_peak() -> None:
    measured = _fake_measurement(peak_bytes=1_838_123_456, baseline_bytes=445_400_000, weights_bytes=539_903_232,
                                 grads_bytes=1_843_200, optimizer_bytes=3_686_400, saved_activations_bytes=586_400_000)
    parts = mem.account_for_peak(measured, digits=3)
    assert [round(v, 3) for _, v in parts] == [v for _, v in parts]
    assert round(sum(v for _, v in parts), 3) == 1.838
    assert [v for _, v in parts[:5]] == [0.445, 0.54, 0.002, 0.004, 0.586]
    with pytest.raises(ValueError, match="digits"):
        mem.account_for_peak(measured, digits=-1)


def test_the_notebooks_sums_by_hand_are_the_estimators() -> None:
    """Notebook 04 writes each sum in plain Python; the estimator (table, planner, exercises) must agree."""
    assert 30 * 8 * ((576 + 576) + (576 + 192)) == lora_adapter_params("smollm2-135m", 8) == mem.SMOLLM2_ADAPTER
    assert 134_515_008 * 16 / 1e9 == pytest.approx(mem.estimate(mem.SMOLLM2_PARAMS, "full").gb)
    assert 7e9 * 16 / 1e9 == pytest.approx(mem.estimate(7e9, "full").gb) == 112
    lora = (134_515_008 * 4 + 460_800 * 12) / 1e9
    assert lora == pytest.approx(mem.estimate(mem.SMOLLM2_PARAMS, "lora", adapter=460_800).gb)
    assert f"{134_515_008 * 4 / 1e9:.4f} + {460_800 * 12 / 1e9:.4f} = {lora:.4f}" == "0.5381 + 0.0055 = 0.5436"
    copy = 460_800 * 4 / 1e9  # the adapter's own float32 numbers, outside the estimate
    assert f"{lora:.4f} + {copy:.4f} = {lora + copy:.4f}" == "0.5436 + 0.0018 = 0.5454"
    adapter = 7e9 * 460_800 / 134_515_008
    assert adapter == pytest.approx(mem.assumed_adapter_params(7e9))
    assert (7e9 * 0.5 + adapter * 12) / 1e9 == pytest.approx(mem.estimate(7e9, "qlora").gb)
    assert f"{7e9 * 0.5 / 1e9:.2f} + {adapter * 12 / 1e9:.2f} = {(7e9 * 0.5 + adapter * 12) / 1e9:.2f}" \
        == "3.50 + 0.29 = 3.79"
