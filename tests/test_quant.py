"""course_utils.quant: the lesson's figures exactly, the error bound, blocks, zero-points, NF4, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from course_utils import quant, quiet


def _expand(per_block: torch.Tensor, q: quant.QuantizedTensor) -> torch.Tensor:
    """One value per block -> one value per element, in the tensor's shape."""
    n = q.codes.numel()
    size = q.block_size if q.block_size and q.block_size < n else n
    return per_block.float().repeat_interleave(size)[:n].reshape(q.codes.shape)


#: The lesson's 4-bit steps (levels -7..7) of the eight weights, one step = 0.35 / 7 = 0.05.
_EIGHT_STEPS_4BIT = (2, -1, 6, -4, 0, -7, 4, 1)


@pytest.fixture(scope="module")
def big() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4096, 4096, generator=gen)


# --------------------------------------------------------------------------------------------
# The eight numbers
# --------------------------------------------------------------------------------------------
def test_eight_number_table_matches_the_lesson_exactly() -> None:
    table = quant.eight_numbers(4)
    assert table.weights == quant.EIGHT_WEIGHTS == (0.12, -0.05, 0.31, -0.22, 0.02, -0.35, 0.18, 0.07)
    assert table.steps == _EIGHT_STEPS_4BIT
    assert round(table.step, 2) == 0.05
    assert table.step == pytest.approx(0.35 / 7)
    assert [round(v, 2) for v in table.read_back] == [0.10, -0.05, 0.30, -0.20, 0.00, -0.35, 0.20, 0.05]
    assert [round(e, 2) + 0.0 for e in table.errors] == [-0.02, 0.0, -0.01, 0.02, -0.02, 0.0, 0.02, -0.02]
    assert table.decimals == 2


def test_eight_number_table_prints_as_in_the_lesson() -> None:
    lines = quant.format_eight_numbers(quant.eight_numbers(4)).splitlines()
    assert [ln.split()[-8:] for ln in lines] == [
        ["0.12", "-0.05", "0.31", "-0.22", "0.02", "-0.35", "0.18", "0.07"],
        ["2", "-1", "6", "-4", "0", "-7", "4", "1"],
        ["0.10", "-0.05", "0.30", "-0.20", "0.00", "-0.35", "0.20", "0.05"],
        ["-0.02", "0", "-0.01", "+0.02", "-0.02", "0", "+0.02", "-0.02"],
    ]
    assert "step x 0.05" in lines[2]


def test_eight_numbers_take_32_bytes_or_4_plus_4() -> None:
    x = torch.tensor(quant.EIGHT_WEIGHTS)
    assert x.nbytes == 32
    parts = quant.storage(quant.quantize(x, 4))
    assert (parts.codes, parts.scales, parts.zero_points, parts.total) == (4, 4, 0, 8)


@pytest.mark.parametrize("bits", range(2, 9))
def test_eight_numbers_at_every_width_stay_within_half_a_step(bits: int) -> None:
    table = quant.eight_numbers(bits)
    q_max = 2 ** (bits - 1) - 1
    assert table.step == pytest.approx(0.35 / q_max, rel=1e-6)
    assert max(abs(s) for s in table.steps) == q_max
    assert all(abs(e) <= table.step / 2 + 1e-7 for e in table.errors)
    assert len(quant.format_eight_numbers(table).splitlines()) == 4


# --------------------------------------------------------------------------------------------
# The 4096 x 4096 experiment
# --------------------------------------------------------------------------------------------
def test_the_4096_experiment_prints_the_lesson_figures(big: torch.Tensor) -> None:
    torch.manual_seed(0)
    w = torch.randn(4096, 4096)
    assert torch.equal(w, big)
    lines = [f"float32: {w.nbytes / 1e6:.0f} MB"]
    for bits in (8, 4):
        q = quant.quantize(w, bits)
        lines.append(
            f"int{bits}:    {quant.storage(q).total / 1e6:.0f} MB, average error {quant.mean_abs_error(w, q):.3f}"
        )
    assert lines == ["float32: 67 MB", "int8:    17 MB, average error 0.010", "int4:    8 MB, average error 0.189"]


def test_quantize_gives_the_textbook_codes(big: torch.Tensor) -> None:
    x = big[:256]
    s = x.abs().max() / 7
    assert torch.equal(torch.round(x / s).to(torch.int8), quant.quantize(x, 4).codes)


