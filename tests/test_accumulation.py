"""Tests for course_utils.accumulation, its chart and its widget."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from course_utils import accumulation as acc
from course_utils import hardware
from course_utils.digits import make_mlp


def sweep_mlp(**sizes: int) -> torch.nn.Sequential:
    """The sweep's model (acc.SWEEP_MLP) with smaller ``sizes``, for fast tests."""
    return make_mlp(**{**acc.SWEEP_MLP, **sizes})


def linear_example() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    """The notebook's first check: ``manual_seed(0)``, ``Linear(10, 1)``, ``x, y = randn(64, 10), randn(64, 1)``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    return model, torch.randn(64, 10), torch.randn(64, 1)


def weighted_token_gradients(model, tokens, labels, micro_batch_size: int, normalize: str) -> list[torch.Tensor]:
    """Accumulate each micro-batch's summed token loss times the weight acc.weight_per_item gives its tokens."""
    parts = list(zip(tokens.split(micro_batch_size), labels.split(micro_batch_size)))
    counts = [int((lb != acc.IGNORE_INDEX).sum()) for _, lb in parts]
    model.zero_grad(set_to_none=True)
    for w, (tb, lb) in zip(acc.weight_per_item(counts, normalize), parts):
        (acc.token_loss_sum(model, tb, lb)[0] * w).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


# ---------------------------------------------------------------------------------------------
# Batch arithmetic
# ---------------------------------------------------------------------------------------------
def test_accumulation_steps_for() -> None:
    assert acc.accumulation_steps_for(64, 16) == 4
    assert acc.accumulation_steps_for(64, 64) == 1
    assert acc.accumulation_steps_for(64, 1) == 64
    assert acc.accumulation_steps_for(64, 8, world_size=2) == 4


def test_micro_batch_size_zero_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"micro_batch_size must be between 1 and 64, got 0"):
        acc.accumulation_steps_for(64, 0)


def test_micro_batch_that_does_not_divide_the_batch() -> None:
    with pytest.raises(ValueError, match=r"micro_batch_size must divide the per-process batch \(64\).*24"):
        acc.accumulation_steps_for(64, 24)


def test_micro_batch_larger_than_the_batch() -> None:
    with pytest.raises(ValueError, match="micro_batch_size must be between 1 and 32"):
        acc.accumulation_steps_for(64, 64, world_size=2)


def test_more_processes_than_the_batch_allows() -> None:
    with pytest.raises(ValueError, match=r"world_size must be between 1 and 64, got 128"):
        acc.accumulation_steps_for(64, 1, world_size=128)
    with pytest.raises(ValueError, match="world_size must divide batch_size"):
        acc.accumulation_steps_for(64, 1, world_size=3)


@pytest.mark.parametrize("bad", [16.0, "16", True, None])
def test_non_integer_sizes_are_type_errors(bad) -> None:
    with pytest.raises(TypeError, match="micro_batch_size must be an integer"):
        acc.accumulation_steps_for(64, bad)


def test_the_error_lists_the_sizes_that_divide() -> None:
    with pytest.raises(ValueError, match=r"try one of \[1, 2, 4, 8, 16, 32, 64\]"):
        acc.accumulation_steps_for(64, 24)


def test_weight_per_item() -> None:
    assert acc.weight_per_item([58, 6], "micro_mean") == pytest.approx([1 / 116, 1 / 12])
    assert acc.weight_per_item([58, 6], "total_tokens") == pytest.approx([1 / 64, 1 / 64])
    assert acc.weight_per_item([10, 10, 10, 10, 8], "micro_mean")[-1] == pytest.approx(1 / 40)
    # equal counts: both ways agree, the trap needs unequal micro-batches
    assert acc.weight_per_item([5, 5], "micro_mean") == pytest.approx(acc.weight_per_item([5, 5]))
    with pytest.raises(ValueError, match="normalize must be one of"):
        acc.weight_per_item([1], "mean")


def test_scale_learning_rate() -> None:
    assert acc.scale_learning_rate(1e-3, 16, 64) == pytest.approx(4e-3)
    assert acc.scale_learning_rate(1e-3, 16, 64, rule="sqrt") == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="rule must be one of"):
        acc.scale_learning_rate(1e-3, 16, 64, rule="cubic")
    with pytest.raises(ValueError, match="base_lr must be a finite number > 0"):
        acc.scale_learning_rate(0.0, 16, 64)
    with pytest.raises(ValueError, match="new_batch"):
        acc.scale_learning_rate(1e-3, 16, 0)


