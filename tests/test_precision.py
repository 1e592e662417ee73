"""course_utils.precision: formats, tiny updates, loss scaling, timing and the training loop, on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils import digits, hardware, precision, quiet


# ---------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("torch.float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("half", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_resolve_dtype_accepts_names_and_dtypes(name, dtype) -> None:
    assert precision.resolve_dtype(name) == dtype


@pytest.mark.parametrize("bad", ["float64", "int8", "fp8", "", torch.float64, torch.int8])
def test_resolve_dtype_rejects_unknown_formats(bad) -> None:
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
        precision.resolve_dtype(bad)


@pytest.mark.parametrize("bad", [16, None, 1.5, [torch.float16]])
def test_resolve_dtype_rejects_wrong_types(bad) -> None:
    with pytest.raises(TypeError, match="dtype"):
        precision.resolve_dtype(bad)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_spacing_around_one_is_half_eps_below_and_eps_above(dtype) -> None:
    eps = torch.finfo(precision.resolve_dtype(dtype)).eps
    assert precision.spacing_around(1.0, dtype) == (eps / 2, eps)
    assert precision.spacing_around(1.5, dtype) == (eps, eps)


def test_spacing_and_casts_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="value must be a finite number between -65504 and 65504"):
        precision.spacing_around(70000.0, "float16")
    with pytest.raises(ValueError, match="finite"):
        precision.spacing_around(math.nan, "float32")
    with pytest.raises(TypeError, match="value must be a number"):
        precision.cast_value("1.0", "float32")  # type: ignore[arg-type]


def test_cast_value_shows_float16_range() -> None:
    assert precision.cast_value(70000, "float16") == math.inf
    assert precision.cast_value(65504, "float16") == 65504
    assert precision.cast_value(1e-8, "float16") == 0.0
    assert precision.cast_value(1e-8, "bfloat16") != 0.0
    assert precision.cast_value(70000, "bfloat16") == 70144.0  # kept, with bfloat16's coarse steps


# ---------------------------------------------------------------------------------------- tiny updates
def test_the_lesson_update_vanishes_in_16_bit_and_survives_in_float32() -> None:
    assert precision.apply_update(1.0, 1e-4, "bfloat16") == 1.0
    assert precision.apply_update(1.0, 1e-4, "float16") == 1.0
    assert precision.apply_update(1.0, 1e-4, "float32") == pytest.approx(0.9999, abs=1e-7)
    assert precision.survives(1.0, 1e-3, "float16") and not precision.survives(1.0, 1e-3, "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_smallest_surviving_update_is_the_boundary(dtype) -> None:
    u = precision.smallest_surviving_update(1.0, dtype)
    below = torch.nextafter(torch.tensor(u), torch.tensor(0.0)).item()  # the float32 just below
    assert precision.survives(1.0, u, dtype)
    assert not precision.survives(1.0, below, dtype)
    gap_below, _ = precision.spacing_around(1.0, dtype)
    assert gap_below / 2 <= u < gap_below  # just above half the gap


def test_smallest_surviving_update_in_float32_is_just_above_2_to_minus_25() -> None:
    u = precision.smallest_surviving_update(1.0, "float32")
    assert u == pytest.approx(2.0**-25 * (1 + 2.0**-23), rel=0)


def test_update_report_text_and_bad_input() -> None:
    text = precision.update_report("bf16", 1e-4)
    assert "LOST" in text and "0.999899983" in text and "1.961e-03" in text
    assert "survives" in precision.update_report("fp16", 3e-4)
    with pytest.raises(ValueError, match="update must be a finite number between -65504 and 65504"):
        precision.update_report("float16", 1e5)
    with pytest.raises(ValueError, match="dtype"):
        precision.update_report("fp8", 1e-3)


# ---------------------------------------------------------------------------------------- range, loss scaling
def test_synthetic_gradients_are_reproducible() -> None:
    a, b = precision.synthetic_gradients(1000, seed=3), precision.synthetic_gradients(1000, seed=3)
    assert a.dtype == torch.float32 and torch.equal(a, b) and (a < 0).any() and (a > 0).any()


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"n": 0}, ValueError),
        ({"n": -3}, ValueError),
        ({"n": 2.5}, TypeError),
        ({"log10_std": 0.0}, ValueError),
        ({"log10_mean": 99.0}, ValueError),
        ({"log10_mean": math.inf}, ValueError),
    ],
)
def test_synthetic_gradients_bad_input(kwargs, exc) -> None:
    with pytest.raises(exc):
        precision.synthetic_gradients(**kwargs)


# ---------------------------------------------------------------------------------------- matmul timing
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_time_matmul_small_on_cpu(dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import benchmark

    measured = []

    class RecordingTimer(benchmark.Timer):  # the real Timer, remembering each measurement
        def blocked_autorange(self, **kwargs):
            measured.append(super().blocked_autorange(**kwargs))
            return measured[-1]

    monkeypatch.setattr(benchmark, "Timer", RecordingTimer)
    t = precision.time_matmul(64, dtype, "cpu", min_run_time=0.01)
    assert t.size == 64 and t.dtype == dtype and t.device == "cpu"
    assert t.ms > 0 and t.tflops > 0
    assert t.tflops == pytest.approx(2 * 64**3 / (t.ms / 1e3) / 1e12)
    # the Timer call the notebook shows: "a @ b" on all of torch's threads, blocked_autorange's median
    spec = measured[0].task_spec
    assert (spec.stmt, spec.num_threads) == ("a @ b", torch.get_num_threads())
    assert t.ms == pytest.approx(measured[0].median * 1e3)


@pytest.mark.parametrize(
    "min_run_time, exc", [(0.0, ValueError), (-1.0, ValueError), (11.0, ValueError), ("0.2", TypeError)]
)
def test_time_matmul_min_run_time_is_checked(min_run_time, exc) -> None:
    with pytest.raises(exc, match="min_run_time"):
        precision.time_matmul(8, "float32", "cpu", min_run_time=min_run_time)


def _refusal(dtype: str, device: str, size: int) -> str | None:
    """Why time_matmul and matmul_report would not time ``dtype`` at ``size`` on ``device`` (None: they would)."""
    return precision._timing_case(size, dtype, device)[3] or None


def test_float16_is_timed_on_cpu_only_at_small_sizes() -> None:
    n = precision.CPU_FLOAT16_MAX_SIZE
    assert _refusal("float16", "cpu", n) is None
    assert _refusal("float16", "cpu", n + 1) is not None
    assert _refusal("float16", "cpu", 2048) is not None
    assert _refusal("bfloat16", "cpu", 4096) is None
    assert _refusal("float16", "cuda", 8192) is None
    with pytest.raises(ValueError, match="float16 is timed on a CPU only up to 256x256"):
        precision.time_matmul(512, "float16", "cpu")
    assert "tens to hundreds of times slower" in precision.matmul_report(512, "fp16", "cpu")
    with pytest.raises(ValueError, match="size"):
        precision.matmul_report(0, "float16", "cpu")


def test_all_formats_size_keeps_one_float16_multiply_short_on_a_cpu() -> None:
    assert precision.all_formats_size("cpu") == precision.CPU_FLOAT16_MAX_SIZE == 256
    assert precision.all_formats_size("cuda") == 4096
    for device in ("cpu", "cuda"):
        assert _refusal("float16", device, precision.all_formats_size(device)) is None


def test_time_matmul_leaves_the_global_random_state() -> None:
    state = torch.random.get_rng_state()
    precision.time_matmul(16, "bfloat16", "cpu", min_run_time=0.01)
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(ValueError, match="dtype"):
        precision.time_matmul(4, "int8", "cpu")


@pytest.mark.parametrize(
    "size, exc",
    [(0, ValueError), (-8, ValueError), (16385, ValueError), (64.0, TypeError), (True, TypeError), ("64", TypeError)],
)
def test_matmul_sizes_are_checked(size, exc) -> None:
    with pytest.raises(exc, match="size"):
        precision.time_matmul(size, "float32", "cpu")
    with pytest.raises(exc, match="size"):
        precision.matmul_report(size, "float32", "cpu")


def test_fraction_of_peak_and_report(monkeypatch: pytest.MonkeyPatch) -> None:
    sheet = hardware.DATASHEETS["H100"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fp32 = precision.MatmulTiming(4096, "float32", "cuda", 4.0, 33.5)
    bf16 = precision.MatmulTiming(4096, "bfloat16", "cuda", 0.25, 549.8)
    assert precision.fraction_of_peak(fp32, sheet) == pytest.approx(33.5 / 67.0)
    assert precision.fraction_of_peak(bf16, sheet) == pytest.approx(549.8 / 989.0)
    assert precision.fraction_of_peak(bf16, None) is None
    report = precision.timing_report([fp32, bf16], sheet)
    assert "16.0x faster than float32" in report and "56% of the NVIDIA H100 SXM datasheet peak" in report
    # A T4 has no native bfloat16: its datasheet gives no bfloat16 peak to compare with.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert precision.fraction_of_peak(bf16, hardware.DATASHEETS["T4"]) is None
    cpu = precision.MatmulTiming(2048, "float32", "cpu", 200.0, 0.0859)
    assert precision.fraction_of_peak(cpu, sheet) is None


# ---------------------------------------------------------------------------------------- training
def test_the_classifier_is_the_course_mlp_with_two_hidden_layers() -> None:
    model = digits.make_mlp(**precision.CLASSIFIER)
    sizes = [(m.in_features, m.out_features) for m in model if isinstance(m, torch.nn.Linear)]
    assert sizes == [(64, 128), (128, 128), (128, 10)]


@pytest.fixture(scope="module")
def task() -> digits.DigitsData:
    return digits.load_digits_data()  # the course's split, shared with notebook 01


def test_bf16_loop_learns_with_scaler_off(task) -> None:
    result = precision.train_mixed_precision("bfloat16", device="cpu", steps=60, task=task)
    losses = [log.loss for log in result.history]
    assert result.dtype == "bfloat16" and result.loss_scaling is False
    assert {log.scale for log in result.history} == {1.0} and not any(log.skipped for log in result.history)
    assert sum(losses[-10:]) / 10 < 0.5 * losses[0]
    assert result.test_accuracy > 0.8


def test_float32_loop_is_the_same_loop_with_autocast_off(task) -> None:
    result = precision.train_mixed_precision("float32", device="cpu", steps=60, task=task)
    assert result.dtype == "float32" and result.loss_scaling is False
    assert result.history[-1].loss < result.history[0].loss


def test_float16_loop_skips_an_overflowing_step_and_halves_the_scale(task) -> None:
    result = precision.train_mixed_precision("float16", device="cpu", steps=12, task=task, spike_at=(5,))
    assert result.loss_scaling is True
    scales = [log.scale for log in result.history]
    assert scales[:4] == [65536.0] * 4 and scales[4:] == [32768.0] * 8
    assert [log.step for log in result.history if log.skipped] == [5]
    text = result.log_lines(every=10)
    assert "step   5" in text and "skipped" in text and "loss scale 65,536" in text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "int8"}, "dtype"),
        ({"steps": 0}, "steps"),
        ({"spike_at": (0,)}, "spike_at"),
        ({"spike_at": (99,)}, "spike_at"),
    ],
)
def test_train_mixed_precision_bad_input(task, kwargs, match) -> None:
    kwargs = {"steps": 10, "task": task, **kwargs}
    with pytest.raises(ValueError, match=match):
        precision.train_mixed_precision(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match", [({"steps": 2.0}, "steps"), ({"spike_at": (True,)}, "spike_at"), ({"task": "digits"}, "task")]
)
def test_train_mixed_precision_wrong_kinds(task, kwargs, match) -> None:
    kwargs = {"steps": 10, "task": task, **kwargs}
    with pytest.raises(TypeError, match=match):
        precision.train_mixed_precision(**kwargs)


def test_the_default_task_is_the_course_split(task) -> None:
    """Without a task the loop trains on digits.load_digits_data(): the notebook's loop must match it."""
    default = precision.train_mixed_precision("float32", device="cpu", steps=3)
    given = precision.train_mixed_precision("float32", device="cpu", steps=3, task=task)
    assert [log.loss for log in default.history] == [log.loss for log in given.history]
    assert default.test_accuracy == given.test_accuracy


