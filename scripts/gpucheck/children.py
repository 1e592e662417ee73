"""Children and the watchdog: the /proc process tree, ending every child the run started (the torch.compile child
and its compilers, the DDP ranks and their fork server), and the watchdog that stops the run at its budget."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from .report import close_results, write_outputs
from .runner import Clock
from .settings import EXIT_FAILED


def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state letter) of every process in ``proc`` (empty without /proc)."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return table
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) >= 3:
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]]) -> list[int]:
    """Every process below ``root`` in ``table``: its children, theirs, and so on (breadth first)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = sorted(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if pid in found or pid == root:
            continue
        found.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return found


def is_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, waiting for its parent to read its status, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""
    if stat:
        return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pids: Sequence[int], groups: Sequence[int], sig: int) -> None:
    """Send ``sig`` to each process group in ``groups`` and to each process in ``pids``, whatever has gone."""
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def resource_tracker_pids() -> set[int]:
    """multiprocessing's resource tracker, if this process started one: it ends by itself with this process,
    holds no GPU memory, and must outlive the objects it tracks (killed, it is relaunched with a warning)."""
    tracker = getattr(sys.modules.get("multiprocessing.resource_tracker"), "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


def end_children(grace_s: float = 3.0, root: int | None = None, spare: Sequence[int] | None = None) -> list[int]:
    """End every process started below ``root`` (default: this one), and the whole process group of each that
    leads its own (course_utils.measure starts the torch.compile child with start_new_session=True, so the
    compilers it starts go with it, even once orphaned; the DDP ranks are children of multiprocessing's fork
    server). SIGTERM first, SIGKILL to what still runs after ``grace_s``; returns the pids ended. ``spare``:
    pids left alone (default: multiprocessing's resource tracker)."""
    if not isinstance(grace_s, (int, float)) or isinstance(grace_s, bool) or grace_s < 0:
        raise ValueError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
    if os.name != "posix":
        return []
    root = os.getpid() if root is None else int(root)
    keep = resource_tracker_pids() if spare is None else {int(p) for p in spare}
    table = process_table()
    pids = [p for p in descendants(root, table) if p not in keep]
    if not pids:
        return []
    try:
        own_group = os.getpgid(root)
    except ProcessLookupError:
        own_group = -1
    groups = sorted({table[p][1] for p in pids if table[p][1] == p and p != own_group})
    _signal_all(pids, groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if is_alive(p)]
    if left or groups:
        _signal_all(left, groups, signal.SIGKILL)  # the groups too: members that left the tree (orphans)
    return pids


class Watchdog:
    """Stops the whole run when the budget is spent: ends the child processes, writes what was found so far,
    and exits with status 1."""

    def __init__(self, results: dict[str, Any], out_dir: Path, clock: Clock) -> None:
        self.results = results
        self.out_dir = out_dir
        self.clock = clock
        self.lock = threading.Lock()
        self.done = False
        self.timer = threading.Timer(max(1.0, clock.budget_s - clock.elapsed()), self.fire)
        self.timer.daemon = True

    def start(self) -> None:
        """Arm the timer."""
        self.timer.start()

    def finish(self) -> bool:
        """Called by the main thread when it is done: False if the watchdog already fired."""
        self.timer.cancel()
        with self.lock:
            if self.done:
                return False
            self.done = True
            return True

    def fire(self) -> None:
        """The budget is spent: mark what ran and what never started, end the children, write, exit 1."""
        with self.lock:
            if self.done:
                return
            self.done = True
            self.mark_unfinished()
            self.results["stopped_by_watchdog"] = True
            try:
                with contextlib.suppress(Exception):
                    self.results["ended_children"] = end_children(grace_s=1.0)
                close_results(self.results, self.clock.elapsed())
                _, md_path, markdown = write_outputs(self.results, self.out_dir)
                where = f"\nResults: {md_path} and {md_path.with_suffix('.json')}\n"
                sys.stdout.write(markdown + where + self.results["summary"]["line"] + "\n")
                sys.stdout.flush()
            finally:
                os._exit(EXIT_FAILED)

    def mark_unfinished(self) -> None:
        """The section still running failed (stopped); those never started are skipped, with the reason."""
        for rec in self.results["sections"]:
            if rec["status"] == "running":
                rec.update(
                    status="failed",
                    reason=f"still running when the {self.clock.budget_s:.0f} s budget ran out: the run was stopped",
                    error={"type": "TimeoutError", "message": "stopped by the watchdog", "traceback": ""},
                )
            elif rec["status"] == "pending":
                rec.update(status="skipped", reason="not started: the time budget ran out")