# --------------------------------------------------------------------------------------------
# The notebook's plain-torch cells give what the helpers give (so the charts and widgets, which use the
# helpers, show the same numbers as the lines a learner reads)
# --------------------------------------------------------------------------------------------
def test_plain_int8_example_is_quantize() -> None:
    x = torch.tensor([0.5, -1.27, 0.02, 1.0])
    s = x.abs().max() / 127
    q = torch.round(x / s)
    ref = quant.quantize(x, 8)
    assert torch.equal(q.to(torch.int8), ref.codes) and torch.equal(s.reshape(1), ref.scales)
    assert torch.equal(q * s, quant.dequantize(ref))
    assert q.int().tolist() == [50, -127, 2, 100] and round(s.item(), 6) == 0.01


def test_plain_zero_point_example_is_asymmetric_quantize() -> None:
    x = torch.tensor([-0.2, 0.0, 0.3, 1.0, 2.35])  # min < 0 < max: the plain formulas need no clamp
    s = (x.max() - x.min()) / 255
    z = torch.round(-x.min() / s)
    q = torch.round(x / s) + z
    ref = quant.quantize(x, 8, symmetric=False)
    assert torch.equal(q.to(torch.uint8), ref.codes) and int(z) == int(ref.zero_points) == 20
    assert float(s) == pytest.approx(float(ref.scales), rel=1e-6)
    assert torch.allclose(s * (q - z), quant.dequantize(ref), atol=1e-6, rtol=0)
    assert quant.mean_abs_error(x, ref) < 1e-6
    s_sym = x.abs().max() / 127
    assert torch.equal(torch.round(x / s_sym).to(torch.int8), quant.quantize(x, 8).codes)


def test_plain_eight_numbers_are_the_table() -> None:
    w = torch.tensor(quant.EIGHT_WEIGHTS)
    s = w.abs().max() / 7
    q = torch.round(w / s)
    table = quant.eight_numbers(4)
    assert tuple(q.int().tolist()) == table.steps == _EIGHT_STEPS_4BIT
    assert tuple((q * s).tolist()) == table.read_back
    assert [f"{v:+5.2f}" for v in (q * s - w).tolist()] == [
        "-0.02",
        "+0.00",
        "-0.01",
        "+0.02",
        "-0.02",
        "+0.00",
        "+0.02",
        "-0.02",
    ]
    assert (w.nbytes, w.numel() * 4 // 8, s.element_size()) == (32, 4, 4)


@pytest.mark.parametrize("bits", [8, 4])
def test_plain_4096_snippet_is_quantize(big: torch.Tensor, bits: int) -> None:
    w = big
    s = w.abs().max() / (2 ** (bits - 1) - 1)
    q = torch.round(w / s)
    ref = quant.quantize(w, bits)
    assert torch.equal(q.to(torch.int8), ref.codes)
    assert torch.equal(q * s, quant.dequantize(ref))
    assert w.numel() * bits / 8 + quant.SCALE_BYTES == quant.storage(ref).total  # the plain size leaves out 4 bytes
    assert f"{(w - q * s).abs().mean():.3f}" == f"{quant.mean_abs_error(w, ref):.3f}" == {8: "0.010", 4: "0.189"}[bits]


def test_plain_blocks_of_64_are_quantize(big: torch.Tensor) -> None:
    w = big[:256]
    blocks = w.reshape(-1, 64)
    s = blocks.abs().amax(dim=1, keepdim=True) / 7
    w_hat = torch.round(blocks / s) * s
    ref = quant.quantize(w, 4, block_size=64)
    assert torch.equal(w_hat.reshape(w.shape), quant.dequantize(ref))
    assert w.numel() * 4 / 8 + s.numel() * 4 == quant.storage(ref).total


def test_plain_nf4_cell_is_quantize_nf4(big: torch.Tensor) -> None:
    w = big[:256]
    blocks = w.reshape(-1, 64)
    levels = quant.nf4_levels()
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    codes = torch.bucketize(blocks / absmax, (levels[1:] + levels[:-1]) / 2)
    ref = quant.quantize_nf4(w, 64)
    assert torch.equal(codes.reshape(w.shape).to(torch.uint8), ref.codes)
    assert torch.equal((levels[codes] * absmax).reshape(w.shape), quant.dequantize(ref))


def test_plain_nf4_recipe_is_nf4_levels() -> None:
    offset = (1 - 1 / 30 + 1 - 1 / 32) / 2
    positive = torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1]
    negative = torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1]
    z_scores = (
        torch.cat([-torch.special.ndtri(negative), torch.zeros(1, dtype=torch.float64), torch.special.ndtri(positive)])
        .sort()
        .values
    )
    assert offset == quant.NF4_OFFSET
    assert torch.equal((z_scores / z_scores.max()).float(), quant.nf4_levels())


