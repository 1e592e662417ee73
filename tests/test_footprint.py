"""course_utils.footprint: what get_memory_footprint() counts, part by part, computed on the meta device, measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_utils import footprint as F
from course_utils.architecture import Architecture
from course_utils.quiet import import_bitsandbytes
from course_utils.models import QWEN3_CONFIG, QWEN25_CONFIG, load_model, meta_model
from course_utils.standin import STANDIN_CONFIG
from course_utils.units import format_bytes
from tiny_models import tiny_config


# --------------------------------------------------------------------------------------------
# Counts and footprints on the meta device (the real architectures, no memory)
# --------------------------------------------------------------------------------------------
def test_meta_counts_of_the_shipped_architectures() -> None:
    smol = meta_model(STANDIN_CONFIG)
    assert F.count_model_parameters(smol) == 134_515_008
    assert smol.lm_head.weight is smol.model.embed_tokens.weight and next(smol.parameters()).device.type == "meta"
    assert F.count_model_parameters(meta_model(QWEN25_CONFIG)) == 1_543_714_304
    assert F.count_model_parameters(meta_model(QWEN3_CONFIG)) == 4_022_468_096


def test_standin_footprint_arithmetic() -> None:
    smol = meta_model(STANDIN_CONFIG)
    parts = {p.name: p for p in F.footprint_parts(smol, 4)}
    assert parts["embedding table"].params == 49152 * 576 == 28_311_552
    linears = parts["attention linears (q, k, v, o)"].params + parts["MLP linears (gate, up, down)"].params
    assert linears == 106_168_320 and parts["norms"].params == (2 * 30 + 1) * 576
    assert parts["lm_head"].params == 0  # tied: no bytes of its own
    # rotary frequencies, float32: 256 bytes on transformers 5 (two copies), 128 on 4.57 (one)
    buffers = parts["buffers"].bytes
    assert buffers in (128, 256)
    assert F.footprint_bytes(smol, 16) == 2 * 134_515_008 + buffers
    assert F.footprint_bytes(smol, 8) == 28_311_552 * 2 + 106_168_320 + 35_136 * 2 + buffers
    assert F.footprint_bytes(smol, 4) == 28_311_552 * 2 + 106_168_320 // 2 + 35_136 * 2 + buffers
    assert [format_bytes(F.footprint_bytes(smol, b)) for b in (16, 8, 4)] == ["269.0 MB", "162.9 MB", "109.8 MB"]
    assert F.computed_sizes(STANDIN_CONFIG).scales4 == 106_168_320 // 64 * 4 == 6_635_520
    assert round(100 * F.footprint_bytes(smol, 4) / F.footprint_bytes(smol, 16)) == 41


def test_breakdown_table_prints_small_parts_in_kb_and_bytes() -> None:
    table = F.breakdown_table(meta_model(STANDIN_CONFIG), 4)
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["norms"].count("70.3 KB") == 2  # 35,136 norm weights x 2 bytes, at 16 and at 4 bits
    assert lines["buffers"].count(" B") == 2 and "MB" not in lines["buffers"]  # a few hundred bytes
    assert "269.0 MB" in table and "109.8 MB" in table and "41 %" in table


def test_real_model_sizes_are_computed_about_a_third() -> None:
    sizes = F.computed_sizes(QWEN25_CONFIG, "Qwen2.5-1.5B-Instruct")
    assert sizes.params == 1_543_714_304
    buffers = sizes.bytes16 - 2 * 1_543_714_304  # float32 rotary buffers of head_dim / 2: two on transformers 5
    assert buffers in (64 * 4, 2 * 64 * 4)
    assert round(sizes.bytes16 / 1e9, 1) == 3.1 and round(sizes.bytes4 / 1e9, 1) == 1.1
    assert 0.30 < sizes.bytes4 / sizes.bytes16 < 0.40  # about a third, not a quarter
    assert "COMPUTED" in sizes.summary() and "not loaded" in sizes.summary()
    assert F.computed_sizes(QWEN25_CONFIG).name == "qwen2.5-1.5b-instruct"
    parts = {p.name: p for p in F.footprint_parts(meta_model(QWEN25_CONFIG), 4)}
    assert parts["linear biases"].params == 28 * (1536 + 256 + 256)  # Qwen2 has q, k, v biases: kept 16-bit
    assert not parts["linear biases"].quantized and parts["MLP linears (gate, up, down)"].quantized


def test_untied_head_stays_16_bit() -> None:
    model = meta_model(tiny_config(tie_word_embeddings=False))
    parts = {p.name: p for p in F.footprint_parts(model, 4)}
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert parts["lm_head"].params == 512 * 64 and parts["lm_head"].bytes == 2 * 512 * 64


@pytest.mark.parametrize("bits, error", [(3, ValueError), (32, ValueError), ("4", TypeError), (True, TypeError)])
def test_footprints_reject_bad_bits(bits, error) -> None:
    layer = torch.nn.Linear(2, 2)
    for function in (F.footprint_parts, F.breakdown_table):
        with pytest.raises(error, match="bits"):
            function(layer, bits)


# --------------------------------------------------------------------------------------------
# A Llama-shaped model by formula
# --------------------------------------------------------------------------------------------
def test_formula_matches_the_meta_model() -> None:
    """SmolLM2-135M's widths (its MLP is 1536 = 8/3 x 576 wide, k and v a third of q): the meta model's count."""
    arch = F.llama_like(576, 30, 49152)
    assert arch.params == 134_515_008 == F.count_model_parameters(meta_model(STANDIN_CONFIG))
    assert arch.projection_shapes() == Architecture.from_config(STANDIN_CONFIG).projection_shapes()
    report = F.four_bit_ratio_report(576, 30, 49152)
    assert "41 %" in report and "134,515,008 parameters (135 M)" in report
    assert F.llama_like(576, 30, 49152, tied=False).params == 134_515_008 + 28_311_552  # its own lm_head


def test_formula_with_widths_that_share_no_head_size() -> None:
    """hidden 640 and k, v 213 wide (a third, rounded): the counts are still exact."""
    arch = F.llama_like(640, 2, 1000)
    shapes = arch.projection_shapes()
    assert (shapes["q_proj"], shapes["k_proj"], shapes["o_proj"], shapes["up_proj"]) == (
        (640, 640),
        (640, 213),
        (640, 640),
        (640, round(8 / 3 * 640)),
    )
    assert arch.params == 2 * (2 * 640 * 640 + 2 * 640 * 213 + 3 * 640 * 1707 + 2 * 640) + 640 + 1000 * 640


@pytest.mark.parametrize(
    "config, params, ratio", [(F.LLAMA3_8B, 8_030_261_248, "35 %"), (F.LLAMA3_70B, 70_553_706_496, "27 %")]
)
def test_llama_3_rows_count_the_real_architectures(config, params, ratio) -> None:
    """Llama 3: 8 key/value heads (a quarter of q's 32 at 8B, an eighth of 64 at 70B), untied, 128,256 tokens."""
    from course_utils.architecture import count_on_meta, count_parameters

    assert count_parameters(config) == params == count_on_meta(config)[0]  # arithmetic = transformers on meta
    tensors = {name: n for name, n, _ in Architecture.from_config(config).param_tensors()}
    assert tensors["lm_head"] == tensors["embed_tokens"] == 128_256 * config["hidden_size"]
    report = F.config_ratio_report(config, "Llama 3")
    assert report.startswith("Llama 3: ") and f"{params:,} parameters" in report and ratio in report
    assert f"{config['num_attention_heads']} query heads sharing 8 key/value heads" in report
    assert "untied lm_head" in report
    assert F.config_ratio_report(config).startswith(config["_name_or_path"])


def test_config_report_of_a_shipped_preset_and_bad_input() -> None:
    report = F.config_ratio_report(STANDIN_CONFIG, "SmolLM2-135M")
    assert "134,515,008 parameters (135 M)" in report and "41 %" in report and "9 query heads sharing 3" in report
    qwen3 = F.config_ratio_report(QWEN3_CONFIG)  # q_norm and k_norm count as norms, q is wider than hidden
    assert "4,022,468,096 parameters" in qwen3
    with pytest.raises(ValueError, match="name"):
        F.config_ratio_report(STANDIN_CONFIG, "")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"hidden_size": 32}, ValueError),
        ({"num_layers": 0}, ValueError),
        ({"vocab_size": 10}, ValueError),
        ({"hidden_size": 576.0}, TypeError),
        ({"kv_fraction": 0}, ValueError),
        ({"tied": 1}, TypeError),
    ],
)
def test_formula_bad_input(kwargs, error) -> None:
    args = {"hidden_size": 576, "num_layers": 30, "vocab_size": 49152, **kwargs}
    with pytest.raises(error, match=next(iter(kwargs))):
        F.llama_like(**args)


