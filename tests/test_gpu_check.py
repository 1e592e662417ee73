"""Tests of scripts/gpu_check.py without a GPU: the no-CUDA exit, and the pure parts (arithmetic, runner, output).

The GPU sections themselves can only run on a real NVIDIA GPU (see the script's docstring); here we check
everything around them: what the script does when there is no GPU, the TFLOP/s and error arithmetic, that
a failing section is recorded and the run goes on, that the time budget skips sections with a reason, and
the markdown and JSON it writes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


gc = _load()


class Sheet:
    """A datasheet entry with the fields the script reads."""

    def __init__(self, fp32: float, tensor16: float) -> None:
        self.fp32_tflops, self.tensor16_tflops = fp32, tensor16


def _ctx(budget_s: float = 480.0, used_s: float = 0.0):
    clock = gc.Clock(budget_s, start=time.monotonic() - used_s)
    return gc.Context(torch=None, clock=clock, out_dir=Path("."), device="cuda")


def _section(func, needs=(), min_s=1.0, cap_s=30.0):
    return gc.Section(9, "demo", "A demo section", func, needs=needs, min_s=min_s, cap_s=cap_s)


# --------------------------------------------------------------------------------------------
# Without a GPU
# --------------------------------------------------------------------------------------------
def test_without_cuda_exits_2_fast_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=15,
                          cwd=REPO)
    assert time.monotonic() - start < 15
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "GPU" in lines[0] and "CUDA" in lines[0] and "nothing was run" in lines[0]


def test_without_cuda_in_process_when_torch_sees_no_gpu(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gc.main(["--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "needs an NVIDIA GPU with CUDA" in captured.err and "is_available() is False" in captured.err
    assert not (tmp_path / "out").exists()  # nothing was run, nothing written


@pytest.mark.parametrize("value, hidden", [("", True), ("-1", True), (" ", True), ("0", False), ("1,0", False),
                                           (None, False)])
def test_gpus_hidden(value, hidden):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert gc.gpus_hidden(env) is hidden


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------
def test_tflops():
    assert gc.tflops(4096, 1e-3) == pytest.approx(2 * 4096**3 / 1e-3 / 1e12)
    assert gc.tflops(4096, 1e-3) == pytest.approx(137.44, abs=0.01)
    with pytest.raises(ValueError, match="seconds"):
        gc.tflops(4096, 0)


def test_peak_tflops_picks_the_datasheet_column():
    sheet = Sheet(fp32=8.1, tensor16=65.0)
    assert gc.peak_tflops("float32", sheet, bf16_native=False) == 8.1
    assert gc.peak_tflops("float16", sheet, bf16_native=False) == 65.0
    assert gc.peak_tflops("bfloat16", sheet, bf16_native=False) is None  # emulated: no peak to compare with
    assert gc.peak_tflops("bfloat16", sheet, bf16_native=True) == 65.0
    assert gc.peak_tflops("float16", None, bf16_native=True) is None  # GPU not in the table


def test_percent_of_peak():
    assert gc.percent_of_peak(32.5, 65.0) == pytest.approx(50.0)
    assert gc.percent_of_peak(70.0, 67.0) == pytest.approx(104.48, abs=0.01)  # above 100 % is reported as is
    assert gc.percent_of_peak(10.0, None) is None
    assert gc.percent_of_peak(10.0, 0.0) is None


def test_percent_of_peak_with_the_course_datasheet():
    from course_utils import hardware

    sheet = hardware.datasheet_for("Tesla T4")
    achieved = gc.tflops(4096, 2 * 4096**3 / 32.5e12)  # a multiply that ran at 32.5 TFLOP/s
    assert gc.percent_of_peak(achieved, gc.peak_tflops("float16", sheet, False)) == pytest.approx(100 * 32.5 / 65)


def test_error_pct():
    assert gc.error_pct(1.1e9, 1.0e9) == pytest.approx(10.0)
    assert gc.error_pct(0.9e9, 1.0e9) == pytest.approx(-10.0)
    assert gc.error_pct(2.0, 2.0) == 0.0
    with pytest.raises(ValueError, match="measured"):
        gc.error_pct(1.0, 0.0)


# --------------------------------------------------------------------------------------------
# The section runner
# --------------------------------------------------------------------------------------------
def test_runner_records_an_exception_and_keeps_partial_results():
    def boom(ctx, out):
        out.data["before"] = 1
        out.table("partial", ["a"], [[1]])
        raise RuntimeError("boom: the kernel failed")

    rec = gc.run_section(_section(boom), _ctx())
    assert rec["status"] == "failed"
    assert rec["error"]["type"] == "RuntimeError"
    assert rec["error"]["message"] == "boom: the kernel failed"
    assert "boom" in rec["error"]["traceback"] and "Traceback" in rec["error"]["traceback"]
    assert rec["reason"].startswith("RuntimeError: boom")
    assert rec["data"] == {"before": 1} and rec["tables"][0]["rows"] == [[1]]
    assert rec["seconds"] >= 0
    assert gc.exit_status([rec]) == 1


def test_runner_goes_on_after_a_failed_section():
    calls = []

    def bad(ctx, out):
        calls.append("bad")
        raise ValueError("no")

    def good(ctx, out):
        calls.append("good")
        out.check("fine", True)

    sections = [gc.Section(1, "bad", "Bad", bad, min_s=0), gc.Section(2, "good", "Good", good, min_s=0)]
    results = {}
    ctx = _ctx()
    ctx.torch = type("NoTorch", (), {"cuda": type("C", (), {"is_available": staticmethod(lambda: False)})})
    gc.run_all(sections, ctx, results)
    assert calls == ["bad", "good"]
    assert [r["status"] for r in results["sections"]] == ["failed", "passed"]
    assert gc.exit_status(results["sections"]) == 1


def test_ctrl_c_stops_the_run_and_keeps_the_records():
    def interrupted(ctx, out):
        raise KeyboardInterrupt

    sections = [gc.Section(1, "first", "First", interrupted, min_s=0),
                gc.Section(2, "second", "Second", lambda c, o: None, min_s=0)]
    ctx = _ctx()
    ctx.torch = type("NoTorch", (), {"cuda": type("C", (), {"is_available": staticmethod(lambda: False)})})
    results = {}
    gc.run_all(sections, ctx, results)
    assert [r["status"] for r in results["sections"]] == ["failed", "skipped"]
    assert "interrupted" in results["sections"][0]["reason"] and "interrupted" in results["sections"][1]["reason"]


def test_runner_failed_check_fails_the_section():
    def checks(ctx, out):
        out.check("ok one", True)
        out.check("bad one", False, "detail")

    rec = gc.run_section(_section(checks), _ctx())
    assert rec["status"] == "failed"
    assert rec["reason"] == "failed checks: bad one"
    assert rec["error"] is None


def test_runner_skip_and_partial_skip():
    def skipper(ctx, out):
        raise gc.Skip("torch.distributed is not available")

    rec = gc.run_section(_section(skipper), _ctx())
    assert rec["status"] == "skipped" and rec["reason"] == "torch.distributed is not available"

    def partial(ctx, out):
        out.check("fine", True)
        out.skip_part("bfloat16 loop not run: emulated here")

    rec = gc.run_section(_section(partial), _ctx())
    assert rec["status"] == "passed"
    assert rec["reason"] == "partly skipped: bfloat16 loop not run: emulated here"
    assert gc.exit_status([rec]) == 0


def test_budget_skip_does_not_start_the_section():
    called = []
    ctx = _ctx(budget_s=100, used_s=95)
    rec = gc.run_section(_section(lambda c, o: called.append(1), min_s=20), ctx)
    assert called == []
    assert rec["status"] == "skipped"
    assert "time budget nearly spent" in rec["reason"] and "20 s" in rec["reason"]
    assert gc.exit_status([rec]) == 0  # skipped for a stated reason


def test_section_deadline_is_the_smaller_of_cap_and_budget():
    seen = {}

    def look(ctx, out):
        seen["left"] = ctx.left()

    gc.run_section(_section(look, cap_s=30), _ctx(budget_s=480))
    assert 25 < seen["left"] <= 30
    gc.run_section(_section(look, cap_s=300), _ctx(budget_s=100, used_s=50))
    assert seen["left"] <= 100 - 50 - gc.RESERVE_S + 0.5


def test_missing_package_skips_with_the_reason():
    called = []
    rec = gc.run_section(_section(lambda c, o: called.append(1), needs=("surely_not_a_package_xyz",)), _ctx())
    assert called == []
    assert rec["status"] == "skipped"
    assert rec["reason"] == "surely_not_a_package_xyz is not installed"


def test_requirement_problem_for_a_broken_package(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg_xyz.py").write_text("raise ImportError('needs a newer torch')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = gc.requirement_problem("broken_pkg_xyz")
    assert "does not import" in reason and "needs a newer torch" in reason
    assert gc.requirement_problem("json") is None


def test_exit_status():
    assert gc.exit_status([{"status": "passed"}, {"status": "skipped", "reason": "no bitsandbytes"}]) == 0
    assert gc.exit_status([{"status": "passed"}, {"status": "failed", "reason": "x"}]) == 1
    assert gc.exit_status([{"status": "skipped", "reason": None}]) == 1  # a skip must say why
    assert gc.exit_status([{"status": "running"}]) == 1


def test_sections_are_in_the_brief_order_and_selectable():
    assert [s.key for s in gc.SECTIONS] == ["environment", "matmul", "mixed_precision", "microbatch_sweep",
                                           "step_memory", "qlora", "ddp", "trainer"]
    assert [s.number for s in gc.SECTIONS] == list(range(1, 9))
    assert [s.key for s in gc.parse_sections("qlora, 1")] == ["environment", "qlora"]
    assert len(gc.parse_sections(None)) == 8
    with pytest.raises(ValueError, match="unknown section"):
        gc.parse_sections("matmul,nope")
    assert sum(s.cap_s for s in gc.SECTIONS) <= gc.DEFAULT_BUDGET_S  # every section keeps its share


def test_parse_args_defaults_and_errors(capsys):
    args = gc.parse_args([])
    assert args.out == "gpu_check_out" and args.budget_s == 480 and len(args.section_list) == 8
    with pytest.raises(SystemExit) as info:
        gc.parse_args(["--sections", "bogus"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        gc.parse_args(["--budget-s", "5"])
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def _fake_results():
    return {
        "started_utc": "2026-11-30 22:00 UTC", "budget_s": 480.0, "elapsed_s": 123.4, "exit_status": 1,
        "machine": {"gpu": "Tesla T4", "capability": "7.5", "memory_gb": 15.83, "torch": "2.13.0", "cuda": "12.8"},
        "sections": [
            {"number": 2, "key": "matmul", "title": "Matmul speed", "status": "passed", "seconds": 3.2,
             "reason": "partly skipped: bfloat16 emulated", "error": None, "checks": [
                 {"check": "float16 is faster than float32", "ok": True, "detail": "8.0x"}],
             "tables": [{"title": "4096x4096 matmul", "columns": ["dtype", "TFLOP/s", "% of peak"],
                         "rows": [["float16", 25.123, 38.65], ["bfloat16", 1.5, None], ["a|b", 0.001234, True]]}],
             "texts": [{"title": "report", "text": "line one\nline two"}], "notes": ["a note"], "data": {}},
            {"number": 6, "key": "qlora", "title": "QLoRA", "status": "failed", "seconds": 1.0,
             "reason": "OutOfMemoryError: CUDA out of memory", "checks": [], "tables": [], "texts": [], "notes": [],
             "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory",
                       "traceback": "Traceback (most recent call last):\n  ...\nOutOfMemoryError: CUDA out of memory"},
             "data": {}},
            {"number": 8, "key": "trainer", "title": "Trainer", "status": "skipped", "seconds": 0.0,
             "reason": "accelerate is not installed", "error": None, "checks": [], "tables": [], "texts": [],
             "notes": [], "data": {}},
        ],
    }


def test_render_markdown():
    md = gc.render_markdown(_fake_results())
    assert md.startswith("# GPU check")
    assert "Tesla T4" in md and "compute capability 7.5" in md
    assert "Result: **FAILED** (1 passed, 1 failed, 1 skipped)" in md and "exit status 1" in md
    assert "| 2 | matmul | passed | 3.20 | partly skipped: bfloat16 emulated |" in md
    assert "## 2. Matmul speed: passed" in md
    assert "| dtype | TFLOP/s | % of peak |" in md
    assert "| float16 | 25.12 | 38.65 |" in md
    assert "| bfloat16 | 1.50 | n/a |" in md  # None is n/a
    assert "| a\\|b | 1.23e-03 | yes |" in md  # pipes escaped, small floats in e-notation, bools as yes/no
    assert "| float16 is faster than float32 | yes | 8.0x |" in md
    assert "```\nline one\nline two\n```" in md
    assert "- a note" in md
    assert "## 6. QLoRA: failed" in md and "Error: `OutOfMemoryError: CUDA out of memory`" in md
    assert "Reason: accelerate is not installed" in md


def test_render_markdown_passed_and_watchdog():
    results = _fake_results()
    results["sections"] = results["sections"][:1]
    results["exit_status"] = 0
    assert "Result: **PASSED**" in gc.render_markdown(results)
    results["stopped_by_watchdog"] = True
    assert "stopped by the watchdog" in gc.render_markdown(results)


@pytest.mark.parametrize("value, text", [(None, "n/a"), (True, "yes"), (0.0, "0"), (1234.5, "1,234"),
                                         (12.345, "12.35"), (0.5, "0.500"), (0.00012, "1.20e-04"),
                                         (float("nan"), "nan"), (123456, "123,456"), (42, "42"),
                                         ("x\ny", "x y")])
def test_format_cell(value, text):
    assert gc.format_cell(value) == text


def test_write_outputs(tmp_path):
    results = _fake_results()
    results["sections"][0]["data"] = {"dtype": object()}  # anything not JSON-able is written as text
    json_path, md_path, markdown = gc.write_outputs(results, tmp_path / "out")
    assert json_path == tmp_path / "out" / "gpu_check.json" and md_path == tmp_path / "out" / "gpu_check.md"
    loaded = json.loads(json_path.read_text())
    assert [s["status"] for s in loaded["sections"]] == ["passed", "failed", "skipped"]
    assert md_path.read_text() == markdown


def test_watchdog_writes_what_it_has_and_exits_1(tmp_path, monkeypatch, capsys):
    results = {"budget_s": 100.0, "machine": {}, "sections": [
        {**gc.new_record(gc.SECTIONS[0]), "status": "passed"},
        {**gc.new_record(gc.SECTIONS[1]), "status": "running"},
        gc.new_record(gc.SECTIONS[2])]}
    clock = gc.Clock(100.0, start=time.monotonic() - 100)
    dog = gc.Watchdog(results, tmp_path, clock)

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(gc.os, "_exit", fake_exit)
    with pytest.raises(SystemExit) as info:
        dog.fire()
    assert info.value.code == 1
    assert [r["status"] for r in results["sections"]] == ["passed", "failed", "skipped"]
    assert "budget" in results["sections"][1]["reason"] and "budget" in results["sections"][2]["reason"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["stopped_by_watchdog"] is True
    assert "stopped by the watchdog" in capsys.readouterr().out
    assert dog.finish() is False  # the main thread learns that the watchdog already wrote the results


def test_describe_error_shortens_long_messages():
    try:
        raise RuntimeError("x" * 5000)
    except RuntimeError as err:
        info = gc.describe_error(err)
    assert info["type"] == "RuntimeError" and len(info["message"]) < 2100 and info["message"].endswith("[...]")
    assert info["traceback"].startswith("Traceback") and "RuntimeError: xxx" in info["traceback"]
    assert max(len(line) for line in info["traceback"].splitlines()) < 520


def test_as_plain():
    from course_utils import hardware

    assert gc.as_plain(None) is None
    assert gc.as_plain(hardware.datasheet_for("Tesla T4"))["tensor16_tflops"] == 65.0
    assert gc.as_plain(Sheet(1.0, 2.0)).startswith("<")  # neither NamedTuple nor dataclass: its text
