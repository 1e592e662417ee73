"""course_utils.digits: a deterministic real network, and the lesson's quality-vs-bits claims in its numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from course_utils import digits, quant

NOTEBOOK_SRC = Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01_quantization.py"


@pytest.fixture(scope="module")
def data() -> digits.DigitsData:
    return digits.load_digits_data()


@pytest.fixture(scope="module")
def model(data: digits.DigitsData) -> torch.nn.Module:
    return digits.train_digits_mlp(data)


@pytest.fixture(scope="module")
def per_tensor(model, data) -> dict[str, digits.FormatResult]:
    return {r.fmt: r for r in digits.quality_by_format(model, data)}


@pytest.fixture(scope="module")
def per_row(model, data) -> dict[str, digits.FormatResult]:
    return {r.fmt: r for r in digits.quality_by_format(model, data, block_size="row")}


def test_data_split(data: digits.DigitsData) -> None:
    assert data.x_train.shape == (1347, 64) and data.x_test.shape == (450, 64)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert float(data.x_train.min()) == 0.0 and float(data.x_train.max()) == 1.0
    assert sorted(data.y_test.unique().tolist()) == list(range(10))
    counts = torch.bincount(data.y_test, minlength=10)
    assert int(counts.min()) >= 43 and int(counts.max()) <= 46  # stratified
    again = digits.load_digits_data()
    assert torch.equal(again.x_test, data.x_test) and torch.equal(again.y_train, data.y_train)


def test_batches_are_fixed_by_the_seed(data: digits.DigitsData) -> None:
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    first = list(data.batches(3, 8, seed=1))
    again = list(data.batches(3, 8, seed=1))
    assert torch.equal(torch.rand(1), expected)  # the global random stream was not consumed
    assert len(first) == 3 and first[0][0].shape == (8, 64) and first[0][1].shape == (8,)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert not torch.equal(first[0][1], next(data.batches(1, 8, seed=2))[1])


@pytest.mark.parametrize(
    "args, err, what",
    [
        ((1, 0), ValueError, "batch_size must be between 1 and 1347"),
        ((0, 8), ValueError, "steps"),
        ((1, 8.0), TypeError, "batch_size"),
        ((True, 8), TypeError, "steps"),
        ((1, 8, -1), ValueError, "seed"),
    ],
)
def test_bad_batches_fail_at_the_call(data: digits.DigitsData, args: tuple, err: type, what: str) -> None:
    with pytest.raises(err, match=what):
        data.batches(*args)  # checked at the call, not at the first next()


def test_make_mlp_sizes_and_activations() -> None:
    def layout(model: torch.nn.Sequential) -> list:
        return [(m.in_features, m.out_features) if isinstance(m, torch.nn.Linear) else type(m).__name__ for m in model]

    assert layout(digits.make_mlp()) == [(64, 64), "ReLU", (64, 10)]
    assert layout(digits.make_mlp(128, depth=2)) == [(64, 128), "ReLU", (128, 128), "ReLU", (128, 10)]
    assert layout(digits.make_mlp(32, in_features=10, out_features=1, activation="gelu")) == [(10, 32), "GELU", (32, 1)]


def test_make_mlp_is_fixed_by_its_seed_and_leaves_the_caller_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a, b = digits.make_mlp(seed=5), digits.make_mlp(seed=5)
    assert torch.equal(torch.rand(1), expected)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    torch.manual_seed(5)  # the same weights as building the layers right after manual_seed(seed)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), plain.parameters()))


@pytest.mark.parametrize(
    "kwargs, err, what",
    [
        ({"hidden": 0}, ValueError, "hidden"),
        ({"depth": 0}, ValueError, "depth"),
        ({"depth": 2.0}, TypeError, "depth"),
        ({"in_features": 0}, ValueError, "in_features"),
        ({"out_features": True}, TypeError, "out_features"),
        ({"activation": "tanh"}, ValueError, "activation must be one of relu, gelu"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_make_mlp_bad_arguments(kwargs: dict, err: type, what: str) -> None:
    with pytest.raises(err, match=what):
        digits.make_mlp(**kwargs)


def test_training_is_deterministic_and_leaves_the_caller_alone(model, data: digits.DigitsData) -> None:
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = digits.train_digits_mlp(data)
    assert torch.equal(torch.rand(3), expected)  # the global random stream was not consumed
    assert torch.get_num_threads() == threads
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), model.state_dict().values()))
    c = digits.train_digits_mlp(data, seed=1)
    assert not torch.equal(a[0].weight, c[0].weight)
    assert a[0].weight.dtype == torch.float32 and not a.training


def test_the_model_is_good(model, data) -> None:
    quality = digits.evaluate(model, data)
    assert quality.accuracy > 0.95 and quality.loss < 0.2
    assert digits.linear_weight_count(model) == 64 * 64 + 64 * 10


def test_16_bit_and_int8_are_close_to_lossless(per_tensor) -> None:
    base = per_tensor["float32"]
    for fmt in ("bfloat16", "float16", "int8"):
        assert abs(per_tensor[fmt].accuracy - base.accuracy) <= 0.005, fmt  # at most 2 of 450 images
        assert per_tensor[fmt].loss == pytest.approx(base.loss, rel=0.03), fmt


def test_int4_loses_a_little(per_tensor) -> None:
    base, int4 = per_tensor["float32"], per_tensor["int4"]
    assert base.accuracy - 0.02 <= int4.accuracy <= base.accuracy
    assert base.loss < int4.loss < 1.2 * base.loss


def test_int3_and_int2_lose_a_lot(per_tensor) -> None:
    base = per_tensor["float32"]
    assert per_tensor["int3"].accuracy < base.accuracy - 0.03
    assert per_tensor["int3"].loss > 1.5 * base.loss
    assert per_tensor["int2"].accuracy < 0.5
    assert per_tensor["int2"].loss > 10 * base.loss


def test_per_row_scales_soften_the_fall(per_tensor, per_row) -> None:
    assert per_row["int3"].accuracy > per_tensor["int3"].accuracy
    assert per_row["int2"].accuracy > per_tensor["int2"].accuracy
    assert per_row["int3"].weight_bytes == per_tensor["int3"].weight_bytes + (64 + 10 - 2) * 4


def test_weight_bytes(per_tensor, per_row) -> None:
    n = 64 * 64 + 64 * 10
    assert per_tensor["float32"].weight_bytes == n * 4
    assert per_tensor["bfloat16"].weight_bytes == per_tensor["float16"].weight_bytes == n * 2
    assert per_tensor["int8"].weight_bytes == n + 2 * 4
    assert per_tensor["int4"].weight_bytes == n // 2 + 2 * 4
    # what the int formats store beyond their codes is one float32 scale per matrix, or per output row
    assert [per_tensor[f].scale_bytes for f in ("float32", "bfloat16", "int8", "int2")] == [0, 0, 2 * 4, 2 * 4]
    assert per_row["int4"].scale_bytes == (64 + 10) * 4 and per_row["int4"].weight_bytes == n // 2 + (64 + 10) * 4


def test_formats_leave_the_model_untouched(model) -> None:
    before = model[0].weight.clone()
    for fmt in digits.FORMATS:
        converted, _ = digits.model_in_format(model, fmt)
        assert converted is not model
    assert torch.equal(model[0].weight, before)
    bf16, _ = digits.model_in_format(model, "bfloat16")
    assert torch.equal(bf16[0].weight, before.to(torch.bfloat16).float())
    int4, _ = digits.model_in_format(model, "int4")
    assert torch.equal(int4[0].weight, quant.dequantize(quant.quantize(before, 4)))


def test_quality_table_text(per_tensor) -> None:
    text = digits.format_quality_table(list(per_tensor.values()))
    lines = text.splitlines()
    assert len(lines) == 8 and lines[0].split()[:2] == ["format", "bits"]
    assert re.search(r"^float32\s+32\s+\d+\.\d%\s+\d\.\d{3}\s+18,944$", lines[1])


def test_notebook_text_quotes_the_measured_numbers(per_tensor, per_row) -> None:
    """The chart's text description in the notebook must carry the numbers this code measures."""
    src = " ".join(line.lstrip("# ").strip() for line in NOTEBOOK_SRC.read_text(encoding="utf-8").splitlines())
    for name, rows in (("one scale per tensor", per_tensor), ("one scale per row", per_row)):
        accs = ", ".join(f"{100 * r.accuracy:.1f}%" for r in list(rows.values())[:-1])
        assert f"{name} {accs} and {100 * rows['int2'].accuracy:.1f}%" in src, name
        losses = ", ".join(f"{r.loss:.3f}" for r in list(rows.values())[:-1])
        assert f"{losses} and {rows['int2'].loss:.3f}" in src, name


@pytest.mark.parametrize(
    "kwargs, err, what", [({"seed": -1}, ValueError, "seed"), ({"data": "digits"}, TypeError, "data")]
)
def test_bad_training_arguments(kwargs: dict, err: type, what: str) -> None:
    with pytest.raises(err, match=what):
        digits.train_digits_mlp(**kwargs)


def test_other_bad_arguments(model, data) -> None:
    with pytest.raises(ValueError, match="fmt"):
        digits.model_in_format(model, "int5")
    with pytest.raises(ValueError, match="fmt"):
        digits.model_in_format(model, 4)
    with pytest.raises(TypeError, match="model"):
        digits.evaluate("model", data)
    with pytest.raises(TypeError, match="data"):
        digits.evaluate(model, None)
    with pytest.raises(TypeError, match="model"):
        digits.model_in_format("model", "bfloat16")
    with pytest.raises(ValueError, match="block_size"):
        digits.model_in_format(model, "int4", block_size=0)
