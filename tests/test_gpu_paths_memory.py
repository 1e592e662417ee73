"""GPU paths of the memory lessons (notebooks 04 and 05), decided on simulated devices.

Every device-branching function of ``course_utils.memory``, ``measure``, ``step_memory`` and ``tricks`` is run
under a T4, an L4, an A100, an H100, a CPU-only machine and an Apple (MPS) machine (see ``gpu_sim.py``), down to
the first CUDA allocation - which this CPU build of torch refuses, so that is where a simulated test stops. The
decisions checked: the 16-bit dtype (float16 with loss scaling on a T4, bfloat16 from compute capability 8.0,
bfloat16 autocast on a CPU), that an estimate is compared with a measurement on the same device, that
``torch.compile`` is bounded in time on a GPU too, and the ``TrainingArguments`` 16-bit flags.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
import torch
from transformers import Trainer, TrainingArguments  # noqa: F401 - imported before any device is simulated: their
# first import probes CUDA in ways the simulation does not answer

from course_utils import children, measure, step_memory, training_step, tricks
from course_utils.measure import StepMeasurement, measure_training_step
from course_utils.training_step import _step_precision
from gpu_sim import Profile
import tiny_models

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {
    **tiny_models.TINY,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}

#: What this CPU build of torch raises (an AssertionError) at the first CUDA allocation or CUDA call the simulation
#: does not answer: where a simulated test stops.
CUDA_REFUSED = "Torch not compiled with CUDA enabled"


class LoadReached(Exception):
    """Raised by a ``from_pretrained`` spy once it has recorded its arguments: the load a real GPU would make."""


def half_for(prof: Profile) -> torch.dtype:
    """The 16-bit dtype the course must choose on ``prof``: float16 below compute capability 8.0."""
    if prof.is_cuda and prof.capability < (8, 0):
        return torch.float16
    return torch.bfloat16


def fake_measurement(device: str, **extra: Any) -> StepMeasurement:
    return StepMeasurement(
        peak_bytes=10**9,
        baseline_bytes=0,
        weights_bytes=1,
        grads_bytes=1,
        optimizer_bytes=8,
        saved_activations_bytes=1,
        step_seconds=0.1,
        device=device,
        what="simulated",
        trained_params=1,
        **extra,
    )


# --------------------------------------------------------------------------------------------
# A. 16-bit dtypes come from course_utils.hardware
# --------------------------------------------------------------------------------------------
def test_frozen_layer_plan_follows_the_device(any_device: Profile) -> None:
    half = half_for(any_device)
    plan = measure._frozen_layer_plan()
    assert [d for _, d, _ in plan] == [torch.float32, half, torch.uint8]
    assert plan[1][0] == str(half).removeprefix("torch.") and plan[2][2] == half  # NF4 computes in it too


def test_time_frozen_layer_stops_at_the_first_cuda_allocation(
    cuda_device: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[Any, Any]] = []
    real_linear = torch.nn.Linear

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append((kwargs.get("dtype"), kwargs.get("device")))
        return real_linear(*args, **kwargs)

    monkeypatch.setattr(torch.nn, "Linear", spy)
    with pytest.raises(AssertionError, match=CUDA_REFUSED):
        measure.time_frozen_layer(32, 48, 16, min_run_time=0.01)
    assert made[0][0] == torch.float32 and torch.device(made[0][1]).type == "cuda"


@pytest.mark.parametrize("method", ["full", "lora", "lora-bf16", "qlora", "full-bf16"])
def test_step_precision(any_device: Profile, method: str) -> None:
    half = str(half_for(any_device)).removeprefix("torch.")
    base = {"lora-bf16": half, "qlora": half, "full-bf16": "bfloat16"}.get(method, "float32")
    # (weights' dtype, autocast dtype, loss scaling)
    assert tuple(_step_precision(method, None, None)) == (base, None, base == "float16")
    assert tuple(_step_precision(method, "auto", None)) == (base, half, half == "float16")
    if any_device.key == "T4":
        assert tuple(_step_precision(method, "auto", "cuda")) == (base, "float16", True)


@pytest.mark.parametrize("method", ["lora-bf16", "qlora"])
def test_build_model_uses_the_devices_16bit_base(
    cuda_device: Profile, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    import transformers

    seen: dict[str, Any] = {}
    real_from_config = transformers.AutoModelForCausalLM.from_config

    def from_config(config: Any, **kwargs: Any) -> Any:
        seen["from_config"] = kwargs["dtype"]
        return real_from_config(config, **kwargs)

    def from_pretrained(path: Any, **kwargs: Any) -> Any:
        seen["dtype"], seen["compute"] = kwargs["dtype"], kwargs["quantization_config"].bnb_4bit_compute_dtype
        seen["device_map"] = kwargs["device_map"]
        raise LoadReached(path)  # where a real load would allocate

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", from_config)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    spec = {"config": TINY, "method": method, "lora_rank": 4, "targets": ["q_proj"], "seed": 0}
    # lora-bf16 builds its base itself and moves it to the GPU; qlora saves it and loads it back in 4 bits
    stops = pytest.raises(LoadReached) if method == "qlora" else pytest.raises(AssertionError, match=CUDA_REFUSED)
    with stops:
        training_step.build_model(spec, torch.device("cuda"))
    half = half_for(cuda_device)
    assert seen["from_config"] == half
    if method == "qlora":
        assert seen["dtype"] == half and seen["compute"] == half and seen["device_map"] == {"": "cuda"}


def test_build_model_full_bf16_is_bfloat16_on_every_gpu(cuda_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure bf16 by its name, a T4 included (float16 without a float32 master copy would lose small updates)."""
    import transformers

    seen: dict[str, Any] = {}
    real_from_config = transformers.AutoModelForCausalLM.from_config

    def from_config(config: Any, **kwargs: Any) -> Any:
        seen["dtype"] = kwargs["dtype"]
        return real_from_config(config, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", from_config)
    spec = {"config": TINY, "method": "full-bf16", "lora_rank": 4, "targets": ["q_proj"], "seed": 0}
    with pytest.raises(AssertionError, match=CUDA_REFUSED):
        training_step.build_model(spec, torch.device("cuda"))
    assert seen["dtype"] == torch.bfloat16


def test_t4_budget_is_what_the_simulated_t4_exposes_minus_the_cuda_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hardware reads total memory (15.83 GB on Colab's T4); the budget is that minus the 0.5 GB context."""
    from gpu_sim import simulate

    from course_utils import datasheets, hardware, memory

    simulate(monkeypatch, "T4")
    total = hardware.gpu_memory_gb()
    assert round(total, 2) == 15.83
    sheet = hardware.current_datasheet()
    assert sheet is not None and sheet.usable_gb == pytest.approx(datasheets.usable_gb(total), abs=1e-3)
    assert memory.gpu_budget("T4").gb == sheet.total_gb and round(sheet.usable_gb, 2) == 15.33
    assert hardware.datasheet_for("Tesla T4").usable_gb == sheet.usable_gb  # the A10G rename keeps the field too


def test_measure_training_step_resolves_auto_autocast(any_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def record(spec: dict, *timeout: float) -> dict:
        seen["spec"], seen["child"] = spec, bool(timeout)
        return fake_measurement(spec["device"]).to_dict()

    monkeypatch.setattr(measure, "run_step", record)
    monkeypatch.setattr(measure, "_run_in_child", record)
    measure_training_step(TINY, autocast="auto")
    half = str(half_for(any_device)).removeprefix("torch.")
    assert seen["spec"]["autocast"] == half
    assert seen["spec"]["device"] == ("cuda" if any_device.is_cuda else "cpu")
    assert seen["child"] == (not any_device.is_cuda)  # CPU: a fresh child process; CUDA: in this process


def test_run_step_stops_at_the_first_cuda_call(cuda_device: Profile) -> None:
    spec = {
        "config": TINY,
        "method": "lora",
        "batch": 1,
        "seq": 8,
        "lora_rank": 4,
        "targets": ["q_proj"],
        "optimizer": "adamw",
        "autocast": "auto",
        "steps": 1,
        "accumulation": 1,
        "device": "cuda",
    }
    with pytest.raises(AssertionError, match=CUDA_REFUSED):
        measure.run_step(spec)


@pytest.mark.parametrize(
    "profile, flags",
    [("T4", {"fp16": True, "bf16": False}), ("L4", {"bf16": True}), ("A100", {"bf16": True}), ("H100", {"bf16": True})],
)
def test_training_arguments_16bit_flags_on_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path, profile: str, flags: dict
) -> None:
    from gpu_sim import simulate

    simulate(monkeypatch, profile)
    kwargs, changes = tricks.training_arguments_plan(tmp_path, max_steps=2)
    assert {k: kwargs.get(k, False) for k in ("fp16", "bf16")} == {"fp16": False, **flags}
    assert "use_cpu" not in kwargs and isinstance(kwargs["warmup_steps"], int)
    assert any("fp16=True" in c for c in changes) == (profile == "T4")


def test_training_arguments_on_a_cpu_keep_bf16(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from gpu_sim import simulate

    simulate(monkeypatch, "CPU")
    kwargs, _ = tricks.training_arguments_plan(tmp_path, max_steps=2)
    assert kwargs["bf16"] is True and "fp16" not in kwargs and kwargs["use_cpu"] is True
    kwargs, _ = tricks.training_arguments_plan(tmp_path, cpu_bf16=False)
    assert kwargs["bf16"] is False


def test_training_arguments_are_built_from_the_plan(
    any_device: Profile, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import transformers

    built: dict[str, Any] = {}

    class Recorder:  # the real class's fields, without its device set-up (the first CUDA call)
        __dataclass_fields__ = TrainingArguments.__dataclass_fields__

        def __init__(self, **kwargs: Any) -> None:
            built.update(kwargs)

    monkeypatch.setattr(transformers, "TrainingArguments", Recorder)
    args, _ = tricks.memory_efficient_training_arguments(tmp_path, max_steps=2)
    assert isinstance(args, Recorder)
    assert bool(built.get("fp16")) == (half_for(any_device) == torch.float16 and any_device.is_cuda)
    assert built.get("use_cpu", False) == (not any_device.is_cuda)


def test_real_training_arguments_on_a_simulated_gpu(cuda_device: Profile, tmp_path) -> None:
    """Built for real, whole (the simulated set_device allocates nothing), with the card's 16-bit flag."""
    args, _ = tricks.memory_efficient_training_arguments(tmp_path, max_steps=2)
    t4 = cuda_device.key == "T4"
    assert (bool(args.fp16), bool(args.bf16), bool(args.use_cpu)) == (t4, not t4, False)


# --------------------------------------------------------------------------------------------
# B. an estimate compared with a measurement is for the measured device
# --------------------------------------------------------------------------------------------
def test_estimate_device_follows_the_measured_device(any_device: Profile) -> None:
    expected = "cuda" if any_device.is_cuda else "cpu"
    assert step_memory.estimate_device_for(None) == expected
    assert step_memory.estimate_device_for("cpu") == "cpu"
    assert step_memory.estimate_step(TINY, batch=1, seq=8, device=torch.device("cpu")).device == "cpu"


def test_measure_tricks_estimates_for_the_measured_device(any_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    def fake(config: Any, cases: list, *, timeout_s: float, device: Any) -> list[StepMeasurement]:
        calls.extend({**case, "device": device} for case in cases)
        return [fake_measurement(str(device)) for _ in cases]

    monkeypatch.setattr(measure, "measure_training_steps", fake)
    base = {"method": "full", "batch": 4, "seq": 16}
    rows = tricks.measure_tricks(TINY, base, ["baseline", "bf16", "accumulation"])
    expected = "cuda" if any_device.is_cuda else "cpu"
    assert len(calls) == 3
    for row, kwargs in zip(rows, calls):
        assert torch.device(kwargs["device"]).type == expected and row.device.startswith(expected)
        assert row.estimate_device == expected
        est = tricks.estimate_step_for(tricks.trick_kwargs(row.key, base), TINY, device=expected)
        assert row.estimate_bytes == est.peak_bytes and est.device == expected
    assert calls[1]["autocast"] == "auto"  # the bf16 trick lets the device decide (float16 on a T4)
    if any_device.is_cuda:  # the allocator counter has no process baseline
        assert rows[0].estimate_bytes < step_memory.estimate_step(TINY, method="full", batch=4, seq=16).peak_bytes


def test_sweep_estimates_for_the_measured_device(any_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake(config: Any, cases: list, *, device: Any, timeout_s: float) -> list[StepMeasurement]:
        seen.append(device)
        return [fake_measurement(str(device)) for _ in cases]

    import importlib.util
    from pathlib import Path

    from course_utils import sweeps

    path = Path(__file__).resolve().parents[1] / "scripts" / "memory_sweep.py"  # the maintainers' sweep
    spec = importlib.util.spec_from_file_location("memory_sweep", path)
    memory_sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memory_sweep)
    monkeypatch.setattr(memory_sweep, "measure_training_steps", fake)
    case = {"method": "lora", "batch": 1, "seq": 8, "checkpointing": False, **memory_sweep.FIXED}
    device = memory_sweep.as_device(None)
    (row,) = memory_sweep.run_cases(TINY, [case], device, 60)
    (compared,) = sweeps.Sweep(TINY, memory_sweep.machine(device), [row]).compare()
    expected = "cuda" if any_device.is_cuda else "cpu"
    est = step_memory.estimate_step(TINY, method="lora", batch=1, seq=8, device=expected)
    assert torch.device(seen[0]).type == expected and compared.estimate_gb == est.peak_gb


def test_cli_measure_compares_like_with_like(any_device: Profile, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from course_utils.cli import main

    seen: list[Any] = []

    @functools.wraps(measure.measure_training_step)  # its signature: the command line checks its options against it
    def fake(config: Any, **kwargs: Any) -> StepMeasurement:
        seen.append(kwargs["device"])
        return fake_measurement("cuda" if torch.device(kwargs["device"]).type == "cuda" else "cpu")

    monkeypatch.setattr(measure, "measure_training_step", fake)
    assert main(["memory", "--config", "smollm2-135m", "--batch", "1", "--seq", "8", "--measure"]) == 0
    expected = "cuda" if any_device.is_cuda else "cpu"
    est = step_memory.estimate_step("smollm2-135m", batch=1, seq=8, device=expected)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert torch.device(seen[0]).type == expected
    assert last == step_memory.comparison_line(est.peak_bytes, 10**9)


# --------------------------------------------------------------------------------------------
# C. torch.compile is bounded in time on a GPU too
# --------------------------------------------------------------------------------------------
def test_compile_runs_in_a_bounded_child_on_every_device(any_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def child(spec: dict, timeout_s: float) -> dict:
        seen.append(spec["compile"])
        return fake_measurement(spec["device"]).to_dict()

    def in_process(spec: dict) -> dict:
        raise AssertionError("torch.compile must not run unbounded in this process")

    monkeypatch.setattr(measure, "_run_in_child", child)
    monkeypatch.setattr(measure, "run_step", in_process)
    assert measure_training_step(TINY, compile=True).what == "simulated"
    assert measure.measure_training_steps(TINY, [{"compile": True}])[0].what == "simulated"
    assert seen == [True, True]


def test_compile_trick_times_out_on_a_gpu(cuda_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def child(spec: dict, timeout_s: float) -> dict:
        seen.update(spec=spec, timeout_s=timeout_s)
        raise TimeoutError(f"the measured step did not finish within timeout_s={timeout_s:g} s")

    def in_process(spec: dict) -> dict:
        raise AssertionError("torch.compile must not run unbounded in this process")

    monkeypatch.setattr(measure, "_run_in_child", child)
    monkeypatch.setattr(measure, "run_step", in_process)
    rows = tricks.measure_tricks(TINY, {"method": "full", "batch": 2, "seq": 8}, ["compile"], compile_timeout_s=7)
    assert seen["timeout_s"] == 7 and seen["spec"]["compile"] is True and seen["spec"]["device"] == "cuda"
    assert rows[0].skipped == "skipped: did not finish within its 7 s budget on this machine"


def test_cuda_child_keeps_the_device(cuda_device: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def bounded(cmd: list, env: dict, timeout_s: float) -> Any:
        import json
        import subprocess

        seen.update(spec=json.loads(cmd[-1]), timeout_s=timeout_s, env=env)
        answer = {"result": fake_measurement("cuda").to_dict()}  # the child's one line
        return subprocess.CompletedProcess(cmd, 0, json.dumps(answer) + "\n", "")

    monkeypatch.setattr(children, "run_bounded", bounded)
    m = measure_training_step(TINY, compile=True, autocast="auto", timeout_s=30)
    assert m.device == "cuda" and seen["timeout_s"] == 30 and seen["spec"]["device"] == "cuda"
    assert seen["spec"]["autocast"] == str(half_for(cuda_device)).removeprefix("torch.")


def test_verdict_names_the_16bit_dtype_that_ran() -> None:
    from course_utils.tricks import TrickResult, verdict

    base = TrickResult("baseline", "baseline", "", peak_bytes=10**9, step_seconds=1.0, device="cuda:0")
    for device, dtype in (("cuda", "float16"), ("cuda", "bfloat16"), ("cpu", "bfloat16")):
        m = fake_measurement(device, autocast=dtype)
        row = TrickResult("bf16", "16-bit", "", peak_bytes=10**9, step_seconds=0.6, device=device, measurement=m)
        text = verdict(row, base)
        assert dtype in text and ("loss scaling" in text) is (dtype == "float16"), text