# --------------------------------------------------------------------------------------------
# Measured against computed, on a tiny stand-in
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_footprints_measured_match_computed(tiny_standin) -> None:
    m16 = load_model(tiny_standin, 16, device="cpu")
    m4 = load_model(tiny_standin, 4, device="cpu")
    assert m16.get_memory_footprint() == F.footprint_bytes(m16, 16)
    assert m4.get_memory_footprint() == F.footprint_bytes(m16, 4) == F.footprint_bytes(m4, 4)
    assert F.measured_scale_bytes(m4) == F.computed_sizes(Path(tiny_standin) / "config.json").scales4
    assert F.count_model_parameters(m4) == F.count_model_parameters(m16)  # packed 4-bit weights at their true size
    table = F.breakdown_table(m16, 4)
    assert "embedding table" in table and "tied" in table and "4-bit / 16-bit" in table


# --------------------------------------------------------------------------------------------
# Chart and widget callback
# --------------------------------------------------------------------------------------------
def test_footprint_chart_and_groups() -> None:
    from course_utils.lessons import real_models_qlora as P

    smol = meta_model(STANDIN_CONFIG)
    groups = P.group_bytes(F.footprint_parts(smol, 4))
    assert groups["embedding table (stays 16-bit)"] == 2 * 28_311_552
    assert format_bytes(sum(groups.values())) == "109.8 MB" and sum(groups.values()) == F.footprint_bytes(smol, 4)
    b16 = F.footprint_bytes(smol, 16)
    fig = P.footprint_chart([("16-bit", F.footprint_parts(smol, 16), b16), ("4-bit", F.footprint_parts(smol, 4), b16)])
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    with pytest.raises(TypeError, match="parts"):
        P.group_bytes([1, 2])
    with pytest.raises(ValueError, match="bars"):
        P.footprint_chart([])
    with pytest.raises(ValueError, match="bytes16"):
        P.footprint_chart([("x", F.footprint_parts(smol, 4), 0)])
    import matplotlib.pyplot as plt

    plt.close("all")