def test_scheme_comparison_blocks_and_zero_points_help(big: torch.Tensor) -> None:
    rows = {(r.scheme, r.bits): r for r in quant.compare_schemes(big[:128])}
    for bits in (4, 8):
        one = rows[("one scale", bits)]
        blocks = rows[("blocks of 64", bits)]
        assert blocks.mean_error < 0.6 * one.mean_error
        assert rows[("one scale + zero-point", bits)].mean_error <= one.mean_error
        assert rows[("blocks of 64 + zero-points", bits)].mean_error < blocks.mean_error
    assert rows[("blocks of 64", 4)].bits_per_weight == 4.5
    assert rows[("blocks of 64 + zero-points", 4)].bits_per_weight == 4.5625
    text = quant.format_scheme_table(list(rows.values()), float32_bytes=big[:128].nbytes)
    assert len(text.splitlines()) == 10 and "float32 (no quantization)" in text


# --------------------------------------------------------------------------------------------
# The maths: error bound, blocks, zero-points, shapes, dtypes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("block_size", [None, 1, 7, 64, 1000])
@pytest.mark.parametrize("symmetric", [True, False])
def test_every_value_is_within_half_a_step(bits: int, block_size: int | None, symmetric: bool) -> None:
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(33, 31, generator=gen) * 3 + 0.5
    q = quant.quantize(x, bits, block_size, symmetric)
    x_hat = quant.dequantize(q)
    half_step = _expand(q.scales, q) / 2
    assert bool(((x - x_hat).abs() <= half_step * (1 + 1e-5) + 1e-6).all())
    lo, hi = quant.level_range(bits, symmetric)
    assert int(q.codes.min()) >= lo and int(q.codes.max()) <= hi
    assert q.codes.dtype == (torch.int8 if symmetric else torch.uint8)
    blocks = 1 if block_size is None or block_size >= x.numel() else math.ceil(x.numel() / block_size)
    assert q.scales.numel() == blocks


def test_level_ranges() -> None:
    assert quant.level_range(8) == (-127, 127)
    assert quant.level_range(4) == (-7, 7)
    assert quant.level_range(2) == (-1, 1)
    assert quant.level_range(8, symmetric=False) == (0, 255)
    assert quant.level_range(4, symmetric=False) == (0, 15)


def test_the_largest_value_lands_exactly_on_q_max() -> None:
    x = torch.tensor([0.5, -1.27, 0.02, 1.0])
    q = quant.quantize(x, 8)
    assert q.codes.tolist() == [50, -127, 2, 100]
    assert q.scales.item() == pytest.approx(0.01)


def test_block_scales_beat_one_scale_on_data_with_outliers() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 64, generator=gen) * 0.02
    x[3, 5], x[40, 17] = 4.0, -3.0  # two outliers
    one = quant.mean_abs_error(x, quant.quantize(x, 4))
    blocks = quant.mean_abs_error(x, quant.quantize(x, 4, block_size=64))
    assert blocks < one / 5  # the 62 blocks without an outlier are read back almost exactly


def test_zero_point_round_trip_is_exact_on_its_own_grid() -> None:
    x = torch.tensor([-0.2, 0.0, 0.3, 1.0, 2.35])
    q = quant.quantize(x, 8, symmetric=False)
    assert q.scales.item() == pytest.approx(0.01)
    assert q.zero_points.tolist() == [20]
    assert q.codes.tolist() == [0, 20, 50, 120, 255]
    assert torch.allclose(quant.dequantize(q), x, atol=1e-6)
    assert quant.mean_abs_error(x, q) < quant.mean_abs_error(x, quant.quantize(x, 8)) / 10


