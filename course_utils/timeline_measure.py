"""Measure one training step's memory over time, by kind: the :class:`~course_utils.timeline.Timeline` of a real step.

The step is :mod:`course_utils.training_step`'s (the model :func:`~course_utils.step_model.build_model` builds,
run by :class:`~course_utils.training_step._Step`), with the same arguments and checks as
:func:`course_utils.measure.measure_training_step`. One warm-up step runs first, so that the optimizer states exist
(the steady state, as :func:`course_utils.step_memory.estimate_step` assumes); then one step runs under
``torch.profiler`` with ``profile_memory=True``, and the profiler's memory timeline (every tensor allocated and
freed, each filed by the profiler under a category: parameter, optimizer state, gradient, activation, temporary,
input, autograd detail or unknown) becomes the bytes alive at each moment, by kind (:data:`CATEGORY_KINDS`; every
category it does not name is a temporary). On a
CUDA GPU the profiler files no category for the forward's saved tensors; they are filed by their lifetime instead
(:func:`_raw_events`).
The step's phases are marked with ``torch.profiler.record_function`` events (:data:`MARKS`), read back on the
profiler's own clock, so each point gets the phase it happened in.

On a CPU the step runs in a fresh child process bounded by ``timeout_s`` (:func:`course_utils.children.call`), as
:mod:`course_utils.measure` runs its CPU steps. On a CUDA GPU it
runs in this process, bounded between micro-batches, and the allocator's own history is recorded around the
profiled step too: ``step_snapshot.pickle``, listed in ``Timeline.files``. Open it at https://pytorch.org/memory_viz
(drag the file in; the page runs in the browser, so the file stays local) to see every allocation with the Python
stack that made it.

What the numbers are: tensor bytes only, as the profiler counts them (a CPU process's baseline, allocator caches and
kernel code are not tensors, so a measured timeline has no "framework" kind).
"""

import bisect
import gzip
import json
import math
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from course_utils import checks, children
from course_utils.architecture import Config
from course_utils.measure import _place_on_device, step_spec
from course_utils.quiet import quiet_libraries
from course_utils.step_model import build_model
from course_utils.timeline import KINDS, PHASES, Timeline, TimelinePoint
from course_utils.training_step import _Step, _warm_up_cuda
from course_utils.units import format_seconds

#: The profiler's categories (``torch.profiler._memory_profiler.Category`` names) as our kinds; the others
#: (TEMPORARY, AUTOGRAD_DETAIL, INPUT, and tensors without a category) are temporaries.
#: Checked against :mod:`course_utils.step_memory` (tiny Llama, and SmolLM2 8 x 64, float32): at the peak (start of
#: backward) ACTIVATION is the estimate's "activations saved for backward" and AUTOGRAD_DETAIL its two float32
#: loss-path buffers, within 0.3 %. Two names differ: ACTIVATION is every forward tensor that flows from the input,
#: so at the end of forward it also holds the logits the model returns (alive, not saved); and a tied embedding's
#: two gradient contributions are AUTOGRAD_DETAIL until autograd adds them into ``.grad``.
CATEGORY_KINDS: dict[str, str] = {
    "PARAMETER": "weights",
    "OPTIMIZER_STATE": "optimizer states",
    "GRADIENT": "gradients",
    "ACTIVATION": "activations",
}
#: The ``record_function`` name that marks the start of each phase (an empty range: its start is the boundary).
MARKS = {phase: f"course_utils phase: {phase}" for phase in PHASES}
#: The most points a measured timeline keeps (the peak, each phase's and each kind's maximum always among them).
MAX_POINTS = 300
#: The allocator history's file name (CUDA), in ``out_dir``.
SNAPSHOT_NAME = "step_snapshot.pickle"
#: The profiler's raw memory events, in ``out_dir`` when one is given.
RAW_NAME = "step_memory_timeline.raw.json.gz"
#: What :func:`measure_timeline` raises where the installed torch cannot export a memory timeline.
NO_EXPORT = "the measured timeline needs torch's profiler memory model (torch {})"


def measure_timeline(
    config: Config, *, device: Any = None, timeout_s: float = 120.0, out_dir: str | Path | None = None, **step: Any
) -> Timeline:
    """One training step's tensor memory over time, by kind and phase, measured with ``torch.profiler``.

    ``step``: the step's keyword arguments, those of :func:`course_utils.measure.measure_training_step` (checked the
    same way: ValueError naming the argument; one step is profiled, whatever ``steps`` says). A warm-up step runs
    first, then the profiled one. CPU: in a fresh child process, stopped after ``timeout_s`` seconds (TimeoutError).
    CUDA: in this process, ``timeout_s`` checked between micro-batches, with the allocator's history saved as
    ``out_dir/step_snapshot.pickle`` (``out_dir`` None: a new temporary folder); open that file at
    https://pytorch.org/memory_viz (drag the file in; the page runs in the browser, so the file stays local).
    ``out_dir`` also receives the profiler's raw memory events. RuntimeError (naming :data:`NO_EXPORT`) where the
    installed torch has no memory timeline export.
    """
    spec = step_spec(config, **step)
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    in_child = _place_on_device(spec, device)
    if torch.device(spec["device"]).type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a CPU or a CUDA GPU; got {spec['device']!r}")
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    if in_child:
        return _child_timeline(spec, timeout_s, out_dir)
    return _cuda_timeline(spec, timeout_s, Path(out_dir or tempfile.mkdtemp(prefix="step_timeline_")))


