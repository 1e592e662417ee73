"""The attention kernel a step gets (course_utils.attention), and what the math fallback keeps.

The CUDA rules are checked against the documented conditions, one profile at a time; the math backend's saved
tensors are checked exactly against autograd, and its peak against a measured CPU step with the backend forced
(torch.nn.attention.sdpa_kernel), on a narrow many-headed model whose s x s scores dominate the difference.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import attention, datasheets, measure
from course_utils import step_memory as sm
from course_utils.bottleneck import what_is_my_bottleneck
from course_utils.cli import main
from course_utils.configs import read_config
from course_utils.training_step import run_step
import tiny_models
from gpu_sim import simulate

#: Llama-family, tiny, with grouped-query heads (4 query heads, 2 K/V heads).
TINY = tiny_models.TINY


# ---------------------------------------------------------------- the CUDA rules, card by card
@pytest.mark.parametrize(
    "card, dtype, gqa, expected",
    [
        ("T4", "float16", True, "math"),  # sm75: no flash; grouped-query heads: no memory-efficient kernel
        ("T4", "float16", False, "efficient"),
        ("T4", "float32", False, "efficient"),
        ("T4", "bfloat16", False, "math"),  # no bfloat16 kernel before sm80
        ("L4", "bfloat16", True, "flash"),
        ("A100", "bfloat16", True, "flash"),
        ("A100", "float32", True, "math"),  # flash needs 16 bits; efficient takes no grouped-query heads
        ("A100", "float32", False, "efficient"),
        ("H100", "float16", True, "cudnn"),  # sm90: PyTorch tries cuDNN attention first (seen on an H200)
        ("H200", "bfloat16", True, "cudnn"),
        ("H200", "float32", True, "math"),  # cuDNN attention takes 16-bit inputs only (an H200 ran math)
        ("P100", "float16", False, "efficient"),
    ],
)
def test_cuda_rules(card: str, dtype: str, gqa: bool, expected: str) -> None:
    choice = attention.cuda_backend(datasheets.lookup(card).capability, dtype, gqa=gqa, head_dim=64)
    assert choice.backend == expected


def test_cudnn_goes_first_only_on_sm90_and_sm100_and_steps_back_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def backend(cap: tuple[int, int], head_dim: int = 64, mask: bool = False) -> str:
        return attention.cuda_backend(cap, "bfloat16", gqa=True, head_dim=head_dim, mask=mask).backend

    assert [backend(cap) for cap in [(8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)]] == [
        "flash",
        "flash",
        "cudnn",
        "cudnn",
        "flash",  # sm103 (B300): not in PyTorch's list
        "flash",
    ]
    assert backend((9, 0), mask=True) == "cudnn"  # cuDNN takes a mask; flash would not
    assert backend((9, 0), head_dim=256) == "cudnn" and backend((10, 0), head_dim=256) == "flash"
    assert backend((9, 0), head_dim=60) == "flash"  # not a multiple of 8
    for value, expected in [("1", "flash"), ("true", "flash"), ("0", "cudnn"), ("", "cudnn")]:
        monkeypatch.setenv(attention.CUDNN_DEPRIORITIZED, value)
        assert backend((9, 0)) == expected, value


def test_cuda_rules_mask_and_head_size() -> None:
    a100 = datasheets.lookup("A100").capability
    assert attention.cuda_backend(a100, "bfloat16", gqa=False, head_dim=64, mask=True).backend == "efficient"
    assert attention.cuda_backend(a100, "bfloat16", gqa=False, head_dim=512).backend == "math"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (9, 9, 64), (14, 2, 64), (16, 8, 128)])
def test_cpu_rule_is_pytorchs_own(dtype: str, heads: int, kv_heads: int, head_dim: int) -> None:
    """The written-out CPU rule (a 16-bit step is bfloat16 there) against the choice this torch makes, with the call
    transformers makes (causal, no mask, enable_gqa where K/V heads are fewer), for every 16-bit dtype."""
    from torch.nn.attention import SDPBackend

    q = torch.zeros(1, heads, 4, head_dim, dtype=getattr(torch, dtype))
    kv = torch.zeros(1, kv_heads, 4, head_dim, dtype=q.dtype)
    asked = SDPBackend(torch._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=kv_heads != heads)).name
    names = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "MATH": "math"}
    nbytes = 4 if dtype == "float32" else 2
    rule = attention.choose_backend(device="cpu", dtype_bytes=nbytes, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    assert rule.backend == names[asked]


def test_every_datasheet_has_a_capability_and_a_mig_slice_is_not_the_card() -> None:
    assert all(sheet.capability >= (6, 0) for sheet in datasheets.DATASHEETS.values())
    assert datasheets.datasheet_key("NVIDIA A100-SXM4-40GB MIG 1g.5gb") is None
    assert datasheets.datasheet_key("NVIDIA A100-SXM4-40GB") == "A100-40GB"


# ---------------------------------------------------------------- the estimate follows the card present
@pytest.mark.parametrize(
    "card, method, autocast, expected",
    [
        ("T4", "lora-bf16", False, "math"),  # float16 on sm75, grouped-query heads
        ("A100", "lora-bf16", False, "flash"),
        ("A100", "lora", True, "flash"),  # bf16 autocast: SDPA gets 16-bit inputs
        ("A100", "lora", False, "math"),  # float32 attention with grouped-query heads
        ("H100", "qlora", False, "math"),  # 01b's recipe: k-bit preparation makes the hidden states float32
    ],
)
def test_estimate_uses_the_present_gpu(
    monkeypatch: pytest.MonkeyPatch, card: str, method: str, autocast: bool, expected: str
) -> None:
    simulate(monkeypatch, card)
    est = sm.estimate_step("smollm2-135m", method=method, autocast=autocast, seq=256, device="cuda")
    assert est.attention.backend == expected and est.spec["attention"] == expected
    assert est.format().splitlines()[1].startswith(f"attention: {expected} (")
    fused = sm.estimate_step(
        "smollm2-135m", method=method, autocast=autocast, seq=256, device="cuda", attention="flash"
    )
    assert (est.peak_bytes > fused.peak_bytes) == (expected == "math")


def test_math_keeps_the_scores_in_float32() -> None:
    """16-bit inputs are upcast: the softmax is b x heads x s x s float32 numbers per layer, whatever the dtype."""
    arch_heads, layers, batch, seq = 9, 30, 2, 256
    for method in ("lora", "lora-bf16"):
        est = sm.estimate_step("smollm2-135m", method=method, batch=batch, seq=seq, attention="math")
        assert est.activations.scores_bytes == batch * arch_heads * seq * seq * 4
        kinds = est.activations.by_kind
        assert kinds["attention (math: float32 q, k, v and s x s softmax)"] >= layers * est.activations.scores_bytes


def test_bad_attention_names_the_argument() -> None:
    with pytest.raises(ValueError, match="attention"):
        sm.estimate_step("smollm2-135m", attention="fast")
    with pytest.raises(ValueError, match="attention"):
        measure.step_spec("smollm2-135m", attention="flash")  # a step can only force math; auto lets torch pick


# ---------------------------------------------------------------- exact against autograd, math forced
STEP = {"batch": 2, "seq": 16, "lora_rank": 4}


def _tiny_step(method: str, autocast: str | None, checkpointing: bool, targets: tuple, attention: str) -> dict:
    """A real step of the tiny model, in this process (the counts are exact; no peak is read)."""
    step = dict(method=method, targets=targets, checkpointing=checkpointing, autocast=autocast, attention=attention)
    spec = {**measure.step_spec(TINY, **STEP, **step, steps=1), "device": "cpu"}
    return run_step(spec)


@pytest.mark.parametrize(
    "method, autocast, checkpointing, targets",
    [
        ("lora", None, False, ("q_proj", "v_proj")),
        ("lora", None, False, ("k_proj", "o_proj")),  # q needs no gradient in the first layer
        ("full", "bfloat16", False, ("q_proj", "v_proj")),
        ("lora-bf16", None, False, ("q_proj", "v_proj")),
        ("lora", None, True, ("q_proj", "v_proj")),
    ],
)
def test_math_saved_activations_are_exact(
    method: str, autocast: str | None, checkpointing: bool, targets: tuple
) -> None:
    real = _tiny_step(method, autocast, checkpointing, targets, "math")
    est, fused = (
        sm.estimate_step(
            TINY,
            method=method,
            **STEP,
            targets=targets,
            checkpointing=checkpointing,
            autocast=bool(autocast),
            attention=kernel,
        )
        for kernel in ("math", "flash")
    )
    assert real["extra"]["attention"] == "math"
    assert est.activations.total == real["saved_activations_bytes"]
    assert checkpointing or fused.activations.total != real["saved_activations_bytes"]  # the check can fail


def test_the_recorder_sees_what_autocast_hands_the_kernel() -> None:
    """bf16 autocast on a CPU: SDPA gets bfloat16 tensors and runs fused (not math, as float32/bf16 inputs would)."""
    real = _tiny_step("lora", "bfloat16", False, ("q_proj", "v_proj"), "auto")
    rule = attention.choose_backend(device="cpu", dtype_bytes=2, heads=4, kv_heads=2, head_dim=16)
    assert real["extra"]["attention"] == rule.backend == "flash"


# ---------------------------------------------------------------- the peak, measured where the scores dominate
#: SmolLM2 narrowed to 256 wide and 4 layers, with 16 query heads (4 K/V heads) of 16: at 1,024 tokens each layer's
#: s x s float32 scores (64 MB) outweigh the rest of its activations, so the step costs ~15 s, not SmolLM2's minute.
MANY_HEADS = {
    **read_config("smollm2-135m"),
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 16,
}


def test_math_backend_peak_within_5_percent_where_the_scores_dominate() -> None:
    """LoRA, 1 x 1,024 tokens, SDPA forced to math in a fresh CPU process."""
    step = {"method": "lora", "batch": 1, "seq": 1024}
    m = measure.measure_training_step(MANY_HEADS, **step, attention="math", timeout_s=300)
    est = sm.estimate_step(MANY_HEADS, **step, attention="math")
    fused = sm.estimate_step(MANY_HEADS, **step, attention="flash")
    assert m.extra["attention"] == "math"
    assert abs(sm.error_percent(est.peak_bytes, m.peak_bytes)) <= 5
    assert sm.error_percent(fused.peak_bytes, m.peak_bytes) < -10  # assuming a fused kernel misses the scores


# ---------------------------------------------------------------- where the backend is named
def test_cli_names_the_backend_per_card(capsys: pytest.CaptureFixture) -> None:
    status = main(
        [
            "memory",
            "--config",
            "smollm2-135m",
            "--method",
            "lora-bf16",
            "--batch",
            "4",
            "--seq",
            "1024",
            "--gpu",
            "T4,A100",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    backends = [line.split()[1] for line in out.splitlines() if line.startswith("attention:")]
    assert backends == ["math", "flash"]  # one estimate per card: the T4 keeps the scores, the A100 does not
    totals = [float(line.split()[-2]) for line in out.splitlines() if "total (predicted peak)" in line]
    assert totals[0] > totals[1]


def test_planner_names_the_kernel_and_the_16_bit_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """A card named by its capability is planned for as that card, whatever GPU is present (here an H100)."""
    simulate(monkeypatch, "H100")
    t4 = what_is_my_bottleneck("smollm2-135m", "full", 16, 16.0, seq=512, capability=(7, 5))
    assert "; math attention)" in t4.text().splitlines()[0]
    assert all("bf16" not in " ".join(o.changes) for o in t4.options)
    a100 = what_is_my_bottleneck("smollm2-135m", "full", 16, 8.0, seq=512, capability=(8, 0))
    assert any("LoRA on a bf16 base" in o.changes for o in a100.options)
    named, present = (
        what_is_my_bottleneck("smollm2-135m", "lora-bf16", 16, 80.0, seq=512, capability=cap) for cap in ((7, 5), None)
    )
    assert (named.estimate.attention.backend, present.estimate.attention.backend) == ("math", "cudnn")