def test_zero_point_keeps_zero_exact_and_handles_one_sided_data() -> None:
    gen = torch.Generator().manual_seed(2)
    positive = torch.rand(1000, generator=gen) + 0.5  # all positive: lo is clamped to 0
    positive[7] = 0.0
    for bits in (2, 4, 8):
        q = quant.quantize(positive, bits, block_size=100, symmetric=False)
        x_hat = quant.dequantize(q)
        assert x_hat[7].item() == 0.0
        assert bool(((positive - x_hat).abs() <= _expand(q.scales, q) / 2 * (1 + 1e-5) + 1e-6).all())
    negative = -positive
    q = quant.quantize(negative, 4, symmetric=False)
    assert q.zero_points.tolist() == [15]
    assert bool(((negative - quant.dequantize(q)).abs() <= q.scales / 2 + 1e-6).all())


@pytest.mark.parametrize("symmetric", [True, False])
def test_all_zero_tensor_reads_back_as_zeros(symmetric: bool) -> None:
    for x in (torch.zeros(5), torch.zeros(3, 4)):
        q = quant.quantize(x, 4, block_size=2, symmetric=symmetric)
        out = quant.dequantize(q)
        assert torch.equal(out, torch.zeros_like(x))
        assert not torch.isnan(q.scales).any()
    x = torch.cat([torch.zeros(64), torch.randn(64)])  # one all-zero block next to a normal one
    out = quant.dequantize(quant.quantize(x, 4, block_size=64, symmetric=symmetric))
    assert torch.equal(out[:64], torch.zeros(64)) and not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_dtypes_and_shapes_come_back(dtype: torch.dtype) -> None:
    x = torch.linspace(-1, 1, 2 * 3 * 5, dtype=dtype).reshape(2, 3, 5)
    q = quant.quantize(x, 8, block_size=4)
    out = quant.dequantize(q)
    assert out.dtype == dtype and out.shape == x.shape and q.codes.shape == x.shape
    assert q.scales.numel() == 8
    assert float((out.float() - x.float()).abs().max()) < 0.01


@pytest.mark.parametrize("symmetric", [True, False])
def test_extreme_magnitudes_stay_finite(symmetric: bool) -> None:
    for x in (torch.tensor([-3e38, 3e38, 1.0]), torch.tensor([1e-40, -2e-40, 0.0])):
        out = quant.dequantize(quant.quantize(x, 8, symmetric=symmetric))
        assert bool(torch.isfinite(out).all())
    with pytest.raises(ValueError, match="too large for float32"):
        quant.quantize(torch.tensor([1e300, 0.0], dtype=torch.float64), 8)


def test_scalar_tensor_quantizes() -> None:
    q = quant.quantize(torch.tensor(0.7), 4)
    assert quant.dequantize(q).item() == pytest.approx(0.7)


def test_storage_counts_codes_scales_and_zero_points(big: torch.Tensor) -> None:
    q8 = quant.quantize(big, 8)
    assert quant.storage(q8).total == 16_777_216 + 4
    q4 = quant.quantize(big[:64], 4, block_size=64)
    assert quant.storage(q4) == quant.Storage(codes=131_072, scales=16_384, zero_points=0)
    assert quant.bits_per_weight(q4) == 4.5
    qz = quant.quantize(big[:64], 4, block_size=64, symmetric=False)
    assert quant.storage(qz).zero_points == 4096 * 4 // 8
    assert quant.storage(qz).total == 131_072 + 16_384 + 2_048
    odd = quant.quantize(torch.ones(3), 3)  # 9 bits of codes round up to 2 bytes
    assert quant.storage(odd).codes == 2


@pytest.mark.parametrize(
    "numel, bits, block_size, symmetric",
    [
        (4096 * 4096, 4, 64, True),
        (4096 * 4096, 8, None, True),
        (1000, 3, 64, False),
        (3, 3, None, True),
        (100, 2, 16, False),
        (64, 4, 128, True),
        (11008 * 4096, 4, 64, True),
    ],
)
def test_packed_storage_is_the_arithmetic_of_storage(numel: int, bits: int, block_size, symmetric: bool) -> None:
    expected = quant.packed_storage(numel, bits, block_size, symmetric)
    if numel <= 4096 * 4096:  # the biggest case is checked by its own numbers below, without building it
        q = quant.quantize(torch.randn(numel), bits, block_size, symmetric)
        assert expected == quant.storage(q)
        assert expected.scales == quant.SCALE_BYTES * q.scales.numel()
    assert expected.codes == math.ceil(numel * bits / 8)


