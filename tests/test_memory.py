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
    est = next(e for e in mem.estimate_table() if (e.model, e.method) == (model, method))
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
    assert (est.weights_bytes, est.gradient_bytes, est.optimizer_bytes) == (4e6, 4e6, 8e6)
    assert est.gb == pytest.approx(0.016)
    assert mem.estimate(mem.SMOLLM2_PARAMS, "full").gb == pytest.approx(134_515_008 * 16 / 1e9)
    assert round(mem.estimate(7e9, "full").gb, 2) == 112.0


def test_full_bf16_is_8_bytes_per_parameter() -> None:
    """Pure bfloat16: weight 2, gradient 2, AdamW's two states 2 + 2 bytes (torch keeps them in the weight's dtype)."""
    est = mem.estimate(1_000_000, "full-bf16")
    assert (est.weights_bytes, est.gradient_bytes, est.optimizer_bytes) == (2e6, 2e6, 4e6)
    assert est.trained == 1_000_000 and not est.adapter_assumed
    assert est.label == "full fine-tuning (bfloat16)" and mem.ALL_METHODS["full-bf16"].trains_all
    assert mem.estimate(7e9, "full-bf16").gb == pytest.approx(56.0)  # half of float32's 112 GB


def test_the_lessons_table_keeps_its_four_methods() -> None:
    """full-bf16 is selectable by key (the command line's --method) but never a row of the lesson's table."""
    table = mem.estimate_table()
    assert len(table) == 16 and [e.method for e in table[:4]] == ["full", "lora", "lora-bf16", "qlora"]
    assert mem.estimate(1e9, "full-bf16").gb == pytest.approx(8.0)
    assert "(bfloat16)" not in mem.format_table(table, mem.BUDGETS) and len(mem.what_fits(80)) == 12


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


def test_the_70_percent_line_and_fits_for_the_table() -> None:
    assert [mem.line_gb(b.gb) for b in mem.BUDGETS] == [b.line_gb for b in mem.BUDGETS] == [11.2, 16.8, 56.0]
    assert mem.estimate(700_000_000, "full").gb == pytest.approx(11.2)  # 16 bytes per parameter
    assert mem.estimate(700_000_000, "full").fits(16) and not mem.estimate(700_625_000, "full").fits(16)
    # the table's 70 % line of a card is not what a whole step may use of it (usable: the card less the CUDA context)
    assert mem.line_gb(24) == 16.8 and mem.step_limit_gb(24) == 23.5


def test_a_gpu_budget_is_the_cards_memory_and_the_table_draws_its_70_percent_line() -> None:
    """Colab's T4 exposes 15,095 MiB (15.83 GB); the CUDA context takes 0.5 GB outside the allocator counter."""
    from course_utils.datasheets import CUDA_CONTEXT_GB, T4_EXPOSED_GB, lookup

    t4 = mem.gpu_budget("T4")
    assert round(T4_EXPOSED_GB, 2) == 15.83 and CUDA_CONTEXT_GB == 0.5
    assert t4.label == "T4 15.83 GB" and t4.gb == T4_EXPOSED_GB
    assert t4.line_gb == pytest.approx(0.7 * T4_EXPOSED_GB) and round(t4.line_gb, 2) == 11.08
    assert lookup("T4").memory_gb == 16.0  # the datasheet's figure stays what the datasheet says
    assert mem.gpu_budget("L4").label == "L4 24 GB"  # no measured exposed memory: the datasheet's figure


# --------------------------------------------------------------------------------------------
# A whole step: fits up to 90 % of usable, tight up to 100 %, does not fit above
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "share,verdict",
    [
        (0.0, "fits"),
        (0.5, "fits"),
        (0.89, "fits"),
        (0.90, "fits"),
        (0.9001, "tight"),
        (0.95, "tight"),
        (1.0, "tight"),
        (1.0001, "does not fit"),
        (1.01, "does not fit"),
        (3.0, "does not fit"),
    ],
)
def test_step_verdict_at_and_around_90_and_100_percent(share: float, verdict: str) -> None:
    for usable in (7.5, 15.33, 23.5, 79.5):
        assert mem.step_verdict(share * usable, usable) == verdict, (share, usable)