def test_log_lines_bad_every() -> None:
    with pytest.raises(ValueError, match="every"):
        precision.TrainResult("bfloat16", False).log_lines(every=0)


# ---------------------------------------------------------------------------------------- libraries
@pytest.mark.parametrize(
    "capability, expected", [((7, 5), {"fp16": True}), ((8, 0), {"bf16": True}), ((9, 0), {"bf16": True})]
)
def test_training_arguments_follow_the_gpu(monkeypatch: pytest.MonkeyPatch, capability, expected) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.training_arguments_kwargs("cuda") == expected


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit deprecations raised inside transformers
def test_training_arguments_on_cpu_build_without_error(tmp_path) -> None:
    kwargs = precision.training_arguments_kwargs("cpu")
    assert kwargs == {"bf16": True, "use_cpu": True}
    quiet.import_bitsandbytes()  # quiet import first: transformers imports bitsandbytes
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", **kwargs)
    assert args.bf16 and not args.fp16 and args.device.type == "cpu"


def test_library_settings() -> None:
    bf16, fp16 = precision.library_settings("bf16"), precision.library_settings(torch.float16)
    assert bf16["PyTorch Lightning"] == 'Trainer(precision="bf16-mixed")'
    assert fp16["PyTorch Lightning"] == 'Trainer(precision="16-mixed")'
    assert fp16["Hugging Face Accelerate"] == 'Accelerator(mixed_precision="fp16")'
    assert "bf16=True" in bf16["Hugging Face Trainer"]
    with pytest.raises(ValueError, match="float32"):
        precision.library_settings("float32")