# --------------------------------------------------------------------------------------------
# Where the step runs
# --------------------------------------------------------------------------------------------
def _child_timeline(spec: dict[str, Any], timeout_s: float, out_dir: str | Path | None) -> Timeline:
    """The timeline of a step run in a bounded child process (:func:`_run_in_child`)."""
    request = {**spec, "out_dir": None if out_dir is None else str(out_dir)}
    data = children.call("course_utils.timeline_measure:_run_in_child", request, timeout_s)
    return Timeline(**{**data, "points": [TimelinePoint(**point) for point in data["points"]]})


def _run_in_child(spec: Mapping[str, Any]) -> dict[str, Any]:
    """In the child process: build the model, warm up, profile one step (its raw events saved in the spec's
    ``out_dir``, where one is given); the timeline as a plain-JSON dict."""
    with quiet_libraries():
        return asdict(_profile_step(_warm_step(spec), Path(spec["out_dir"]) if spec["out_dir"] else None))


def _cuda_timeline(spec: dict[str, Any], timeout_s: float, out_dir: Path) -> Timeline:
    """The timeline of a step on a CUDA GPU, in this process, with the allocator's history around it."""
    snapshot = out_dir / SNAPSHOT_NAME
    with quiet_libraries():
        _warm_up_cuda(spec["device"])
        step = _warm_step({**spec, "timeout_s": timeout_s})
        timeline = _profile_step(step, out_dir, history=_allocator_history(snapshot))
    timeline.files["allocator snapshot"] = str(snapshot)
    return timeline


def _warm_step(spec: Mapping[str, Any]) -> _Step:
    """The step ``spec`` describes, on its device, after one warm-up run: the optimizer states exist, as in the
    steady state (``timeout_s`` in the spec, where given, bounds both runs)."""
    dev = torch.device(spec["device"])
    step = _Step(spec, build_model(spec, dev), dev)
    step.run(count=False)
    return step


@contextmanager
def _allocator_history(path: Path) -> Iterator[None]:
    """Record the CUDA allocator's history meanwhile, then save it to ``path`` (recording stops in any case)."""
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


# --------------------------------------------------------------------------------------------
# The profiled step
# --------------------------------------------------------------------------------------------
def _mark(phase: str) -> None:
    """An empty ``record_function`` range whose start marks where ``phase`` begins."""
    with torch.profiler.record_function(MARKS[phase]):
        pass


def _profiler_device(dev: torch.device) -> str:
    """The device string the memory export filters on: ``"cpu"`` or ``"cuda:N"``."""
    if dev.type != "cuda":
        return "cpu"
    return f"cuda:{torch.cuda.current_device() if dev.index is None else dev.index}"


