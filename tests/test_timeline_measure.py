"""A training step's memory over time, measured (course_utils.timeline_measure).

A tiny Llama step is profiled on the CPU in a bounded child process: its kinds, phases and fixed parts are checked
exactly against the model and AdamW; the downsampling keeps the peak and each phase's maximum; the timeline is
compared with the predicted one where :mod:`course_utils.timeline` has it (two more steps, profiled in this process:
LoRA with checkpointing, and QLoRA); the CUDA path's decisions and the allocator history's call order are checked on
simulated GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from course_utils import timeline, timeline_measure
from course_utils.architecture import Architecture
from course_utils.measure import step_spec
from course_utils.quiet import import_bitsandbytes, quiet_libraries
from course_utils.step_memory import estimate_step
from course_utils.timeline import KINDS, PHASES, Timeline, tensor_total
import tiny_models
from gpu_sim import simulate

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Llama-family, tiny, with a vocabulary large enough that the loss path's tensors stand out.
TINY = {**tiny_models.TINY, "vocab_size": 4096}
SHAPE = {"batch": 2, "seq": 64}
#: What a CPU build of torch raises at the first CUDA allocation or CUDA call the simulation does not answer.
CUDA_REFUSED = (AssertionError, RuntimeError, AttributeError)


@pytest.fixture(scope="module")
def full_cpu(tmp_path_factory: pytest.TempPathFactory) -> Timeline:
    """One measured full fine-tuning step of TINY on the CPU, its raw events kept."""
    out = tmp_path_factory.mktemp("timeline")
    return timeline_measure.measure_timeline(TINY, method="full", **SHAPE, device="cpu", out_dir=out)


def warm_step(**step: Any) -> Any:
    """The step of TINY at SHAPE on the CPU (``step``: its other arguments), built here, after its warm-up run."""
    spec = {**step_spec(TINY, **SHAPE, **step), "device": "cpu"}
    with quiet_libraries():
        return timeline_measure._warm_step(spec)


def phase_runs(tl: Timeline) -> list[str]:
    """The phases of ``tl``'s points, each run of equal phases once."""
    runs: list[str] = []
    for point in tl.points:
        if not runs or runs[-1] != point.phase:
            runs.append(point.phase)
    return runs


# ---------------------------------------------------------------- a real CPU step
def test_cpu_timeline_kinds_phases_and_times(full_cpu: Timeline) -> None:
    assert full_cpu.source == "torch.profiler memory timeline, CPU, tensors only"
    assert all(set(p.by_kind) == set(KINDS[1:]) for p in full_cpu.points)  # no framework: tensors only
    assert all(v >= 0 for p in full_cpu.points for v in p.by_kind.values())
    assert phase_runs(full_cpu) == list(PHASES)  # every phase, in order, once (no accumulation)
    times = full_cpu.times_s
    assert times is not None and len(times) == len(full_cpu.points) and times[0] == 0.0
    assert times == sorted(times)
    assert Path(full_cpu.files["profiler memory events"]).is_file()


def test_cpu_timeline_fixed_parts_are_exact(full_cpu: Timeline) -> None:
    params = Architecture.from_config(TINY).params
    tensors = len(list(Architecture.from_config(TINY).param_tensors()))
    first, last = full_cpu.points[0], full_cpu.points[-1]
    # the weights, float32, the tied embedding once; they stay for the whole step
    assert {p.by_kind["weights"] for p in full_cpu.points} == {4 * params}
    # AdamW: two float32 states per trained number and a float32 step count per tensor, from the first point
    assert first.by_kind["optimizer states"] == full_cpu.kind_max("optimizer states") == 8 * params + 4 * tensors
    # before the step nothing else is alive but the batch; after zero_grad no gradient is left
    assert first.by_kind["gradients"] == first.by_kind["activations"] == 0
    assert last.phase == "after zero_grad" and last.by_kind["gradients"] == 0
    assert full_cpu.kind_max("gradients") >= 4 * params  # every weight's gradient exists before the update