# ---------------------------------------------------------------------------------------------
# The equality check
# ---------------------------------------------------------------------------------------------
def test_four_micro_batches_give_the_big_batch_gradient() -> None:
    model, x, y = linear_example()
    big = acc.accumulated_gradients(model, x, y)  # the whole batch at once
    check = acc.compare_gradients(big, acc.accumulated_gradients(model, x, y, 16))
    assert check.same
    assert check.max_difference < 1e-6  # rounding only (around 6e-08; the digits depend on the CPU)
    assert model.weight.grad is None  # helpers leave .grad clean


def test_helpers_equal_the_notebooks_plain_loop() -> None:
    """The notebook writes the check in plain torch; the helpers the sweep and the exercises use must agree.

    Forgetting the division (the classic bug) makes the plain loop's gradient four times too large.
    """
    model, x, y = linear_example()
    loss_fn = torch.nn.MSELoss()
    helper = acc.accumulated_gradients(model, x, y, 16)
    for divide in (True, False):
        model.zero_grad(set_to_none=True)
        for xb, yb in zip(x.chunk(4), y.chunk(4)):
            loss = loss_fn(model(xb), yb)
            (loss / 4 if divide else loss).backward()
        plain = [p.grad.clone() for p in model.parameters()]
        scaled = [g if divide else 4 * g for g in helper]
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(plain, scaled))
        assert acc.compare_gradients(helper, plain).same is divide
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    assert torch.allclose(model.weight.grad, acc.accumulated_gradients(model, x, y)[0], rtol=1e-6, atol=1e-8)


def test_compare_gradients_rejects_mismatches() -> None:
    a = [torch.zeros(3)]
    with pytest.raises(ValueError, match="one gradient per parameter"):
        acc.compare_gradients(a, a + a)
    with pytest.raises(ValueError, match="each of its reference's shape"):
        acc.compare_gradients(a, [torch.zeros(4)])
    assert acc.compare_gradients([torch.ones(2)], [torch.ones(2)]).same


# ---------------------------------------------------------------------------------------------
# Memory and time
# ---------------------------------------------------------------------------------------------
def test_activation_memory_grows_with_the_micro_batch() -> None:
    model = sweep_mlp(hidden=32, depth=2)
    x, y = acc.regression_batch(64)
    m16, what = acc.activation_memory(model, x, y, 16)
    m32, _ = acc.activation_memory(model, x, y, 32)
    assert m16 > 0 and m32 == 2 * m16
    assert "saved_tensors_hooks" in what
    # per example: the input (256) + each layer's Linear output and GELU output (2 x 2 x 32) + output + target
    assert m16 == 16 * 4 * (256 + 2 * 2 * 32 + 1 + 1)


def test_cuda_reading_is_taken_after_forward_before_backward(monkeypatch) -> None:
    """On CUDA the activations are read between forward and backward: no weight-gradient temporaries."""
    events: list[str] = []
    allocated = iter([1_000, 4_000])  # before the measured forward pass, after it (graph alive)
    monkeypatch.setattr(acc, "memory_method", lambda device=None: "cuda")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: (events.append("read"), next(allocated))[1])
    lin = torch.nn.Linear(2, 1)
    lin.register_forward_hook(lambda *_: events.append("forward"))
    for p in lin.parameters():
        p.register_hook(lambda grad: events.append("backward"))
    measured, what = acc.activation_memory(lin, torch.ones(4, 2), torch.ones(4, 1), 2)
    assert measured == 3_000 and what == acc.MEMORY_METHODS["cuda"]
    # a warm-up step first, then the reading around the measured forward pass, and its backward after it
    assert events == [
        "forward",
        "backward",
        "backward",
        "sync",
        "read",
        "forward",
        "sync",
        "read",
        "backward",
        "backward",
    ]
    assert "before backward" in acc.MEMORY_METHODS["cuda"]


