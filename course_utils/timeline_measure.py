"""Measure one training step's memory over time, by kind: the :class:`~course_utils.timeline.Timeline` of a real step.

The step is :mod:`course_utils.training_step`'s (the model :func:`~course_utils.training_step.build_model` builds,
run by :class:`~course_utils.training_step._Step`), with the same arguments and checks as
:func:`course_utils.measure.measure_training_step`. One warm-up step runs first, so that the optimizer states exist
(the steady state, as :func:`course_utils.step_memory.estimate_step` assumes); then one step runs under
``torch.profiler`` with ``profile_memory=True``, and the profiler's memory timeline (every tensor allocated and
freed, each filed by the profiler under a category: parameter, optimizer state, gradient, activation, temporary,
input, autograd detail or unknown) becomes the bytes alive at each moment, by kind (:data:`CATEGORY_KINDS`). On a
CUDA GPU the profiler files no category for the forward's saved tensors; they are filed by their lifetime instead
(:func:`_raw_events`).
The step's phases are marked with ``torch.profiler.record_function`` events (:data:`MARKS`), read back on the
profiler's own clock, so each point gets the phase it happened in.

On a CPU the step runs in a fresh child process bounded by ``timeout_s`` (``python -m
course_utils.timeline_measure --timeline JSON``), as :mod:`course_utils.measure` runs its CPU steps. On a CUDA GPU it
runs in this process, bounded between micro-batches, and the allocator's own history is recorded around the
profiled step too: ``step_snapshot.pickle``, listed in ``Timeline.files``. Open it at https://pytorch.org/memory_viz
(drag the file in; the page runs in the browser, so the file stays local) to see every allocation with the Python
stack that made it.

What the numbers are: tensor bytes only, as the profiler counts them (a CPU process's baseline, allocator caches and
kernel code are not tensors, so a measured timeline has no "framework" kind).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from course_utils import checks
from course_utils.architecture import DEFAULT_TARGETS
from course_utils.measure import _CHILD_ENV, _place_on_device, _run_bounded, step_spec
from course_utils.quiet import quiet_libraries
from course_utils.timeline import KINDS, PHASES, Timeline, TimelinePoint
from course_utils.training_step import _TIMEOUT_MESSAGE, _Deadline, _Step, _warm_up_cuda, build_model
from course_utils.units import format_seconds

#: The profiler's categories (``torch.profiler._memory_profiler.Category`` names; None: untyped) as our kinds.
#: Checked against :mod:`course_utils.step_memory` (tiny Llama, and SmolLM2 8 x 64, float32): at the peak (start of
#: backward) ACTIVATION is the estimate's "activations saved for backward" and AUTOGRAD_DETAIL its two float32
#: loss-path buffers, within 0.3 %. Two names differ: ACTIVATION is every forward tensor that flows from the input,
#: so at the end of forward it also holds the logits the model returns (alive, not saved); and a tied embedding's
#: two gradient contributions are AUTOGRAD_DETAIL until autograd adds them into ``.grad``.
CATEGORY_KINDS: dict[str | None, str] = {
    "PARAMETER": "weights",
    "OPTIMIZER_STATE": "optimizer states",
    "GRADIENT": "gradients",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "AUTOGRAD_DETAIL": "temporaries",
    "INPUT": "temporaries",
    None: "temporaries",
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
    config: str | os.PathLike | Mapping[str, Any],
    *,
    method: str = "full",
    batch: int = 8,
    seq: int = 64,
    lora_rank: int = 8,
    targets: str | Sequence[str] = DEFAULT_TARGETS,
    checkpointing: bool = False,
    optimizer: str = "adamw",
    accumulation: int = 1,
    kbit_preparation: bool = True,
    device: Any = None,
    timeout_s: float = 120.0,
    out_dir: str | os.PathLike | None = None,
) -> Timeline:
    """One training step's tensor memory over time, by kind and phase, measured with ``torch.profiler``.

    The step's arguments are :func:`course_utils.measure.measure_training_step`'s (checked the same way: ValueError
    naming the argument). A warm-up step runs first, then the profiled one. CPU: in a fresh child process, stopped
    after ``timeout_s`` seconds (TimeoutError). CUDA: in this process, ``timeout_s`` checked between micro-batches,
    with the allocator's history saved as ``out_dir/step_snapshot.pickle`` (``out_dir`` None: a new temporary
    folder); open that file at https://pytorch.org/memory_viz (drag the file in; the page runs in the browser, so
    the file stays local). ``out_dir`` also receives the profiler's raw memory events. RuntimeError (starting with
    :data:`NO_EXPORT`) where the installed torch has no memory timeline export.
    """
    args = {name: value for name, value in locals().items() if name not in ("config", "device", "timeout_s", "out_dir")}
    spec = step_spec(config, **args)
    timeout_s = checks.number(timeout_s, "timeout_s", 1, 7200)
    in_child = _place_on_device(spec, device)
    if torch.device(spec["device"]).type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a CPU or a CUDA GPU; got {spec['device']!r}")
    folder = None if out_dir is None else Path(out_dir)
    if in_child:
        return _child_timeline(spec, timeout_s, folder)
    return _cuda_timeline(spec, timeout_s, folder or Path(tempfile.mkdtemp(prefix="step_timeline_")))


# --------------------------------------------------------------------------------------------
# Where the step runs
# --------------------------------------------------------------------------------------------
def _child_timeline(spec: dict[str, Any], timeout_s: float, out_dir: Path | None) -> Timeline:
    """The timeline of a step run in a bounded child process (``--timeline JSON``)."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # this package first
    env = {**os.environ, **_CHILD_ENV, "PYTHONPATH": path}
    request = json.dumps({"spec": spec, "out_dir": None if out_dir is None else str(out_dir)})
    cmd = [sys.executable, "-m", "course_utils.timeline_measure", "--timeline", request]
    try:
        done = _run_bounded(cmd, env, timeout_s)
    except subprocess.TimeoutExpired as err:  # the child and its process group were killed
        raise TimeoutError(_TIMEOUT_MESSAGE.format(timeout_s) + "; the child process was stopped") from err
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the measuring process failed (exit status {done.returncode}):\n{tail}")
    answer = json.loads(lines[-1])
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return _from_dict(answer)