def test_mean_loss_and_skipped_steps() -> None:
    result = precision.TrainResult(
        "float16", True, [precision.StepLog(1, 2.0, 65536.0, False), precision.StepLog(2, 1.0, 32768.0, True)], 0.5
    )
    assert result.mean_loss(1) == 1.0 and result.mean_loss(50) == 1.5
    assert result.skipped_steps == [2]
    assert result.log_lines(every=1, losses=False) == (
        "step   1: loss scale 65,536\nstep   2: loss scale 32,768   <- gradients overflowed: step skipped, scale halved"
    )
    with pytest.raises(TypeError, match="losses"):
        result.log_lines(losses="no")


def test_the_default_dtype_on_cpu_is_bfloat16_without_loss_scaling(task) -> None:
    result = precision.train_mixed_precision(device="cpu", steps=2, task=task)
    assert (result.dtype, result.loss_scaling) == ("bfloat16", False)
    assert precision.train_mixed_precision("float16", device="cpu", steps=2, task=task).loss_scaling is True


def test_timing_refusal_says_what_to_do_and_names_no_machine() -> None:
    text = precision.matmul_report(2048, "float16", "cpu")
    assert "2048x2048" in text and "Choose a side of 256 or less, or bfloat16" in text
    assert "Xeon" not in text and "course machine" not in text