def test_proportion_check() -> None:
    def row(size: int, nbytes: int) -> acc.MicroBatchRow:
        return acc.MicroBatchRow(size, 64 // size, True, 0.0, nbytes, 0.01, "test")

    proportional = [row(1, 1_000), row(8, 8_000), row(64, 64_000)]
    check = acc.proportion_check(proportional)
    assert check.holds and check.spread == 0.0
    assert "equal within 25%" in str(check) and str(check).endswith("True")
    # a fixed 1 MB of weight-gradient temporaries in every reading: small micro-batches look far too big
    with_fixed = [row(r.micro_batch_size, r.activation_bytes + 1_000_000) for r in proportional]
    assert not acc.proportion_check(with_fixed).holds
    with pytest.raises(ValueError, match="rows"):
        acc.proportion_check([])


def test_memory_method_by_device() -> None:
    assert acc.memory_method("cpu") == "cpu"
    assert acc.memory_method("cuda:0") == "cuda"
    with pytest.raises(ValueError, match="device"):
        acc.memory_method("gpu")


def test_cpu_threads_restores_the_setting() -> None:
    before = torch.get_num_threads()
    with hardware.cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with hardware.cpu_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"):
        with hardware.cpu_threads(0):
            pass


def test_time_accumulated_batch() -> None:
    model = sweep_mlp(hidden=16, depth=1)
    x, y = acc.regression_batch(8)
    assert acc.time_accumulated_batch(model, x, y, 4) > 0
    assert model[0].weight.grad is None  # .grad left clean


def test_sweep_rows() -> None:
    rows = acc.sweep_micro_batches(sizes=(8, 64), device="cpu")
    assert [(r.micro_batch_size, r.accumulation_steps, r.same_gradient) for r in rows] == [(8, 8, True), (64, 1, True)]
    assert rows[1].activation_bytes == 8 * rows[0].activation_bytes
    assert rows[1].max_difference == 0.0
    table = acc.sweep_table(rows, measured=False)
    assert table.splitlines()[1].split() == ["8", "8", "True"]
    assert acc.sweep_table(rows).splitlines()[0].split()[-1] == "time"
    summary = acc.micro_batch_summary(rows, 8, budget_bytes=rows[0].activation_bytes)
    assert "micro-batch 8 x 8 accumulation steps = batch of 64" in summary
    assert "12% of micro-batch 64's" in summary
    assert summary.endswith("yes")
    with pytest.raises(ValueError, match="micro_batch_size must be one of 8, 64; got 16"):
        acc.micro_batch_summary(rows, 16)


def test_sweep_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        acc.sweep_micro_batches(sizes=(0,))
    with pytest.raises(ValueError, match="micro_batch_size must divide"):
        acc.sweep_micro_batches(sizes=(24,))
    with pytest.raises(ValueError, match=r"len\(sizes\) must be between 1 and 16, got 0"):
        acc.sweep_micro_batches(sizes=())


def test_sweep_model_is_the_course_mlp() -> None:
    model = make_mlp(**acc.SWEEP_MLP)
    sizes = [(m.in_features, m.out_features) for m in model if isinstance(m, torch.nn.Linear)]
    assert sizes == [(256, 512), (512, 512), (512, 512), (512, 1)]
    assert sum(isinstance(m, torch.nn.GELU) for m in model) == 3
    x, y = acc.regression_batch(4)
    assert model(x).shape == y.shape


def test_sizes_in_the_text_use_the_course_units() -> None:
    rows = [
        acc.MicroBatchRow(1, 64, True, 0.0, 13_312, 0.01, "test"),
        acc.MicroBatchRow(64, 1, True, 0.0, 851_968, 0.001, "test"),
    ]
    summary = acc.micro_batch_summary(rows, 1, budget_bytes=2_500_000_000)
    assert "activation memory: 13.3 KB" in summary
    assert "room for 2.50 GB of activations: yes" in summary
    assert "852.0 KB" in acc.sweep_table(rows)
    assert "time for the 64 examples: 10 ms (10.0x micro-batch 64's)" in summary  # units.format_seconds
    assert acc.sweep_table(rows).splitlines()[1].endswith(" 10 ms") and acc.sweep_table(rows).endswith(" 1.0 ms")


# ---------------------------------------------------------------------------------------------
# The padding trap
# ---------------------------------------------------------------------------------------------
def test_padded_batch() -> None:
    tokens, labels = acc.padded_token_batch((3, 1))
    assert tokens.shape == labels.shape == (2, 3)
    assert labels[1].tolist()[1:] == [acc.IGNORE_INDEX] * 2
    assert (labels != acc.IGNORE_INDEX).sum(dim=1).tolist() == [3, 1]
    with pytest.raises(ValueError, match="lengths"):
        acc.padded_token_batch(())


def test_mean_of_micro_batch_means_is_not_the_batch_gradient() -> None:
    tokens, labels = acc.padded_token_batch()
    model = acc.TinyTokenModel()
    big = weighted_token_gradients(model, tokens, labels, 4, "total_tokens")
    naive = weighted_token_gradients(model, tokens, labels, 2, "micro_mean")
    fixed = weighted_token_gradients(model, tokens, labels, 2, "total_tokens")
    assert not acc.compare_gradients(big, naive).same
    assert acc.compare_gradients(big, fixed).same
    # with equal token counts the naive way would be right: the trap is the padding
    even_tokens, even_labels = acc.padded_token_batch((5, 5, 5, 5))
    assert acc.compare_gradients(
        weighted_token_gradients(model, even_tokens, even_labels, 4, "total_tokens"),
        weighted_token_gradients(model, even_tokens, even_labels, 2, "micro_mean"),
    ).same


def test_weight_per_item_matches_the_notebooks_plain_loops() -> None:
    """The notebook's padding cells (plain cross_entropy, mean or sum) weigh tokens as weight_per_item says."""
    tokens, labels = acc.padded_token_batch(lengths=(30, 28, 4, 2))
    model = acc.TinyTokenModel()

    def token_loss(t, lb, reduction):
        logits = model(t)
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), lb.flatten(), ignore_index=-100, reduction=reduction
        )

    def take() -> list[torch.Tensor]:
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads

    model.zero_grad(set_to_none=True)
    token_loss(tokens, labels, "mean").backward()
    big = take()
    for tb, lb in zip(tokens.chunk(2), labels.chunk(2)):
        (token_loss(tb, lb, "mean") / 2).backward()
    naive = take()
    n_tokens = int((labels != -100).sum())
    for tb, lb in zip(tokens.chunk(2), labels.chunk(2)):
        (token_loss(tb, lb, "sum") / n_tokens).backward()
    fixed = take()
    assert acc.IGNORE_INDEX == -100 and n_tokens == 64
    assert [int((lb != -100).sum()) for lb in labels.chunk(2)] == [58, 6]
    assert acc.compare_gradients(weighted_token_gradients(model, tokens, labels, 4, "total_tokens"), big).same
    assert acc.compare_gradients(weighted_token_gradients(model, tokens, labels, 2, "micro_mean"), naive).same
    assert acc.compare_gradients(weighted_token_gradients(model, tokens, labels, 2, "total_tokens"), fixed).same
    # the notebook compares with plain torch.allclose (default tolerances): a margin, not a coin toss
    assert all(torch.allclose(a, b) for a, b in zip(big, fixed))
    assert not any(torch.allclose(a, b, atol=1e-4) for a, b in zip(big, naive))