def test_the_widgets_report() -> None:
    assert "41 %" in F.four_bit_ratio_report(576, 30, 49152, True)
    out = F.four_bit_ratio_report(4096, 32, 128_256, False, kv_fraction=1 / 4)
    assert "untied lm_head" in out and "lm_head 8 %" in out


# --------------------------------------------------------------------------------------------
# The half-byte floor against a real 7B model (notebook 04's Qwen2.5-7B cell)
# --------------------------------------------------------------------------------------------
#: Qwen's Qwen2.5-7B (Qwen/Qwen2.5-7B), the fields of its ``config.json`` that decide its size: 28 query heads
#: share 4 key/value heads of 128, q/k/v carry biases (qwen2), and the lm_head is a separate (untied) table.
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def _nf4_scale_bytes(n_weights: int, double_quant: bool = True) -> float:
    """The per-weight rule: one float32 per 64 weights, or (double quantization) one byte per 64 weights plus
    one float32 per 256 of those bytes."""
    return n_weights / 64 + n_weights / (64 * 256) * 4 if double_quant else n_weights / 64 * 4


def test_a_real_7b_in_4_bits_is_about_one_and_a_half_times_the_half_byte_floor() -> None:
    """notebook 04 writes these sums by hand from the config's numbers; the meta-device model must agree."""
    parts = F.footprint_parts(meta_model(QWEN25_7B), 16)
    params = sum(p.params for p in parts if p.name != "buffers")
    quantized = sum(p.params for p in F.footprint_parts(meta_model(QWEN25_7B), 4) if p.quantized)
    layers, width, mlp, kv, vocab = 28, 3584, 18_944, 512, 152_064
    linears = layers * (2 * width * width + 2 * width * kv + 3 * width * mlp)
    rest = 2 * vocab * width + layers * (2 * width + width + 2 * kv) + width
    assert params == linears + rest == 7_615_616_512 == Architecture.from_config(QWEN25_7B).params
    assert quantized == linears == 6_525_288_448
    codes_and_scales, kept = quantized * 0.5 + _nf4_scale_bytes(quantized), (params - quantized) * 2.0
    assert round(params * 0.5 / 1e9, 2) == 3.81  # the floor: every parameter at half a byte
    assert round(codes_and_scales / 1e9, 2) == 3.37 and round(kept / 1e9, 2) == 2.18
    assert round((codes_and_scales + kept) / 1e9, 2) == 5.55 == round(3.37 + 2.18, 2)  # the printed parts add up
    assert round((codes_and_scales + kept) / (params * 0.5), 2) == 1.46
    assert round(100 * (codes_and_scales + kept) / (2 * params)) == 36  # about a third of 16 bits, as in 01b
    assert 8 * _nf4_scale_bytes(10**9) / 10**9 == pytest.approx(0.127, abs=5e-4)