@pytest.mark.parametrize(
    "peak,usable,error,name",
    [
        (-1.0, 10.0, ValueError, "peak_gb"),
        (float("nan"), 10.0, ValueError, "peak_gb"),
        ("9", 10.0, TypeError, "peak_gb"),
        (5.0, 0.0, ValueError, "usable_gb"),
        (5.0, -2.0, ValueError, "usable_gb"),
        (5.0, float("inf"), ValueError, "usable_gb"),
        (5.0, None, TypeError, "usable_gb"),
    ],
)
def test_step_verdict_checks_its_input(peak, usable, error, name) -> None:
    with pytest.raises(error, match=name):
        mem.step_verdict(peak, usable)


def test_step_limit_is_usable_on_a_gpu_and_the_memory_on_a_cpu() -> None:
    assert mem.step_limit_gb(24, "cuda") == 23.5 and mem.step_limit_gb(16.0, "cpu") == 16.0
    assert mem.step_limit_gb(mem.gpu_budget("T4").gb) == pytest.approx(15.83 - 0.5, abs=0.005)
    with pytest.raises(ValueError, match=r"^budget_gb must be a finite number > 0.5"):
        mem.step_limit_gb(0.5, "cuda")  # nothing left after the CUDA context
    assert mem.step_limit_gb(0.5, "cpu") == 0.5
    with pytest.raises(ValueError, match="budget_gb must be a finite number between 0.01 and 10000"):
        mem.step_limit_gb(1e30, "cpu")
    with pytest.raises(ValueError, match="device"):
        mem.step_limit_gb(16, "mps")


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
    base = dict(
        peak_bytes=1.9e9,
        baseline_bytes=0.45e9,
        weights_bytes=0.54e9,
        grads_bytes=1.8e6,
        optimizer_bytes=3.7e6,
        saved_activations_bytes=0.6e9,
    )
    base.update(over)
    return SimpleNamespace(**base)


def test_account_for_peak_adds_up_to_the_peak() -> None:
    parts = mem.account_for_peak(_fake_measurement(), digits=6)
    assert sum(v for _, v in parts) == pytest.approx(1.9)
    assert parts[-1][0].startswith("other") and parts[-1][1] == pytest.approx(1.9 - 0.45 - 0.54 - 0.0055 - 0.6)
    assert mem.account_for_peak(_fake_measurement())[-1][1] == 0.304  # by default to the MB, as notebook 04 prints


@pytest.mark.parametrize(
    "field,value,error",
    [("peak_bytes", -1, ValueError), ("grads_bytes", float("nan"), ValueError), ("weights_bytes", None, TypeError)],
)
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
        mem.estimate(1e9, "full").fits(1e30)
    assert (
        mem.estimate(mem.MIN_PARAMS, "full").gb == pytest.approx(16e-6) and mem.estimate(mem.MAX_PARAMS, "qlora").gb > 0
    )


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
        mem.estimate(1e9, "full").fits(budget)
    with pytest.raises(ValueError, match="budget_gb"):
        mem.what_fits(budget)


def test_rounded_peak_parts_add_up_to_the_rounded_peak() -> None:
    measured = _fake_measurement(
        peak_bytes=1_838_123_456,
        baseline_bytes=445_400_000,
        weights_bytes=539_903_232,
        grads_bytes=1_843_200,
        optimizer_bytes=3_686_400,
        saved_activations_bytes=586_400_000,
    )
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
    assert (
        f"{7e9 * 0.5 / 1e9:.2f} + {adapter * 12 / 1e9:.2f} = {(7e9 * 0.5 + adapter * 12) / 1e9:.2f}"
        == "3.50 + 0.29 = 3.79"
    )