# ---------------------------------------------------------------------------------------------
# Training loops
# ---------------------------------------------------------------------------------------------
def _loader(batch_size: int) -> torch.utils.data.DataLoader:
    data = acc.regression_dataset(128)
    return torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)
    )


def notebook_loop(model: torch.nn.Module, loader, accumulation_steps: int) -> list[float]:
    """The notebook's accumulation loop (a running sum of the divided losses, one step per group)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.MSELoss()
    losses, update_loss = [], 0.0
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accumulation_steps
        loss.backward()
        update_loss += loss.item()
        if (step + 1) % accumulation_steps == 0:
            opt.step()
            opt.zero_grad()
            losses.append(update_loss)
            update_loss = 0.0
    return losses


def test_accumulation_loop_matches_the_big_batch_loop() -> None:
    model_a, model_b = acc.TinyRegressor().net, acc.TinyRegressor().net
    losses_a = notebook_loop(model_a, _loader(16), accumulation_steps=4)
    losses_b = notebook_loop(model_b, _loader(64), accumulation_steps=1)
    assert len(losses_a) == len(losses_b) == 2
    assert losses_a == pytest.approx(losses_b, rel=1e-5)
    assert acc.same_weights(model_a, model_b)


def test_same_weights() -> None:
    a, b = acc.TinyRegressor(), acc.TinyRegressor()
    assert acc.same_weights(a, b)
    with torch.no_grad():
        b.net[0].weight[0, 0] += 1e-3
    assert not acc.same_weights(a, b)


def test_hugging_face_trainer_accumulates_like_a_big_batch(tmp_path) -> None:
    """DictDataset and TinyRegressor in the notebook's quiet Trainer run: 16 x 4 trains like 64 x 1."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from course_utils.quiet import quiet_libraries

    verbosity = hf_logging.get_verbosity()
    data = acc.DictDataset(acc.regression_dataset(128))
    runs = {}
    with quiet_libraries():
        from transformers import Trainer, TrainingArguments
        from transformers.trainer_callback import PrinterCallback

        for micro, steps in ((16, 4), (64, 1)):
            args = TrainingArguments(
                output_dir=str(tmp_path / f"{micro}"),
                per_device_train_batch_size=micro,
                gradient_accumulation_steps=steps,
                max_steps=2,
                learning_rate=0.01,
                lr_scheduler_type="constant",
                logging_steps=1,
                save_strategy="no",
                report_to="none",
                disable_tqdm=True,
                use_cpu=True,
                seed=0,
            )
            model = acc.TinyRegressor()
            trainer = Trainer(model=model, args=args, train_dataset=data)
            trainer.remove_callback(PrinterCallback)
            trainer.train()
            runs[micro] = (
                [(int(h["step"]), float(h["loss"])) for h in trainer.state.log_history if "loss" in h],
                model,
            )
    (log_a, model_a), (log_b, model_b) = runs[16], runs[64]
    assert [s for s, _ in log_a] == [1, 2]
    assert [round(v, 4) for _, v in log_a] == [round(v, 4) for _, v in log_b]
    assert acc.same_weights(model_a, model_b)
    assert hf_logging.get_verbosity() == verbosity  # quiet inside the run only: the setting is restored