def _cuda_timeline(spec: dict[str, Any], timeout_s: float, out_dir: Path) -> Timeline:
    """The timeline of a step on a CUDA GPU, in this process, with the allocator's history around it."""
    dev = torch.device(spec["device"])
    with quiet_libraries():
        _warm_up_cuda(str(dev))
        step = _Step(spec, build_model(spec, dev), dev, _Deadline(timeout_s, dev))
        step.run(count=False)  # the warm-up step: optimizer states, lazy allocations
        out_dir.mkdir(parents=True, exist_ok=True)
        snapshot = out_dir / SNAPSHOT_NAME
        timeline = _profile_step(step, out_dir, history=_allocator_history(snapshot))
    timeline.files["allocator snapshot"] = str(snapshot)
    return timeline


@contextmanager
def _allocator_history(path: Path) -> Iterator[None]:
    """Record the CUDA allocator's history meanwhile, then save it to ``path`` (recording stops in any case)."""
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        yield
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def _run_in_child(request: Mapping[str, Any]) -> dict[str, Any]:
    """In the child process: build the model, warm up, profile one step; the timeline as a dict (or its error)."""
    spec, out_dir = request["spec"], request["out_dir"]
    dev = torch.device(spec["device"])
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    with quiet_libraries(), tempfile.TemporaryDirectory() as tmp:
        step = _Step(spec, build_model(spec, dev), dev)
        step.run(count=False)
        try:
            timeline = _profile_step(step, Path(out_dir or tmp), history=nullcontext(), keep=out_dir is not None)
        except RuntimeError as err:
            return {"error": str(err)}
    return asdict(timeline)


def _from_dict(data: Mapping[str, Any]) -> Timeline:
    """A :class:`Timeline` from its plain-JSON form (what the child prints)."""
    points = [TimelinePoint(**point) for point in data["points"]]
    return Timeline(points=points, source=data["source"], times_s=data["times_s"], files=dict(data["files"]))


# --------------------------------------------------------------------------------------------
# The profiled step
# --------------------------------------------------------------------------------------------
def _mark(phase: str) -> None:
    """An empty ``record_function`` range whose start marks where ``phase`` begins."""
    with torch.profiler.record_function(MARKS[phase]):
        pass