def test_cpu_timeline_peak_is_the_loss_path_at_the_start_of_backward(full_cpu: Timeline) -> None:
    est = estimate_step(TINY, method="full", **SHAPE, device="cpu")
    peak = full_cpu.peak
    assert peak.phase == "backward"
    assert est.peak_moment.startswith("start of backward")
    predicted = est.weights_bytes + est.optimizer_bytes + sum(est.moments[est.peak_moment].values())
    assert abs(tensor_total(peak) - predicted) <= 0.05 * predicted


# ---------------------------------------------------------------- keeping the points that matter
def synthetic_events(n: int) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """``n`` allocations of a wavy size, one per microsecond, over the five phases; then the marks."""
    events = [(-1, 1000, "weights")]  # a pre-existing parameter
    for i in range(n):
        events.append((10_000 + 1000 * i, 7 * (i % 13) + (500 if i == n // 3 else 0), "activations"))
        events.append((10_000 + 1000 * i + 500, -7 * (i % 13) - (500 if i == n // 3 else 0), "activations"))
    step = 1000 * n // 4
    marks = [(10_000 - 1, PHASES[0])] + [(10_000 + k * step, PHASES[k]) for k in range(1, 5)]
    return events, marks


def test_downsampling_keeps_the_peak_and_each_phases_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    events, marks = synthetic_events(5000)
    tl = timeline_measure._timeline(events, marks, "CPU")
    few = timeline_measure._timeline(events[:200], marks, "CPU")
    monkeypatch.setattr(timeline_measure, "MAX_POINTS", 10**9)
    every = timeline_measure._timeline(events, marks, "CPU")
    # few events: every point kept (the pre-existing tensors at the start, one per later event, the end mark)
    assert len(few.points) == 1 + 199 + 1
    assert len(every.points) == 1 + 2 * 5000 + 1 and len(tl.points) <= timeline_measure.MAX_POINTS + 12
    assert tl.peak == every.peak and tl.peak.total == 1000 + 7 * ((5000 // 3) % 13) + 500  # the one tall allocation
    assert tl.points[0] == every.points[0] and tl.points[-1] == every.points[-1]
    for phase in PHASES:
        assert max(p.total for p in tl.points if p.phase == phase) == max(
            p.total for p in every.points if p.phase == phase
        )
    assert all(tl.kind_max(kind) == every.kind_max(kind) for kind in KINDS)
    assert phase_runs(tl) == list(PHASES)
    assert tl.times_s == sorted(tl.times_s or [])


# ---------------------------------------------------------------- measured against predicted
#: Full tuning (measured in a child, above); LoRA with checkpointing, for the adapters and the recomputed layer at once;
#: QLoRA, the course's recipe. The last two are profiled in this process: the profiler counts tensors, not processes.
CASES = {
    "full": {"method": "full"},
    "lora, checkpointing": {"method": "lora", "checkpointing": True},
    "qlora (the course's recipe)": {"method": "qlora"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_measured_agrees_with_predicted(case: str, full_cpu: Timeline) -> None:
    kw: dict[str, Any] = {**SHAPE, **CASES[case]}
    if kw["method"] == "qlora" and import_bitsandbytes() is None:
        pytest.skip("QLoRA needs bitsandbytes, which is not installed here")
    measured = full_cpu if case == "full" else timeline_measure._profile_step(warm_step(**CASES[case]), None)
    predicted = timeline.predicted_timeline(estimate_step(TINY, **kw, device="cpu"))
    peak_m, peak_p = tensor_total(measured.peak), tensor_total(max(predicted.points, key=tensor_total))
    assert abs(peak_m - peak_p) <= 0.05 * peak_p, (case, peak_m, peak_p)
    assert measured.peak.phase == max(predicted.points, key=tensor_total).phase == "backward"
    # each kind as the profiler files it (the logits the model returns are activations; a tied embedding's two
    # gradient contributions are autograd's temporaries until their sum becomes .grad): the prediction files alike
    for kind in KINDS[1:]:
        m, p = measured.kind_max(kind), predicted.kind_max(kind)
        assert abs(m - p) <= 0.10 * max(m, p, 1), (case, kind, m, p)
    if kw["method"] == "qlora":  # named: the profiler files a 4-bit layer's weight (its packed numbers, one float32
        # scale per 64 of them, a 16-value code book) as the 4-bit kernel's INPUT, not as a PARAMETER; the estimate
        # counts it as weights. Its weights less the 4-bit ones are what the profiler calls weights.
        arch = Architecture.from_config(TINY)
        nf4 = sum(round(n * (0.5 + 4 / 64)) + 16 * 4 for _, n, linear in arch.param_tensors() if linear)
        assert abs(measured.kind_max("weights") - (predicted.kind_max("weights") - nf4)) <= 1024


# ---------------------------------------------------------------- bad arguments, time limit
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"batch": 0}, "batch"),
        ({"seq": 10**6}, "seq"),
        ({"method": "half"}, "method"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"kbit_preparation": "yes"}, "kbit_preparation"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        timeline_measure.measure_timeline(TINY, **{"device": "cpu", **kwargs})


def test_a_child_past_its_time_limit_is_stopped() -> None:
    with pytest.raises(TimeoutError, match="timeout_s=1"):
        timeline_measure.measure_timeline(TINY, method="full", **SHAPE, device="cpu", timeout_s=1)


@pytest.fixture(scope="module")
def full_step() -> Any:
    """The full-tuning step of TINY at SHAPE, built in this process and warmed up (profiled by the tests below)."""
    return warm_step(method="full")


def test_no_memory_model_is_a_clear_runtime_error(monkeypatch: pytest.MonkeyPatch, full_step: Any) -> None:
    owner = next(c for c in torch.profiler.profile.__mro__ if "_memory_profile" in vars(c))
    monkeypatch.delattr(owner, "_memory_profile")
    with pytest.raises(RuntimeError, match="needs torch's profiler memory model .*AttributeError"):
        timeline_measure._profile_step(full_step, None)


def test_an_export_that_fails_later_is_the_same_clear_error(monkeypatch: pytest.MonkeyPatch, full_step: Any) -> None:
    """Another torch may export, then change the private event tree the phases are read from: the notebook's
    cell must get the one-line RuntimeError it catches (then it draws the prediction alone), not a traceback."""

    def changed(*args: Any, **kwargs: Any) -> None:
        raise AttributeError("'_ProfilerResult' object has no attribute 'experimental_event_tree'")

    monkeypatch.setattr(timeline_measure, "_mark_times", changed)
    with pytest.raises(RuntimeError, match="needs torch's profiler memory model .*AttributeError"):
        timeline_measure._profile_step(full_step, None)


def test_tensors_the_profiler_leaves_unlabelled_are_filed_by_their_lifetime(
    monkeypatch: pytest.MonkeyPatch, full_step: Any
) -> None:
    """A CUDA GPU's profiler files no category for the forward's saved tensors (seen on an H200): with every
    ACTIVATION label removed from a CPU step's memory model, the lifetime rule files the same bytes as activations
    again, and without the rule they would be temporaries. One step is profiled; its memory model is read thrice."""
    from torch.profiler import _memory_profiler as mp

    profiled: dict[str, Any] = {}
    read_events = timeline_measure._raw_events

    def keep_the_profile(prof: Any, dev: Any, marks: Any) -> Any:
        profiled.update(prof=prof, dev=dev, marks=marks)
        return read_events(prof, dev, marks)

    monkeypatch.setattr(timeline_measure, "_raw_events", keep_the_profile)
    labelled = timeline_measure._profile_step(full_step, None)

    def read_again() -> Timeline:
        return timeline_measure._timeline(read_events(**profiled), profiled["marks"], "CPU")

    class Unlabelled:
        def __init__(self, categories: Any) -> None:
            self.inner = categories

        def get(self, key: Any, version: int) -> Any:
            category = self.inner.get(key, version)
            return None if category == mp.Category.ACTIVATION else category

    original = mp.MemoryProfileTimeline.__init__

    def without_activation_labels(self: Any, memory_profile: Any) -> None:
        original(self, memory_profile)
        self.categories = Unlabelled(self.categories)

    monkeypatch.setattr(mp.MemoryProfileTimeline, "__init__", without_activation_labels)
    relabelled = read_again()
    assert labelled.kind_max("activations") > 0
    assert relabelled.kind_max("activations") == pytest.approx(labelled.kind_max("activations"), rel=0.02)
    assert relabelled.kind_max("temporaries") == pytest.approx(labelled.kind_max("temporaries"), rel=0.02)
    monkeypatch.setattr(timeline_measure, "_phase_at", lambda t, marks: "backward")  # the rule switched off
    unruled = read_again()
    assert unruled.kind_max("activations") < 0.05 * labelled.kind_max("activations")
    assert unruled.kind_max("temporaries") > labelled.kind_max("temporaries") + 0.5 * labelled.kind_max("activations")


# ---------------------------------------------------------------- CUDA, simulated
@pytest.mark.parametrize("card", ["T4", "A100"])
def test_a_gpu_step_runs_here_with_an_allocator_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path, card: str) -> None:
    simulate(monkeypatch, card)
    seen: dict[str, Any] = {}

    def in_process(spec: dict[str, Any], timeout_s: float, out_dir: Path) -> str:
        seen.update(spec=spec, timeout_s=timeout_s, out_dir=out_dir)
        return "here"

    monkeypatch.setattr(timeline_measure, "_cuda_timeline", in_process)
    monkeypatch.setattr(timeline_measure, "_child_timeline", lambda *a: pytest.fail("a GPU step ran in a child"))
    assert timeline_measure.measure_timeline(TINY, method="lora", timeout_s=30, out_dir=tmp_path) == "here"
    assert seen["spec"]["device"] == "cuda" and seen["spec"]["autocast"] is None and seen["out_dir"] == tmp_path
    assert seen["timeout_s"] == 30
    seen.clear()
    timeline_measure.measure_timeline(TINY, method="lora")  # no out_dir: a new temporary folder for the snapshot
    assert seen["out_dir"].is_dir() and seen["out_dir"] != tmp_path


def test_a_cpu_only_machine_measures_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "CPU")
    monkeypatch.setattr(timeline_measure, "_child_timeline", lambda spec, timeout_s, out_dir: spec["device"])
    monkeypatch.setattr(timeline_measure, "_cuda_timeline", lambda *a: pytest.fail("a CPU step ran in this process"))
    assert timeline_measure.measure_timeline(TINY) == "cpu"


def test_the_gpu_path_stops_at_the_first_cuda_allocation(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    simulate(monkeypatch, "T4")
    monkeypatch.setattr(timeline_measure, "_child_timeline", lambda *a: pytest.fail("a GPU step ran in a child"))
    with pytest.raises(CUDA_REFUSED):
        timeline_measure.measure_timeline(TINY, method="full", **SHAPE, out_dir=tmp_path)


def test_allocator_history_call_order(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(("record", kw)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: calls.append(("dump", path)))
    path = tmp_path / timeline_measure.SNAPSHOT_NAME
    with timeline_measure._allocator_history(path):
        calls.append("step")
    assert calls == [("record", {"max_entries": 100_000}), "step", ("dump", str(path)), ("record", {"enabled": None})]
    calls.clear()
    with pytest.raises(torch.cuda.OutOfMemoryError), timeline_measure._allocator_history(path):
        raise torch.cuda.OutOfMemoryError("simulated")
    assert calls == [("record", {"max_entries": 100_000}), ("record", {"enabled": None})]  # stopped, nothing saved


def test_profiler_device_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, "L4")
    assert timeline_measure._profiler_device(torch.device("cuda")) == "cuda:0"
    assert timeline_measure._profiler_device(torch.device("cuda", 1)) == "cuda:1"
    assert timeline_measure._profiler_device(torch.device("cpu")) == "cpu"