def test_dict_dataset() -> None:
    data = acc.DictDataset(acc.regression_dataset(4))
    assert len(data) == 4 and set(data[0]) == {"x", "labels"}
    out = acc.TinyRegressor()(data[0]["x"][None], data[0]["labels"][None])
    assert set(out) == {"loss", "logits"}
    assert set(acc.TinyRegressor()(data[0]["x"][None])) == {"logits"}


# ---------------------------------------------------------------------------------------------
# Chart and widget
# ---------------------------------------------------------------------------------------------
ROWS = [acc.MicroBatchRow(s, 64 // s, True, 1e-8, 1000 * s, 0.001 * 64 / s, "test") for s in (1, 8, 64)]


def test_plot_is_titled_and_labelled() -> None:
    from course_utils.lessons import gradient_accumulation as plots
    from course_utils.lessons.kit import plt

    fig = plots.plot_micro_batch_sweep(ROWS, highlight=8, budget_bytes=8000)
    for ax in fig.axes:
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)
    with pytest.raises(ValueError, match="micro_batch_size must be one of"):
        plots.plot_micro_batch_sweep(ROWS, highlight=16)
    with pytest.raises(ValueError, match="budget_bytes"):
        plots.plot_micro_batch_sweep(ROWS, budget_bytes=0)
    with pytest.raises(ValueError, match="rows"):
        plots.plot_micro_batch_sweep([])


def test_widget_callback_and_widget(capsys) -> None:
    from course_utils.lessons.kit import plt
    from course_utils.lessons import gradient_accumulation as widgets

    widgets.show_micro_batch(8, ROWS, budget_bytes=8000)
    plt.close("all")
    out = capsys.readouterr().out
    assert "micro-batch 8 x 8 accumulation steps = batch of 64" in out
    assert "activations: yes" in out
    box = widgets.micro_batch_widget(ROWS, budget_bytes=8000, value=8)
    assert box.children[0].children[0].value == 8
    plt.close("all")
    with pytest.raises(ValueError, match="value must be one of"):
        widgets.micro_batch_widget(ROWS, value=16)