@contextmanager
def _phase_marks(step: _Step) -> Iterator[None]:
    """Mark the phases of ``step``'s run: the model's forward (its hooks), backward (from the forward's end), the
    optimizer step (its pre-hook); the caller marks the start and the end (after ``zero_grad``)."""
    handles = [
        step.model.register_forward_pre_hook(lambda *_: _mark("forward")),
        step.model.register_forward_hook(lambda *_: _mark("backward")),
        step.optimizer.register_step_pre_hook(lambda *_: _mark("optimizer step")),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _profiler_device(dev: torch.device) -> str:
    """The device string the memory export filters on: ``"cpu"`` or ``"cuda:N"``."""
    if dev.type != "cuda":
        return "cpu"
    return f"cuda:{torch.cuda.current_device() if dev.index is None else dev.index}"


def _profile_step(step: _Step, out_dir: Path, history: Any, keep: bool = True) -> Timeline:
    """Run ``step`` once under the profiler (and ``history``); its memory timeline, from the raw export."""
    from torch.profiler import ProfilerActivity, profile

    if not hasattr(profile, "_memory_profile"):
        raise RuntimeError(NO_EXPORT.format(torch.__version__))
    dev = step.dev
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        _mark("before the step")
        with _phase_marks(step), history:
            step.run(count=False)
        _mark("after zero_grad")
    raw = out_dir / RAW_NAME
    try:  # the profiler's private memory model and event tree: any failure means no timeline from this torch
        marks = _mark_times(prof.profiler.kineto_results.experimental_event_tree())
        events = _raw_events(prof, _profiler_device(dev), marks)
        with gzip.open(raw, "wt") as f:
            json.dump(events, f)
        timeline = _timeline(events, marks, _category_names(), where=_where(dev))
    except Exception as err:  # noqa: BLE001 - said in one line by the caller, never a traceback in a notebook
        raise RuntimeError(NO_EXPORT.format(torch.__version__) + f": {type(err).__name__}: {err}"[:300]) from None
    if not keep:
        raw.unlink()
    timeline.files.update({"profiler memory events": str(raw)} if keep else {})
    return timeline


def _raw_events(prof: Any, device: str, marks: list[tuple[int, str]]) -> list[tuple[int, int, int, int]]:
    """The step's memory events on ``device`` as the profiler's raw export writes them, ``(time ns, action, bytes,
    category index)``, with one correction. On a CUDA GPU the profiler leaves the forward's saved tensors without a
    category (torch 2.11 on an H200: docs/gpu/h200.md), where on a CPU it files them as activations. So a tensor
    with no category that is created during a forward and is still alive when the next backward starts is filed as
    an activation here, on every device; any other tensor keeps the profiler's category."""
    from torch.profiler import _memory_profiler as mp

    memory = mp.MemoryProfileTimeline(prof._memory_profile())
    backward_starts = [t for t, phase in marks if phase == "backward"]
    created: dict[Any, int] = {}
    destroyed: dict[Any, int] = {}
    for t, action, (key, _version), _nbytes in memory.timeline:
        if action == mp.Action.CREATE:
            created.setdefault(key, t)
        elif action == mp.Action.DESTROY:
            destroyed[key] = t

    def saved_for_backward(key: Any) -> bool:
        start, end = created.get(key), destroyed.get(key, math.inf)
        return (
            start is not None
            and _phase_at(start, marks) == "forward"
            and any(start < b <= end for b in backward_starts)
        )

    def index(key: Any, version: int) -> int:
        category = memory.categories.get(key, version) if isinstance(key, mp.TensorKey) else None
        if category is None and isinstance(key, mp.TensorKey) and saved_for_backward(key):
            category = mp.Category.ACTIVATION
        return mp._CATEGORY_TO_INDEX[category]

    events = []
    dev = torch.device(device)
    for t, action, (key, version), nbytes in memory.timeline:
        if key.device != dev:
            continue
        code = mp._ACTION_TO_INDEX[action]
        if action == mp.Action.INCREMENT_VERSION:
            events += [(t, code, -nbytes, index(key, version)), (t, code, nbytes, index(key, version + 1))]
        elif action == mp.Action.DESTROY:
            events.append((t, code, -nbytes, index(key, version)))
        else:
            events.append((t, code, nbytes, index(key, version)))
    return events


def _where(dev: torch.device) -> str:
    """The device in words, for ``Timeline.source``."""
    if dev.type != "cuda":
        return "CPU"
    return f"{_profiler_device(dev)} ({torch.cuda.get_device_name(dev)})"


def _category_names() -> list[str | None]:
    """The raw export's category index -> the category's name (None: unknown), as the installed torch numbers them."""
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX
    except ImportError as err:
        raise RuntimeError(NO_EXPORT.format(torch.__version__) + ": its categories are not where they were") from err
    return [None if c is None else c.name for c in sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.get)]


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
def _timeline(
    events: Sequence[Sequence[int]], marks: list[tuple[int, str]], categories: Sequence[str | None], where: str
) -> Timeline:
    """The raw export's ``(time ns, action, bytes, category index)`` events as a :class:`Timeline`, downsampled."""
    kinds = [CATEGORY_KINDS.get(name, "temporaries") for name in categories]
    start, end = marks[0][0], marks[-1][0]
    alive = dict.fromkeys(KINDS[1:], 0)
    times: list[int] = [start]
    states: list[dict[str, int]] = [dict(alive)]
    for t, _action, nbytes, category in events:
        alive[kinds[category]] += nbytes
        t = max(t, start)  # pre-existing tensors (time -1) belong to the step's start
        if t == times[-1]:
            states[-1] = dict(alive)
        else:
            times.append(t)
            states.append(dict(alive))
    if end > times[-1]:
        times.append(end)
        states.append(dict(alive))
    phases = [_phase_at(t, marks) for t in times]
    keep = _keep(times, states, phases, MAX_POINTS)
    points = [
        TimelinePoint(f"{phases[i]}, {format_seconds((times[i] - start) / 1e9)}", phases[i], states[i]) for i in keep
    ]
    return Timeline(
        points=points,
        source=f"torch.profiler memory timeline, {where}, tensors only",
        times_s=[(times[i] - start) / 1e9 for i in keep],
    )


def _phase_at(t: int, marks: list[tuple[int, str]]) -> str:
    """The phase whose mark is the last one at or before ``t``."""
    phase = PHASES[0]
    for when, name in marks:
        if when > t:
            break
        phase = name
    return phase


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


def main(argv: Sequence[str] | None = None) -> int:
    """The child process of :func:`measure_timeline`: ``python -m course_utils.timeline_measure --timeline JSON``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--timeline":
        sys.stdout.write(json.dumps(_run_in_child(json.loads(args[1]))) + "\n")
        return 0
    print(
        "usage: python -m course_utils.timeline_measure --timeline JSON (the measuring child process)", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