def test_the_standin_scales_match_the_per_weight_rule() -> None:
    assert F.computed_sizes(STANDIN_CONFIG).scales4 == _nf4_scale_bytes(106_168_320, double_quant=False)


# --------------------------------------------------------------------------------------------
# A CPU with AVX-512-bf16 repacks 4-bit layers at their first run: 01b measures the scales before it
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "double-quantized"])
def test_scales_are_counted_as_loaded_with_the_cpu_repack_forced_on_and_off(nested: bool) -> None:
    """bitsandbytes (0.49+) repacks a Linear4bit the first time it runs without gradients on a CPU with
    AVX-512-bf16: its scales turn bfloat16 and double quantization is undone. Forced off, a run leaves the scales
    as loaded; forced on (the repack that CPU does), they shrink. So 01b counts them before any run."""
    bnb = import_bitsandbytes()
    if bnb is None:
        pytest.skip("bitsandbytes is not installed")
    functional = pytest.importorskip("bitsandbytes.functional")
    if not hasattr(functional, "_convert_weight_packed_for_cpu"):
        pytest.skip("this bitsandbytes never repacks for a CPU")
    layer = bnb.nn.Linear4bit(
        256, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4", compress_statistics=nested
    )
    layer.load_state_dict({"weight": torch.randn(64, 256, generator=torch.Generator().manual_seed(0))})
    model = torch.nn.Sequential(layer.to("cpu")).eval()
    loaded = F.measured_scale_bytes(model)
    assert loaded == (256 * 64 // 64 + 4 + 256 * 4 + 4 if nested else 256 * 64 // 64 * 4)  # 8-bit or float32 absmax
    layer.support_avx512bf16_for_cpu = False  # forced off: a run changes nothing
    with torch.no_grad():
        model(torch.randn(2, 256))
    assert F.measured_scale_bytes(model) == loaded
    weight = layer.weight  # forced on: what the first run does on such a CPU
    weight.data, weight.quant_state = functional._convert_weight_packed_for_cpu(weight.data, weight.quant_state)
    assert F.measured_scale_bytes(model) == 256 * 64 // 64 * 2  # bfloat16 absmax, no double quantization


def test_01b_counts_the_scales_before_the_4bit_model_first_runs() -> None:
    source = (Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01b_real_models_qlora.py").read_text()
    assert -1 < source.index("measured_scale_bytes(model_4)") < source.index(".generate(")