def _profile_step(step: _Step, out_dir: Path | None, history: Any = None) -> Timeline:
    """Run ``step`` once under the profiler (and ``history``, a context); its memory timeline, from the profiler's
    memory events, which are also saved in ``out_dir`` (None: not saved)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.dev.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        _mark("before the step")  # then the model's forward (its hooks), backward (from the forward's end), the update
        with (
            step.model.register_forward_pre_hook(lambda *_: _mark("forward")),
            step.model.register_forward_hook(lambda *_: _mark("backward")),
            step.optimizer.register_step_pre_hook(lambda *_: _mark("optimizer step")),
            history or nullcontext(),
        ):
            step.run(count=False)
        _mark("after zero_grad")
    try:  # the profiler's private memory model and event tree: any failure means no timeline from this torch
        marks = _mark_times(prof.profiler.kineto_results.experimental_event_tree())
        device = _profiler_device(step.dev)
        where = f"{device} ({torch.cuda.get_device_name(step.dev)})" if step.dev.type == "cuda" else "CPU"
        events = _raw_events(prof, torch.device(device), marks)
        timeline = _timeline(events, marks, where)
    except Exception as err:  # noqa: BLE001 - said in one line by the caller, never a traceback in a notebook
        raise RuntimeError(NO_EXPORT.format(torch.__version__) + f": {type(err).__name__}: {err}"[:300]) from None
    if out_dir is not None:
        raw = out_dir / RAW_NAME
        with gzip.open(raw, "wt") as f:
            json.dump(events, f)
        timeline.files["profiler memory events"] = str(raw)
    return timeline


def _raw_events(prof: Any, dev: torch.device, marks: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """The step's memory events on ``dev``: ``(time ns, bytes allocated (or freed, negative), kind)``, each tensor's
    kind from the profiler's category (:data:`CATEGORY_KINDS`), with one correction. On a CUDA GPU the profiler
    leaves the forward's saved tensors without a category (torch 2.11 on an H200: docs/gpu/h200.md), where on a CPU
    it files them as activations. So a tensor with no category that is created during a forward and is still alive
    when the next backward starts is an activation here, on every device."""
    from torch.profiler import _memory_profiler as mp

    memory = mp.MemoryProfileTimeline(prof._memory_profile())
    created: dict[Any, int] = {}
    destroyed: dict[Any, int] = {}
    for t, action, (key, _version), _nbytes in memory.timeline:
        if action == mp.Action.CREATE:
            created.setdefault(key, t)
        elif action == mp.Action.DESTROY:
            destroyed[key] = t
    backward_starts = [t for t, phase in marks if phase == "backward"]
    saved = {
        key
        for key, t in created.items()
        if _phase_at(t, marks) == "forward" and any(t < b <= destroyed.get(key, math.inf) for b in backward_starts)
    }

    def kind(key: Any, version: int) -> str:
        category = memory.categories.get(key, version) if isinstance(key, mp.TensorKey) else None
        if category is None and isinstance(key, mp.TensorKey) and key in saved:
            return "activations"
        return CATEGORY_KINDS.get(getattr(category, "name", None), "temporaries")

    events = []
    for t, action, (key, version), nbytes in memory.timeline:
        if key.device != dev:
            continue
        if action == mp.Action.INCREMENT_VERSION:  # the old version's bytes go, the new version's come
            events.append((t, -nbytes, kind(key, version)))
            version += 1
        events.append((t, -nbytes if action == mp.Action.DESTROY else nbytes, kind(key, version)))
    return events


def _mark_times(roots: Sequence[Any]) -> list[tuple[int, str]]:
    """``(start ns, phase)`` of every phase mark in the profiler's event tree, in time order (the clock of the
    memory events: both come from the same profiler result)."""
    names = {name: phase for phase, name in MARKS.items()}
    found, todo = [], list(roots)
    while todo:
        event = todo.pop()
        if event.name in names:
            found.append((event.start_time_ns, names[event.name]))
        todo.extend(event.children)
    return sorted(found)


# --------------------------------------------------------------------------------------------
# From raw events to a Timeline
# --------------------------------------------------------------------------------------------
def _timeline(events: Sequence[tuple[int, int, str]], marks: list[tuple[int, str]], where: str) -> Timeline:
    """The ``(time ns, bytes, kind)`` events of a step as a :class:`Timeline` of the bytes alive, downsampled."""
    start, end = marks[0][0], marks[-1][0]
    alive = dict.fromkeys(KINDS[1:], 0)
    at = {start: dict(alive)}  # the bytes alive after the last event of each moment (the events are in time order)
    for t, nbytes, kind in events:
        alive[kind] += nbytes
        at[max(t, start)] = dict(alive)  # pre-existing tensors (time -1) belong to the step's start
    if end > max(at):
        at[end] = dict(alive)
    times, states = list(at), list(at.values())
    phases = [_phase_at(t, marks) for t in times]
    keep = _keep(times, states, phases, MAX_POINTS)
    seconds = [(times[i] - start) / 1e9 for i in keep]
    points = [TimelinePoint(f"{phases[i]}, {format_seconds(s)}", phases[i], states[i]) for i, s in zip(keep, seconds)]
    return Timeline(points=points, source=f"torch.profiler memory timeline, {where}, tensors only", times_s=seconds)


def _phase_at(t: int, marks: list[tuple[int, str]]) -> str:
    """The phase whose mark is the last one at or before ``t``."""
    before = bisect.bisect_right([when for when, _ in marks], t)
    return marks[before - 1][1] if before else PHASES[0]


def _keep(times: list[int], states: list[dict[str, int]], phases: list[str], limit: int) -> list[int]:
    """Indices of at most about ``limit`` points: the first and last, the peak, each phase's and each kind's
    maximum, each phase's first point, and the highest and lowest point of each slice of time."""
    n = len(times)
    if n <= limit:
        return list(range(n))
    totals = [sum(s.values()) for s in states]
    keep = {0, n - 1, max(range(n), key=totals.__getitem__)}
    for phase in set(phases):
        inside = [i for i in range(n) if phases[i] == phase]
        keep.update((inside[0], max(inside, key=totals.__getitem__)))
    keep.update(max(range(n), key=lambda i, k=kind: states[i][k]) for kind in KINDS[1:])
    buckets = max(1, (limit - len(keep)) // 2)
    span = max(1, times[-1] - times[0])
    slices: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        slices.setdefault(min(buckets - 1, (t - times[0]) * buckets // span), []).append(i)
    for members in slices.values():
        keep.update((max(members, key=totals.__getitem__), min(members, key=totals.__getitem__)))
    return sorted(keep)