def test_cpu_size_within_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "_CPU_TIMING_BUDGET_S", 20)

    def cubic(seconds_at_256: float):
        return lambda n: seconds_at_256 * (n / 256) ** 3

    # 1 ms per 256² predicts 0.5 s per 2048²: 5 runs take 2.6 s, within 20 s
    assert precision._cpu_size_within_budget(2048, cubic(0.001), runs=5) == 2048
    # 32 s per 1024² (bfloat16 on a CPU without 16-bit instructions): 5 x 4 s at 512 fit in 20 s, 1024 does not
    assert precision._cpu_size_within_budget(2048, cubic(0.5), runs=5) == 512
    monkeypatch.setattr(precision, "_CPU_TIMING_BUDGET_S", 10)
    assert precision._cpu_size_within_budget(2048, cubic(0.5), runs=5) == 256
    assert precision._cpu_size_within_budget(128, cubic(10.0), runs=5) == 128  # never grows past the request
    # a pause at the smallest side does not shrink a fast multiply: each side is measured, not extrapolated
    paused = {256: 0.05, 512: 0.002, 1024: 0.015}
    monkeypatch.setattr(precision, "_CPU_TIMING_BUDGET_S", 20)
    assert precision._cpu_size_within_budget(2048, paused.__getitem__, runs=5) == 2048


def test_timing_report_compares_throughput_when_sizes_differ() -> None:
    fp32 = precision.MatmulTiming(2048, "float32", "cpu", 100.0, 0.17)
    bf16 = precision.MatmulTiming(256, "bfloat16", "cpu", 500.0, 0.000067)
    report = precision.timing_report([fp32, bf16])
    assert "x the throughput of float32 (a smaller matrix" in report and "faster" not in report


def test_timing_report_says_slower_when_16_bit_is_slower() -> None:
    fp32 = precision.MatmulTiming(2048, "float32", "cpu", 100.0, 0.17)
    bf16 = precision.MatmulTiming(2048, "bfloat16", "cpu", 400.0, 0.043)
    assert "4.0x slower than float32" in precision.timing_report([fp32, bf16])


# ------------------------------------------------------- the notebook's plain-torch cells and the helpers agree
# Notebook 02 shows plain torch; the helpers behind its widgets, charts and sweeps must compute the same thing.
# These checks live here, not in the notebook.
LESSON_FORMATS = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("fmt", LESSON_FORMATS)
def test_apply_update_is_the_notebooks_plain_subtraction(fmt) -> None:
    for w in (1.0, 0.02, 8.0):
        for update in (1e-2, 1e-3, 1e-4, 1e-6, 1e-8):
            plain = (torch.tensor(w, dtype=fmt) - torch.tensor(update, dtype=fmt)).item()
            assert plain == precision.apply_update(w, update, fmt)


