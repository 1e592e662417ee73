"""Run work in bounded child processes: one call in a fresh Python, or one forked process per case.

A function named ``"module:function"`` takes one plain-JSON payload and returns a plain-JSON answer.
:func:`call` runs it once in a fresh child process; :func:`call_each` runs it on each payload in one child, which
first calls a ``prepare`` function (the imports, paid once) and then forks a process per payload (Linux), each
made to start like a fresh process by :mod:`course_utils.fresh_process`. The child's environment
(:data:`CHILD_ENV`) makes glibc hand freed memory back, so its resident memory tracks its live tensors. A child past
its time limit is killed with every process it started (a compiler, for one).

The child runs ``python -m course_utils.children [--each SECONDS PREPARE] FUNCTION JSON`` and prints one JSON line
per payload: ``{"result": ...}``, or ``{"error": "Type: message"}`` when the function raised.
"""

import importlib
import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable, Sequence

from course_utils import fresh_process

#: Environment of a child process: offline, and glibc serves every allocation above 64 KiB with its own mmap, returned
#: on free, so the resident memory tracks the live bytes. Its warnings would only reach the stderr nobody reads.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
#: The error of a child (or a forked process) past its time limit, formatted with the seconds.
TIMEOUT = "the child process did not finish within timeout_s={:g} s; it was stopped, with the processes it started"


def call(function: str, payload: Any, timeout_s: float) -> Any:
    """``function(payload)`` in a fresh child process, stopped after ``timeout_s`` seconds: its answer.

    TimeoutError past the limit; RuntimeError when the function raised (its error's type and message) or the
    process failed (the end of its stderr).
    """
    answer = json.loads(_run([function, json.dumps(payload)], timeout_s)[-1])
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer["result"]


def call_each(function: str, payloads: Sequence[Any], timeout_s: float, prepare: str) -> list[dict[str, Any]]:
    """``function(payload)`` for each payload, each in a process forked from one child that called ``prepare()``
    first: ``{"result": ...}`` or ``{"error": "Type: message"}`` per payload, in order. ``timeout_s`` bounds each
    payload; the child as a whole gets all of theirs and 120 s for its imports. Linux only (macOS forks badly once
    system frameworks are loaded)."""
    args = ["--each", str(timeout_s), prepare, function, json.dumps(list(payloads))]
    try:
        lines = _run(args, timeout_s * len(payloads) + 120.0)
    except Exception as err:  # noqa: BLE001 - the child failed as a whole: every payload says why
        return [_error(err)] * len(payloads)
    answers = {answer.pop("index"): answer for answer in map(json.loads, lines)}
    missing = {"error": "RuntimeError: the child process gave no answer for this payload"}
    return [answers.get(i, missing) for i in range(len(payloads))]


def _error(err: BaseException) -> dict[str, str]:
    """``err`` as an answer: ``{"error": "TypeName: message"}`` (shortened), no reference to ``err`` kept."""
    return {"error": f"{type(err).__name__}: {err}"[:500]}


def _run(args: list[str], timeout_s: float) -> list[str]:
    """Run ``python -m course_utils.children ARGS`` in a bounded child process; the JSON lines it printed."""
    # this package's folder first on the child's path
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "course_utils.children", *args]
    try:
        done = run_bounded(cmd, {**os.environ, **CHILD_ENV, "PYTHONPATH": path}, timeout_s)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(TIMEOUT.format(timeout_s)) from err
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the child process failed (exit status {done.returncode}):\n{tail}")
    return lines


def run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (torch.compile starts compilers).

    POSIX only, as the course is (Linux and macOS).
    """
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # leaving the with block closes the pipes and reaps the child
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --------------------------------------------------------------------------------------------
# In the child
# --------------------------------------------------------------------------------------------
def _resolve(name: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names."""
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def _answer(function: Callable[[Any], Any], payload: Any) -> dict[str, Any]:
    """``{"result": function(payload)}``, or the error it raised."""
    try:
        return {"result": function(payload)}
    except BaseException as err:  # noqa: BLE001 - any failure is this payload's answer
        return _error(err)


def _fork_each(function: Callable[[Any], Any], payloads: list[Any], timeout_s: float) -> None:
    """Call ``function`` on each payload in a process forked from this one, made to start like a fresh process;
    print one JSON line per payload. A forked process past ``timeout_s`` is stopped by an alarm signal, and this
    process prints the line of a forked process that did not end normally."""
    pages = fresh_process.resident_file_pages()
    for index, payload in enumerate(payloads):
        sys.stdout.flush()  # nothing buffered for the forked process to print again
        pid = os.fork()
        if pid == 0:  # the forked process: one call, its answer, then exit without cleanup
            fresh_process.touch(pages)
            signal.alarm(max(1, round(timeout_s)))
            print(json.dumps({"index": index, **_answer(function, payload)}), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
            ended = f"RuntimeError: the forked process ended with status {status}"
            error = f"TimeoutError: {TIMEOUT.format(timeout_s)}" if killed else ended
            print(json.dumps({"index": index, "error": error}), flush=True)


def main(args: Sequence[str]) -> None:
    """The child process: ``FUNCTION JSON`` (one call), or ``--each SECONDS PREPARE FUNCTION JSON`` (a list)."""
    if args[0] == "--each":
        _, seconds, prepare, function, payloads = args
        _resolve(prepare)()
        _fork_each(_resolve(function), json.loads(payloads), float(seconds))
    else:
        function, payload = args
        print(json.dumps(_answer(_resolve(function), json.loads(payload))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
