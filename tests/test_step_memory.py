"""course_utils.step_memory: the whole-step estimate, checked against what autograd and the process really hold."""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest

from course_utils import measure, step_memory as sm
from course_utils.architecture import Architecture
from course_utils.configs import read_config
from course_utils.quiet import import_bitsandbytes
from course_utils.step_memory import estimate_step, saved_activations

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The estimate counts what transformers 5 saves for backward; on 4.x (hosted images that lag PyPI) it is close.
TRANSFORMERS_MAJOR = int(version("transformers").split(".")[0])

#: SmolLM2's family, small: Llama with SwiGLU, RMSNorm, grouped-query attention, tied embeddings.
SMALL = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 640,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 16384,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}
TINY = {**SMALL, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "vocab_size": 1000}
#: TINY with a larger vocabulary, so the loss path gives a step a dynamic part worth measuring (50 MB at 4 x 128
#: tokens), yet few enough FLOPs that bfloat16 runs fast on a CPU without native bf16 (SMALL takes 10 s a step).
TINY_WIDE_VOCAB = {**TINY, "vocab_size": 8192}


# ---------------------------------------------------------------- architecture and counts
@pytest.mark.parametrize("preset, params", [("smollm2-135m", 134_515_008)])
def test_parameter_count_from_config(preset: str, params: int) -> None:
    assert Architecture.from_config(preset).params == params


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-1.5b-instruct", "qwen3-4b-instruct-2507"])
def test_parameter_count_matches_transformers_on_meta(preset: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = read_config(preset)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    assert Architecture.from_config(preset).params == sum(p.numel() for p in model.parameters())


def test_smollm2_lora_adapter_and_state_bytes() -> None:
    est = estimate_step("smollm2-135m", method="lora", batch=1, seq=128)
    assert est.trained_params == 460_800
    assert est.grads_bytes == 4 * 460_800
    assert est.optimizer_bytes == 8 * 460_800 + 4 * 120  # 120 adapter tensors, each with a float32 step
    full = estimate_step("smollm2-135m", method="full", batch=1, seq=128)
    assert full.weights_bytes == 4 * 134_515_008 + 2 * 32 * 4  # + two rotary buffers of head_dim/2 floats
    eight = estimate_step("smollm2-135m", method="full", batch=1, seq=128, optimizer="adamw8bit")
    assert 2.0 < eight.optimizer_bytes / full.trained_params < 2.1  # 8 -> 2 bytes (+ block scales)


def test_smollm2_full_bf16_is_2_2_and_4_bytes_per_parameter() -> None:
    est = estimate_step("smollm2-135m", method="full-bf16", batch=1, seq=128)
    n_tensors = 1 + 30 * 9 + 1  # embedding, 7 matrices and 2 norms per layer, final norm (the head is tied)
    assert est.trained_params == 134_515_008
    assert est.weights_bytes == 2 * 134_515_008 + 2 * 32 * 4  # rotary buffers stay float32
    assert est.grads_bytes == 2 * 134_515_008
    assert est.optimizer_bytes == 4 * 134_515_008 + 4 * n_tensors
    assert "optimizer states (AdamW, 4 bytes per trained number)" in est.format()
    assert "weights (bfloat16)" in est.format() and "rank" not in est.describe()
    full, bf16 = (estimate_step("smollm2-135m", method=m, batch=8, seq=128) for m in ("full", "full-bf16"))
    assert bf16.activations.total < full.activations.total


def test_activation_formula_for_smollm2_lora_batch8() -> None:
    """Worked by hand in the notebook: per token and layer 5h + 2h_kv + 3i + 2r + heads + 2 float32 numbers."""
    arch = Architecture.from_config("smollm2-135m")
    acts = saved_activations(arch, 8, 128, method="lora")
    h, kv, i, r, heads, tokens = 576, 192, 1536, 8, 9, 8 * 128
    per_layer = 5 * h + 2 * kv + 3 * i + 2 * r + heads + 2
    first_layer = per_layer - (h + 1)  # the first layer's input needs no gradient
    layers = tokens * 4 * (29 * per_layer + first_layer)
    head = tokens * 4 * (h + 1) + tokens * 49152 * 4 + tokens * 8 + 4  # final norm, log-softmax, labels
    rope = 2 * 128 * 64 * 4
    assert acts.total == layers + head + rope


# ---------------------------------------------------------------- exact against autograd
CASES = [
    ("full", None, False, ("q_proj", "v_proj")),
    ("full", "bfloat16", False, ("q_proj", "v_proj")),
    ("full", None, True, ("q_proj", "v_proj")),
    ("full-bf16", None, False, ("q_proj", "v_proj")),
    ("full-bf16", None, True, ("q_proj", "v_proj")),
    ("lora", None, False, ("q_proj", "v_proj")),
    ("lora", None, False, ("k_proj", "o_proj", "down_proj")),
    ("lora", "bfloat16", False, ("q_proj", "v_proj")),
    ("lora", None, True, ("q_proj", "v_proj")),
    ("lora-bf16", None, False, ("q_proj", "v_proj")),
    # QLoRA as notebook 01b runs it (k-bit preparation: float32 embedding and norms), and without the preparation
    ("qlora", None, False, ("gate_proj", "up_proj")),
    ("qlora", None, True, ("q_proj", "v_proj")),
    ("qlora", "bfloat16", False, ("q_proj", "v_proj")),
    ("qlora-unprepared", None, False, ("gate_proj", "up_proj")),
    ("qlora-unprepared", None, True, ("q_proj", "v_proj")),
    ("qlora-unprepared", "bfloat16", False, ("q_proj", "v_proj")),
]
#: Qwen2's family, tiny: biases on q, k and v, and an untied output layer (QLoRA's preparation upcasts it too).
TINY_QWEN2 = {**TINY, "model_type": "qwen2", "tie_word_embeddings": False}


@pytest.mark.parametrize("method, autocast, checkpointing, targets", CASES)
def test_saved_activations_and_state_bytes_are_exact(method, autocast, checkpointing, targets) -> None:
    """Counted by saved_tensors_hooks in a real step (in this process; memory peaks are not used here)."""
    _assert_exact(TINY, method, autocast, checkpointing, targets)


@pytest.mark.parametrize("method, checkpointing", [("qlora", False), ("qlora", True), ("qlora-unprepared", False)])
def test_qlora_untied_head_and_biases_are_exact(method: str, checkpointing: bool) -> None:
    _assert_exact(TINY_QWEN2, method, None, checkpointing, ("q_proj", "v_proj"))


def _assert_exact(config: dict, method: str, autocast: str | None, checkpointing: bool, targets: tuple) -> None:
    """The estimate's saved activations and state bytes equal a real step's (``qlora-unprepared``: QLoRA without
    the k-bit preparation)."""
    kbit = method != "qlora-unprepared"
    method = method.removesuffix("-unprepared")
    step = dict(method=method, targets=targets, checkpointing=checkpointing, autocast=autocast, kbit_preparation=kbit)
    spec = {**measure.step_spec(config, batch=2, seq=16, lora_rank=4, **step, steps=1), "device": "cpu"}
    if method == "qlora" and import_bitsandbytes() is None:
        pytest.skip("QLoRA needs bitsandbytes, which is not installed here")
    real = measure.run_step(spec)
    est = estimate_step(
        config,
        method=method,
        batch=2,
        seq=16,
        lora_rank=4,
        targets=targets,
        checkpointing=checkpointing,
        autocast=bool(autocast),
        kbit_preparation=kbit,
    )
    if TRANSFORMERS_MAJOR >= 5:  # the estimate models what transformers 5's layers save: exact there
        assert est.activations.total == real["saved_activations_bytes"]
        assert est.weights_bytes == real["weights_bytes"]
    else:  # transformers 4 saves ~80 float32 numbers per token and layer more, and keeps one rotary buffer, not two;
        # bitsandbytes before 0.50 (the floor stack) leaves a 4-bit layer's bias in float32 after the preparation
        biases = sum(n for name, n, _ in Architecture.from_config(config).param_tensors() if name.endswith(".bias"))
        assert abs(est.activations.total - real["saved_activations_bytes"]) <= 0.08 * real["saved_activations_bytes"]
        assert -2 * biases <= est.weights_bytes - real["weights_bytes"] <= 64
    assert est.grads_bytes == real["grads_bytes"]
    assert est.optimizer_bytes == real["optimizer_bytes"]


# ---------------------------------------------------------------- peak within 15 % of a measured step
#: Two steps of SMALL, measured in processes forked from one child (it imports the libraries once).
MEASURED = [{"method": "full", "batch": 4, "seq": 128}, {"method": "lora", "batch": 8, "seq": 128}]


@pytest.fixture(scope="module")
def measured_small() -> list[measure.StepMeasurement]:
    return measure.measure_training_steps(SMALL, MEASURED, timeout_s=240, device="cpu")


@pytest.mark.parametrize("case", range(len(MEASURED)))
def test_peak_estimate_within_15_percent_of_a_fresh_process(
    case: int, measured_small: list[measure.StepMeasurement]
) -> None:
    m = measured_small[case]
    assert isinstance(m, measure.StepMeasurement), m
    est = estimate_step(SMALL, **MEASURED[case])
    assert abs(sm.error_percent(est.peak_bytes, m.peak_bytes)) <= 15
    # the part that changes during the step is predicted much closer than that
    dynamic_est = sum(est.moments[est.peak_moment].values())  # on top of baseline, weights, optimizer states
    dynamic_meas = m.peak_bytes - m.start_bytes
    assert abs(dynamic_est - dynamic_meas) <= 0.05 * dynamic_meas + 5e6


def test_full_bf16_peak_within_15_percent_of_a_fresh_process() -> None:
    """Pure bfloat16 full tuning against a measured CPU step; its dynamic part (activations, loss buffers) closely."""
    m = measure.measure_training_step(TINY_WIDE_VOCAB, method="full-bf16", batch=4, seq=128, timeout_s=240)
    est = estimate_step(TINY_WIDE_VOCAB, method="full-bf16", batch=4, seq=128)
    assert m.extra["base_dtype"] == "bfloat16" and m.trained_params == m.total_params == est.trained_params
    assert (est.weights_bytes, est.grads_bytes, est.optimizer_bytes) == (
        m.weights_bytes,
        m.grads_bytes,
        m.optimizer_bytes,
    )
    assert abs(sm.error_percent(est.peak_bytes, m.peak_bytes)) <= 15
    dynamic_est = sum(est.moments[est.peak_moment].values())  # on top of baseline, weights, optimizer states
    dynamic_meas = m.peak_bytes - m.start_bytes
    assert abs(dynamic_est - dynamic_meas) <= 0.05 * dynamic_meas + 5e6


# ---------------------------------------------------------------- behaviour
def test_checkpointing_keeps_one_hidden_state_per_layer() -> None:
    arch = Architecture.from_config("smollm2-135m")
    plain = saved_activations(arch, 8, 128, method="full")
    ck = saved_activations(arch, 8, 128, method="full", checkpointing=True)
    assert ck.by_kind["checkpointed layer inputs"] == 30 * 8 * 128 * 576 * 4
    assert ck.total < plain.total / 4


def test_kbit_preparation_doubles_the_16_bit_rest_and_the_residual_stream() -> None:
    """QLoRA as notebook 01b runs it (float32 embedding and norms) against the same 4-bit load without the step."""
    arch = Architecture.from_config("smollm2-135m")
    prepared, plain = (
        estimate_step("smollm2-135m", method="qlora", batch=8, seq=512, checkpointing=True, kbit_preparation=kbit)
        for kbit in (True, False)
    )
    rest = sum(n for _, n, is_linear in arch.param_tensors() if not is_linear)  # embedding (= tied head), norms
    assert prepared.weights_bytes - plain.weights_bytes == 2 * rest
    kept = "checkpointed layer inputs"
    assert prepared.activations.by_kind[kept] == 2 * plain.activations.by_kind[kept] == 30 * 8 * 512 * 576 * 4
    assert prepared.peak_bytes > plain.peak_bytes
    assert (
        "QLoRA, base in 4 bits (rank 8 on q_proj, v_proj), k-bit preparation (float32 embedding and norms)"
        in prepared.describe()
    )
    assert "no k-bit preparation (bfloat16 embedding and norms)" in plain.describe()
    assert "weights (NF4 base, float32 embedding/norms + float32 adapters)" in prepared.format()
    assert "weights (NF4 base, bfloat16 embedding/norms + float32 adapters)" in plain.format()


def test_kbit_preparation_is_ignored_by_the_other_methods() -> None:
    for method in ("full", "full-bf16", "lora", "lora-bf16"):
        on, off = (
            estimate_step("smollm2-135m", method=method, checkpointing=True, kbit_preparation=kbit)
            for kbit in (True, False)
        )
        assert on.peak_bytes == off.peak_bytes and on.weights_bytes == off.weights_bytes
        assert "k-bit" not in on.format() + off.format()
    with pytest.raises(TypeError, match="kbit_preparation"):
        estimate_step("smollm2-135m", method="qlora", kbit_preparation="no")


def test_accumulation_keeps_gradients_but_shrinks_activations() -> None:
    one = estimate_step("smollm2-135m", method="full", batch=8, seq=128)
    four = estimate_step("smollm2-135m", method="full", batch=2, seq=128, accumulation=4)
    assert four.activations.total < one.activations.total / 3
    assert dict(four.parts())["gradients kept across micro-batches"] == four.grads_bytes  # at the peak, all of them
    assert four.peak_bytes < one.peak_bytes


def test_peak_moment_moves_with_batch() -> None:
    assert estimate_step("smollm2-135m", method="full", batch=1, seq=128).peak_moment.startswith("end of backward")
    assert estimate_step("smollm2-135m", method="full", batch=8, seq=128).peak_moment.startswith("start of backward")


def test_cuda_has_no_process_baseline() -> None:
    cpu = estimate_step("smollm2-135m", method="lora", batch=8, seq=128)
    gpu = estimate_step("smollm2-135m", method="lora", batch=8, seq=128, device="cuda", attention="flash")
    assert cpu.attention.backend == "flash"  # the same kernel on both: only the baseline differs
    assert cpu.peak_bytes - gpu.peak_bytes == sm.CPU_BASELINE_BYTES + sm.CPU_RUNTIME_BYTES


def test_korthikanti_reference_numbers() -> None:
    arch = Architecture.from_config("smollm2-135m")
    k = sm.korthikanti_layer_bytes(arch, 1, 128)
    assert k["full recomputation"] == 2 * 128 * 576
    assert k["selective recomputation"] == 34 * 128 * 576


def test_format_lists_parts_and_total() -> None:
    text = estimate_step("smollm2-135m", method="lora", batch=8, seq=128).format()
    assert "activations saved for backward" in text and "total (predicted peak)" in text
    assert sm.comparison_line(2.0e9, 2.5e9) == "estimate 2.00 GB, measured 2.50 GB, error -20.0 %"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"method": "half"}, "method"),
        ({"batch": 0}, "batch"),
        ({"seq": 0}, "seq"),
        ({"seq": 10_000}, "seq"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"targets": ["attn"]}, "targets"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"device": "tpu"}, "device"),
        ({"accumulation": 0}, "accumulation"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        estimate_step("smollm2-135m", **kwargs)


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="config"):
        estimate_step({"model_type": "gpt2", "n_embd": 8})
    with pytest.raises(ValueError, match="hidden_size"):
        estimate_step({**SMALL, "hidden_size": 0})
    with pytest.raises(ValueError, match="measured_bytes"):
        sm.error_percent(1.0, 0.0)


# ---------------------------------------------------------------- the command line's --measure
def test_cli_measure_prints_the_comparison_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from course_utils import cli

    fake = measure.StepMeasurement(2_000_000_000, 440_000_000, 0, 0, 0, 0, 1.0, "cpu", "CPU: a fake")
    monkeypatch.setattr(measure, "measure_training_step", lambda *a, **k: fake)
    monkeypatch.setattr("course_utils.hardware.pick_device", lambda: __import__("torch").device("cpu"))
    assert cli.main(["memory", "--config", "smollm2-135m", "--batch", "8", "--measure"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    est = estimate_step("smollm2-135m", method="lora", batch=8, seq=128)
    assert last == sm.comparison_line(est.peak_bytes, 2e9)
    assert last.startswith("estimate ") and ", measured 2.00 GB, error " in last and last.endswith(" %")