def test_packed_storage_of_the_exercise_matrix() -> None:
    parts = quant.packed_storage(11008 * 4096, 4, 64)
    assert parts == quant.Storage(codes=22_544_384, scales=2_818_048, zero_points=0)
    assert parts.total == 25_362_432
    assert quant.packed_storage(4096 * 4096, 4, 64).total == 9_437_184


def test_names_say_what_the_format_is() -> None:
    x = torch.randn(128)
    assert quant.quantize(x, 4).name == "int4, one scale"
    assert quant.quantize(x, 8, 64, symmetric=False).name == "int8 + zero-point, blocks of 64"
    assert quant.quantize_nf4(x).name == "nf4, blocks of 64"


def test_error_helpers() -> None:
    x = torch.tensor([1.0, -1.0, 0.5])
    x_hat = torch.tensor([1.5, -1.0, 0.0])
    assert quant.mean_abs_error(x, x_hat) == pytest.approx(1 / 3)
    assert quant.max_abs_error(x, x_hat) == pytest.approx(0.5)
    q = quant.quantize(x, 8)
    assert quant.mean_abs_error(x, q) == quant.mean_abs_error(x, quant.dequantize(q))


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bits, err",
    [
        (1, ValueError),
        (9, ValueError),
        (0, ValueError),
        (-4, ValueError),
        (4.0, TypeError),
        ("4", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_bits(bits: object, err: type) -> None:
    with pytest.raises(err, match="bits"):
        quant.quantize(torch.ones(4), bits)


@pytest.mark.parametrize(
    "x, err, what",
    [
        ([0.1, 0.2], TypeError, "torch.Tensor"),
        (torch.tensor([1, 2, 3]), TypeError, "floating-point"),
        (torch.tensor([True, False]), TypeError, "floating-point"),
        (torch.tensor([1 + 1j]), TypeError, "floating-point"),
        (torch.empty(0), ValueError, "empty"),
        (torch.empty(3, 0), ValueError, "empty"),
        (torch.tensor([0.1, float("nan")]), ValueError, "NaN"),
        (torch.tensor([0.1, float("inf")]), ValueError, "inf"),
        (torch.tensor([float("-inf"), 0.1]), ValueError, "inf"),
    ],
)
def test_bad_tensors(x: object, err: type, what: str) -> None:
    with pytest.raises(err, match=what):
        quant.quantize(x, 4)
    with pytest.raises(err, match=what):
        quant.quantize(x, 4, block_size=2, symmetric=False)
    with pytest.raises(err, match=what):
        quant.quantize_nf4(x)


def test_nan_in_a_late_block_is_caught() -> None:
    x = torch.randn(1000)
    x[999] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        quant.quantize(x, 4, block_size=64)


@pytest.mark.parametrize(
    "block_size, err", [(0, ValueError), (-64, ValueError), (64.0, TypeError), ("64", TypeError), (True, TypeError)]
)
def test_bad_block_size(block_size: object, err: type) -> None:
    with pytest.raises(err, match="block_size"):
        quant.quantize(torch.ones(8), 4, block_size=block_size)
    with pytest.raises(err, match="block_size"):
        quant.quantize_nf4(torch.ones(8), block_size=block_size)


def test_other_bad_arguments() -> None:
    with pytest.raises(TypeError, match="symmetric"):
        quant.quantize(torch.ones(4), 4, symmetric="yes")
    with pytest.raises(ValueError, match="shape"):
        quant.mean_abs_error(torch.ones(4), torch.ones(5))
    with pytest.raises(TypeError, match="block_size"):
        quant.quantize_nf4(torch.ones(8), block_size=None)  # NF4 always has blocks
    with pytest.raises(ValueError, match="bits"):
        quant.compare_schemes(torch.ones(8), bits_list=(4, 12))
    with pytest.raises(ValueError, match="bits"):
        quant.eight_numbers(1)


# --------------------------------------------------------------------------------------------
# NF4
# --------------------------------------------------------------------------------------------
def test_nf4_levels_come_from_normal_quantiles() -> None:
    levels = quant.nf4_levels()
    assert levels.shape == (16,) and levels.dtype == torch.float32
    assert torch.equal(levels, levels.sort().values)
    assert levels[0].item() == -1.0 and levels[-1].item() == 1.0 and levels[7].item() == 0.0
    assert int((levels > 0).sum()) == 8 and int((levels < 0).sum()) == 7
    assert quant.NF4_OFFSET == pytest.approx(0.9677083, abs=1e-7)
    # the largest level before normalising is the z-score of the offset quantile
    z = torch.special.ndtri(torch.tensor(quant.NF4_OFFSET, dtype=torch.float64)).item()
    assert z == pytest.approx(1.848, abs=1e-3)
    # gaps grow towards the tails: levels are dense where normal weights are
    gaps = levels[8:].diff()
    assert bool((gaps[1:] > gaps[:-1]).all())


def test_nf4_probabilities_exclude_one_half() -> None:
    """The probabilities nf4_levels turns into z-scores (bitsandbytes' create_normal_map recipe)."""
    positive = torch.linspace(quant.NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1]
    negative = torch.linspace(quant.NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1]
    assert positive.shape == (8,) and negative.shape == (7,)
    assert positive[0].item() == negative[0].item() == pytest.approx(quant.NF4_OFFSET)
    assert 0.5 not in positive.tolist() and 0.5 not in negative.tolist()
    assert float(positive.min()) > 0.5 and float(negative.min()) > 0.5
    # evenly spaced towards 0.5: the positive side in 8 steps, the negative side in 7
    assert torch.allclose(positive.diff(), torch.full((7,), -(quant.NF4_OFFSET - 0.5) / 8, dtype=torch.float64))
    assert torch.allclose(negative.diff(), torch.full((6,), -(quant.NF4_OFFSET - 0.5) / 7, dtype=torch.float64))
    assert [round(p, 4) for p in positive.tolist()][-1] == 0.5585
    assert [round(p, 4) for p in negative.tolist()][-1] == 0.5668
    levels = quant.nf4_levels()
    z = torch.special.ndtri(positive)
    assert torch.allclose(levels[8:], (z / z.max()).float().flip(0))  # the 8 positive levels, ascending
    assert int((levels == 0).sum()) == 1  # one exact zero: 0.5's quantile, added once


def test_nf4_beats_int4_on_normal_weights(big: torch.Tensor) -> None:
    x = big[:256]
    nf4 = quant.quantize_nf4(x, 64)
    int4 = quant.quantize(x, 4, block_size=64)
    assert quant.storage(nf4) == quant.storage(int4)
    assert quant.mean_abs_error(x, nf4) < 0.85 * quant.mean_abs_error(x, int4)
    assert nf4.codes.dtype == torch.uint8 and int(nf4.codes.max()) <= 15
    scaled = quant.dequantize(nf4).reshape(-1, 64) / nf4.scales.unsqueeze(1)
    assert bool(torch.isin(scaled.round(decimals=5), quant.nf4_levels().round(decimals=5)).all())


def test_nf4_of_zeros_is_zeros() -> None:
    assert torch.equal(quant.dequantize(quant.quantize_nf4(torch.zeros(100))), torch.zeros(100))


bnb_installed = quiet.import_bitsandbytes() is not None


def _bnb_nf4_round_trip(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """bitsandbytes' NF4 of ``x`` in blocks of 64, as the notebook runs it: the read-back and the bytes stored."""
    import bitsandbytes.functional as F

    packed, state = F.quantize_4bit(x, blocksize=64, quant_type="nf4")
    return F.dequantize_4bit(packed, state), packed.numel() + state.absmax.numel() * 4


@pytest.mark.skipif(not bnb_installed, reason="bitsandbytes is not installed")
def test_nf4_matches_bitsandbytes(big: torch.Tensor) -> None:
    import bitsandbytes.functional as F

    table = F.get_4bit_type("nf4", device="cpu")[:16].float()
    assert torch.allclose(quant.nf4_levels(), table, atol=1e-6, rtol=0)
    x = big[:512]
    ours = quant.quantize_nf4(x, 64)
    theirs, size_bytes = _bnb_nf4_round_trip(x)
    assert size_bytes == quant.storage(ours).total
    differ = (quant.dequantize(ours) - theirs).abs() > 1e-4
    assert int(differ.sum()) <= 5  # only values within a hair of a boundary between two levels
    normalised = (x.reshape(-1, 64) / ours.scales.unsqueeze(1)).reshape(x.shape)[differ]
    levels = quant.nf4_levels()
    midpoints = (levels[1:] + levels[:-1]) / 2
    for v in normalised.tolist():
        assert float((midpoints - v).abs().min()) < 1e-6
    assert quant.mean_abs_error(x, theirs) == pytest.approx(quant.mean_abs_error(x, ours), rel=1e-4)


@pytest.mark.skipif(not bnb_installed, reason="bitsandbytes is not installed")
def test_nf4_levels_are_bitsandbytes_create_normal_map() -> None:
    """bitsandbytes' own construction (needs scipy): the same recipe, padded with zeros to 256 entries."""
    pytest.importorskip("scipy")
    import bitsandbytes.functional as F

    table = F.create_normal_map(offset=0.9677083, use_extra_value=True)
    assert table.numel() == 256 and int((table == 0).sum()) == 256 - 15  # 15 non-zero levels, then zeros
    distinct = torch.cat([table[table != 0], torch.zeros(1)]).sort().values
    assert torch.equal(distinct, F.get_4bit_type("nf4", device="cpu")[:16].float())  # its hard-coded table
    assert torch.allclose(quant.nf4_levels(), distinct, atol=2e-7, rtol=0)


@pytest.mark.skipif(not bnb_installed, reason="bitsandbytes is not installed")
def test_nf4_agreement_with_bitsandbytes(big: torch.Tensor) -> None:
    x = big[:512]
    ours = quant.quantize_nf4(x, 64)
    agreement = quant.nf4_agreement(x, ours, _bnb_nf4_round_trip(x)[0])
    assert agreement.total == x.numel() and agreement.differing <= 5
    assert agreement.boundary_distance < 1e-6 and agreement.holds(max_fraction=1e-5, max_distance=1e-6)


def test_nf4_agreement_measures_distance_to_a_boundary() -> None:
    levels = quant.nf4_levels()
    midpoint = float((levels[8] + levels[9]) / 2)  # between 0 and the first positive level
    x = torch.tensor([1.0, midpoint + 1e-3] + [0.0] * 62)  # one block of 64, absmax 1
    ours = quant.quantize_nf4(x, 64)
    assert quant.nf4_agreement(x, ours, quant.dequantize(ours)) == (0, 64, 0.0)
    other = quant.dequantize(ours).clone()
    other[1] = levels[8]  # the other side of the boundary
    agreement = quant.nf4_agreement(x, ours, other)
    assert agreement.differing == 1 and agreement.boundary_distance == pytest.approx(1e-3, rel=1e-3)
    assert not agreement.holds(max_fraction=0.1, max_distance=1e-6)
    assert agreement.holds(max_fraction=0.1, max_distance=2e-3)


def test_nf4_agreement_bad_input() -> None:
    x = torch.randn(128)
    ours = quant.quantize_nf4(x, 64)
    with pytest.raises(TypeError, match="ours"):
        quant.nf4_agreement(x, quant.quantize(x, 4, block_size=64), x)
    with pytest.raises(ValueError, match="other_x_hat"):
        quant.nf4_agreement(x, ours, x[:64])


# --------------------------------------------------------------------------------------------
# Whole models
# --------------------------------------------------------------------------------------------
def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_quantize_model_weights_returns_a_copy_by_default() -> None:
    model = _tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copy_, size = quant.quantize_model_weights(model, 4)
    assert copy_ is not model
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert size == (8 * 16 + 16 * 4) * 4 // 8 + 2 * 4
    for i in (0, 2):
        w = model[i].weight
        assert torch.equal(copy_[i].weight, quant.dequantize(quant.quantize(w, 4)))
        assert torch.equal(copy_[i].bias, model[i].bias)  # biases stay float32


def test_quantize_model_weights_per_row() -> None:
    model = _tiny_model()
    quantized, size = quant.quantize_model_weights(model, 8, block_size="row")
    assert torch.equal(quantized[0].weight, quant.dequantize(quant.quantize(model[0].weight, 8, block_size=8)))
    assert size == (8 * 16 + 16 * 4) + (16 + 4) * 4


def test_quantize_model_weights_bad_input() -> None:
    with pytest.raises(ValueError, match="nn.Linear"):
        quant.quantize_model_weights(nn.ReLU(), 4)
    with pytest.raises(ValueError, match="bits"):
        quant.quantize_model_weights(_tiny_model(), 12)
    with pytest.raises(TypeError, match="block_size"):
        quant.quantize_model_weights(_tiny_model(), 4, block_size="column")