def test_half_eps_is_the_gap_below_one_and_the_smallest_update_is_just_above_half_of_it() -> None:
    for fmt in LESSON_FORMATS:
        gap = torch.finfo(fmt).eps / 2
        assert precision.spacing_around(1.0, fmt)[0] == gap
        # just above: the update is stored in fmt first, and a tie at exactly gap / 2 rounds back to 1.0
        assert gap / 2 < precision.smallest_surviving_update(1.0, fmt) <= gap / 2 * 1.01


def test_cast_value_is_the_notebooks_plain_cast() -> None:
    values = torch.tensor([100_000.0, 65_504.0, 1e-5, 1e-7, 1e-8, 1e-30], dtype=torch.float64)
    for v in values:
        for fmt in LESSON_FORMATS:
            assert v.to(fmt).item() == precision.cast_value(v.item(), fmt)


def test_synthetic_gradients_give_the_notebooks_plain_counts() -> None:
    """The notebook counts, in plain torch, what float16 does to these gradients; its text quotes the numbers."""
    grads = precision.synthetic_gradients(n=100_000, log10_mean=-6.0, log10_std=1.5, seed=0)
    before, after = (grads * 1).to(torch.float16).abs(), (grads * 65_536).to(torch.float16).abs()
    assert (before == 0).float().mean().item() > 0.1  # 15.6 % become zero unscaled
    assert (
        round((after == 0).sum().item() / after.numel(), 5),
        round(after.isinf().sum().item() / after.numel(), 5),
    ) == (0.00004, 0.00006)


@pytest.mark.parametrize("fmt", [torch.bfloat16, torch.float16])
def test_the_notebooks_visible_autocast_block(fmt) -> None:
    model = torch.nn.Linear(512, 512)
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    with torch.autocast(device_type="cpu", dtype=fmt):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    plain = {
        "weights": model.weight.dtype,
        "output": out.dtype,
        "loss": loss.dtype,
        "gradient": model.weight.grad.dtype,
    }
    assert plain == {"weights": torch.float32, "output": fmt, "loss": torch.float32, "gradient": torch.float32}


def test_cpu_autocast_keeps_softmax_and_layer_norm_in_16_bits() -> None:
    """What the notebook says under its rule-2 cell: CPU autocast's float32 list is mainly losses.

    CUDA autocast puts softmax and layer_norm on its float32 list; that branch needs a GPU and is checked by
    scripts/gpu_check.py, not here.
    """
    x = torch.linspace(-1, 1, 32).reshape(4, 8)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, torch.linspace(1, -1, 64).reshape(8, 8))
        assert h.dtype == torch.softmax(h, dim=-1).dtype == torch.nn.functional.layer_norm(h, (8,)).dtype
        assert h.dtype == torch.bfloat16
        loss = torch.nn.functional.cross_entropy(h, torch.tensor([0, 1, 2, 3]))
        assert loss.dtype == torch.nn.functional.mse_loss(h, x).dtype == torch.float32


def test_train_mixed_precision_is_the_notebooks_visible_loop(task) -> None:
    steps, dtype = 40, torch.bfloat16
    model = digits.make_mlp(hidden=128, depth=2, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=(dtype == torch.float16))
    losses = []
    for x, y in task.batches(steps=steps, batch_size=64, seed=0):
        with torch.autocast(device_type="cpu", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    result = precision.train_mixed_precision(dtype, device="cpu", steps=steps, task=task)
    assert [log.loss for log in result.history] == losses
    assert result.test_accuracy == digits.evaluate(model, task).accuracy


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (9, 0)])
def test_the_notebooks_trainingarguments_rule_is_training_arguments_kwargs(
    monkeypatch: pytest.MonkeyPatch, capability
) -> None:
    def notebook_rule(device: torch.device) -> dict[str, bool]:
        kwargs = {"bf16": True} if hardware.autocast_dtype(device) == torch.bfloat16 else {"fp16": True}
        if device.type == "cpu":
            kwargs["use_cpu"] = True
        return kwargs

    assert notebook_rule(torch.device("cpu")) == precision.training_arguments_kwargs("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert notebook_rule(torch.device("cuda")) == precision.training_arguments_kwargs("cuda")
