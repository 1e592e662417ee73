"""Tests of scripts/gpu_check.py and its package, scripts/gpucheck/, without a GPU: the no-CUDA exit, the pure parts
(arithmetic, runner, strict verdict, output), the plans a dry run prints on simulated GPUs, and the sections' logic
with the heavy work patched out.

The GPU sections themselves can only run on a real NVIDIA GPU (see the script's docstring); here we check
everything around them: what the script does when there is no GPU, the TFLOP/s arithmetic, that a failing section
is recorded and the run goes on, that the time budget skips sections with a reason, what --strict fails on, that
the T4 branch (fp16) is planned on every simulated GPU, the matmul timer and sizes, the measured steps per case and
trick, that child processes are ended, and the markdown and JSON it writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils import benchmark

from gpu_sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the check's package, scripts/gpucheck/
from gpucheck import children, cli, gpu, plan, report, runner, settings
from gpucheck.sections import loops, machine
from gpucheck.sections import memory as memory_section
from gpucheck.sections import models as models_section
from gpucheck.sections import timeline as timeline_section

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load_script() -> types.ModuleType:
    """scripts/gpu_check.py itself, the entry point: its SECTIONS are what a run checks."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SECTIONS = _load_script().SECTIONS
CHECK_MODULES = (
    children,
    cli,
    gpu,
    plan,
    report,
    runner,
    loops,
    machine,
    memory_section,
    models_section,
    timeline_section,
)


def patch_check(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """Replace ``name`` in every module of the check that has it (each looks its names up in its own namespace)."""
    found = [module for module in CHECK_MODULES if hasattr(module, name)]
    assert found, f"no module of the check has {name!r}"
    for module in found:
        monkeypatch.setattr(module, name, value)


class Sheet:
    """A datasheet entry with the fields the script reads."""

    def __init__(self, fp32: float, tensor16: float) -> None:
        self.fp32_tflops, self.tensor16_tflops = fp32, tensor16


def _ctx(budget_s: float = 480.0, used_s: float = 0.0):
    clock = runner.Clock(budget_s, start=time.monotonic() - used_s)
    return runner.Context(torch=None, clock=clock, out_dir=Path("."), device="cuda")


def _section(func, needs=(), min_s=1.0, cap_s=30.0):
    return runner.Section(9, "demo", "A demo section", func, needs=needs, min_s=min_s, cap_s=cap_s)


# --------------------------------------------------------------------------------------------
# Without a GPU
# --------------------------------------------------------------------------------------------
def test_without_cuda_exits_2_fast_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=15, cwd=REPO)
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
    assert cli.main(SECTIONS, ["--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "needs an NVIDIA GPU with CUDA" in captured.err and "is_available() is False" in captured.err
    assert not (tmp_path / "out").exists()  # nothing was run, nothing written


@pytest.mark.parametrize(
    "value, hidden", [("", True), ("-1", True), (" ", True), ("0", False), ("1,0", False), (None, False)]
)
def test_gpus_hidden(value, hidden):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert gpu.gpus_hidden(env) is hidden


# --------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------
def test_tflops():
    assert machine.tflops(4096, 1e-3) == pytest.approx(2 * 4096**3 / 1e-3 / 1e12)
    assert machine.tflops(4096, 1e-3) == pytest.approx(137.44, abs=0.01)
    with pytest.raises(ValueError, match="seconds"):
        machine.tflops(4096, 0)


def test_peak_tflops_picks_the_datasheet_column():
    sheet = Sheet(fp32=8.1, tensor16=65.0)
    assert machine.peak_tflops("float32", sheet, bf16_native=False) == 8.1
    assert machine.peak_tflops("float16", sheet, bf16_native=False) == 65.0
    assert machine.peak_tflops("bfloat16", sheet, bf16_native=False) is None  # emulated: no peak to compare with
    assert machine.peak_tflops("bfloat16", sheet, bf16_native=True) == 65.0
    assert machine.peak_tflops("float16", None, bf16_native=True) is None  # GPU not in the table


def test_percent_of_peak():
    assert machine.percent_of_peak(32.5, 65.0) == pytest.approx(50.0)
    assert machine.percent_of_peak(70.0, 67.0) == pytest.approx(104.48, abs=0.01)  # above 100 % is reported as is
    assert machine.percent_of_peak(10.0, None) is None
    assert machine.percent_of_peak(10.0, 0.0) is None


def test_percent_of_peak_with_the_course_datasheet():
    from course_utils import hardware

    sheet = hardware.datasheet_for("Tesla T4")
    achieved = machine.tflops(4096, 2 * 4096**3 / 32.5e12)  # a multiply that ran at 32.5 TFLOP/s
    peak = machine.peak_tflops("float16", sheet, False)
    assert machine.percent_of_peak(achieved, peak) == pytest.approx(100 * 32.5 / 65)


# --------------------------------------------------------------------------------------------
# The section runner
# --------------------------------------------------------------------------------------------
def test_runner_records_an_exception_and_keeps_partial_results():
    def boom(ctx, out):
        out.data["before"] = 1
        out.table("partial", ["a"], [[1]])
        raise RuntimeError("boom: the kernel failed")

    rec = runner.run_section(_section(boom), _ctx())
    assert rec["status"] == "failed"
    assert rec["error"]["type"] == "RuntimeError"
    assert rec["error"]["message"] == "boom: the kernel failed"
    assert "boom" in rec["error"]["traceback"] and "Traceback" in rec["error"]["traceback"]
    assert rec["reason"].startswith("RuntimeError: boom")
    assert rec["data"] == {"before": 1} and rec["tables"][0]["rows"] == [[1]]
    assert rec["seconds"] >= 0
    assert report.exit_status([rec]) == 1


def test_runner_goes_on_after_a_failed_section():
    calls = []

    def bad(ctx, out):
        calls.append("bad")
        raise ValueError("no")

    def good(ctx, out):
        calls.append("good")
        out.check("fine", True)

    sections = [runner.Section(1, "bad", "Bad", bad, min_s=0), runner.Section(2, "good", "Good", good, min_s=0)]
    results = {}
    ctx = _ctx()
    ctx.torch = type("NoTorch", (), {"cuda": type("C", (), {"is_available": staticmethod(lambda: False)})})
    runner.run_all(sections, ctx, results)
    assert calls == ["bad", "good"]
    assert [r["status"] for r in results["sections"]] == ["failed", "passed"]
    assert report.exit_status(results["sections"]) == 1


def test_ctrl_c_stops_the_run_and_keeps_the_records():
    def interrupted(ctx, out):
        raise KeyboardInterrupt

    sections = [
        runner.Section(1, "first", "First", interrupted, min_s=0),
        runner.Section(2, "second", "Second", lambda c, o: None, min_s=0),
    ]
    ctx = _ctx()
    ctx.torch = type("NoTorch", (), {"cuda": type("C", (), {"is_available": staticmethod(lambda: False)})})
    results = {}
    runner.run_all(sections, ctx, results)
    assert [r["status"] for r in results["sections"]] == ["failed", "skipped"]
    assert "interrupted" in results["sections"][0]["reason"] and "interrupted" in results["sections"][1]["reason"]


def test_runner_failed_check_fails_the_section():
    def checks(ctx, out):
        out.check("ok one", True)
        out.check("bad one", False, "detail")

    rec = runner.run_section(_section(checks), _ctx())
    assert rec["status"] == "failed"
    assert rec["reason"] == "failed checks: bad one"
    assert rec["error"] is None


def test_runner_skip_and_partial_skip():
    def skipper(ctx, out):
        raise runner.Skip("torch.distributed is not available")

    rec = runner.run_section(_section(skipper), _ctx())
    assert rec["status"] == "skipped" and rec["reason"] == "torch.distributed is not available"

    def partial(ctx, out):
        out.check("fine", True)
        out.skip_part("bfloat16 loop not run: emulated here", "n/a")

    rec = runner.run_section(_section(partial), _ctx())
    assert rec["status"] == "passed"
    assert rec["reason"] == "partly skipped: bfloat16 loop not run: emulated here"
    assert rec["partial"] == [{"what": "bfloat16 loop not run: emulated here", "kind": "n/a", "library": None}]
    assert report.exit_status([rec]) == 0 and report.exit_status([rec], strict=True) == 0  # a path this GPU lacks
    out = runner.Outcome()
    with pytest.raises(ValueError, match="kind"):
        out.skip_part("x", "sometimes")
    with pytest.raises(ValueError, match="library"):
        out.skip_part("x", "library")


def test_budget_skip_does_not_start_the_section():
    called = []
    ctx = _ctx(budget_s=100, used_s=95)
    rec = runner.run_section(_section(lambda c, o: called.append(1), min_s=20), ctx)
    assert called == []
    assert rec["status"] == "skipped"
    assert "time budget nearly spent" in rec["reason"] and "20 s" in rec["reason"]
    assert report.exit_status([rec]) == 0  # skipped for a stated reason
    assert report.exit_status([rec], strict=True) == settings.EXIT_STRICT  # but --strict fails on it


def test_section_deadline_is_the_smaller_of_cap_and_budget():
    seen = {}

    def look(ctx, out):
        seen["left"] = ctx.left()

    runner.run_section(_section(look, cap_s=30), _ctx(budget_s=480))
    assert 25 < seen["left"] <= 30
    runner.run_section(_section(look, cap_s=300), _ctx(budget_s=100, used_s=50))
    assert seen["left"] <= 100 - 50 - settings.RESERVE_S + 0.5


def test_missing_package_is_not_checked_with_the_reason():
    called = []
    rec = runner.run_section(_section(lambda c, o: called.append(1), needs=("surely_not_a_package_xyz",)), _ctx())
    assert called == []
    assert rec["status"] == "not checked" and rec["missing"] == ["surely_not_a_package_xyz"]
    assert rec["reason"] == ("not checked: no surely_not_a_package_xyz (surely_not_a_package_xyz is not installed)")
    assert report.exit_status([rec]) == 0 and report.exit_status([rec], strict=True) == 0


def test_requirement_problem_for_a_broken_package(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg_xyz.py").write_text("raise ImportError('needs a newer torch')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = runner.requirement_problem("broken_pkg_xyz")
    assert "does not import" in reason and "needs a newer torch" in reason
    assert runner.requirement_problem("json") is None


def test_exit_status():
    assert report.exit_status([{"key": "a", "status": "passed"}, {"key": "b", "status": "skipped", "reason": "x"}]) == 0
    assert (
        report.exit_status(
            [{"key": "a", "status": "passed"}, {"key": "b", "status": "not checked", "reason": "not checked: no peft"}],
            strict=True,
        )
        == 0
    )
    assert report.exit_status([{"status": "passed"}, {"status": "failed", "reason": "x"}]) == 1
    assert report.exit_status([{"status": "failed", "reason": "x"}], strict=True) == 1  # a failure stays 1
    assert report.exit_status([{"status": "skipped", "reason": None}]) == 1  # a skip must say why
    assert report.exit_status([{"status": "running"}]) == 1
    with pytest.raises(TypeError, match="strict"):
        report.exit_status([], strict="yes")


def test_sections_are_in_the_brief_order_and_selectable():
    assert [s.key for s in SECTIONS] == [
        "environment",
        "matmul",
        "mixed_precision",
        "microbatch_sweep",
        "step_memory",
        "qlora",
        "ddp",
        "trainer",
        "timeline",
    ]
    assert [s.number for s in SECTIONS] == list(range(1, 10))
    assert [s.key for s in plan.parse_sections("qlora, 1", SECTIONS)] == ["environment", "qlora"]
    assert len(plan.parse_sections(None, SECTIONS)) == 9
    with pytest.raises(ValueError, match="unknown section"):
        plan.parse_sections("matmul,nope", SECTIONS)
    assert (
        sum(s.cap_s for s in SECTIONS) <= settings.DEFAULT_BUDGET_S - settings.RESERVE_S
    )  # every section keeps its share


def test_parse_args_defaults_and_errors(capsys):
    args = cli.parse_args(SECTIONS, [])
    assert args.out == "gpu_check_out" and args.budget_s == 300 and len(args.section_list) == 9
    assert args.strict is False and args.dry_run is False
    assert cli.parse_args(SECTIONS, ["--strict", "--budget-s", "200"]).strict is True
    with pytest.raises(SystemExit) as info:
        cli.parse_args(SECTIONS, ["--sections", "bogus"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        cli.parse_args(SECTIONS, ["--budget-s", "5"])
    capsys.readouterr()


def test_help_names_every_option_section_and_default(capsys):
    """--help (what a user reads) names every option, every section by number and name, and the real defaults."""
    with pytest.raises(SystemExit) as info:
        cli.parse_args(SECTIONS, ["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(option in text for option in ("--out", "--sections", "--budget-s", "--strict", "--dry-run"))
    assert all(f"{s.number}={s.key}" in text for s in SECTIONS)
    assert f"default {settings.DEFAULT_BUDGET_S:g}" in text and f"over {settings.ESTIMATE_LIMIT_PCT:g} %" in text
    assert cli.parse_args(SECTIONS, []).budget_s == settings.DEFAULT_BUDGET_S


def test_plan_budget_fits_the_sections_in_any_budget():
    planned = plan.plan_budget(SECTIONS, 300)
    assert planned == list(SECTIONS)  # the caps were made for the default budget
    small = plan.plan_budget(SECTIONS, 100)
    assert sum(s.cap_s for s in small) <= 100 - settings.RESERVE_S + 0.5
    assert [s.key for s in small] == [s.key for s in SECTIONS]
    assert all(0 < a.cap_s < b.cap_s for a, b in zip(small, SECTIONS))
    assert plan.plan_budget(SECTIONS[:2], 100) == list(SECTIONS[:2])  # a few sections keep their caps
    with pytest.raises(ValueError, match="budget_s"):
        plan.plan_budget(SECTIONS, 5)


# --------------------------------------------------------------------------------------------
# --strict, "not checked", the summary line
# --------------------------------------------------------------------------------------------
def _rec(key: str, status: str = "passed", reason: str | None = None, partial=(), errors=()):
    rec = {
        **runner.new_record(runner.Section(1, key, key.title(), lambda c, o: None)),
        "status": status,
        "reason": reason,
        "partial": list(partial),
    }
    if errors:
        rec["data"] = {"estimate_errors": [{"case": c, "error_pct": e} for c, e in errors]}
    return rec


@pytest.mark.parametrize("error, fails", [(9.9, False), (10.0, False), (10.1, True), (-12.0, True), (25.0, True)])
def test_strict_fails_on_an_estimate_error_over_10_percent(error, fails):
    records = [_rec("step_memory", errors=[("lora batch 1", 2.0), ("full batch 8", error)])]
    assert report.exit_status(records) == 0  # without --strict: today's behaviour
    assert report.exit_status(records, strict=True) == (settings.EXIT_STRICT if fails else 0)
    problems = report.strict_problems(records)
    assert bool(problems) is fails
    if fails:
        assert "full batch 8" in problems[0] and f"{error:+.1f} %" in problems[0] and "over 10 %" in problems[0]


def test_missing_library_is_not_checked_and_does_not_fail_strict():
    records = [
        _rec("matmul"),
        _rec("qlora", "not checked", "not checked: no bitsandbytes (bitsandbytes is not installed)"),
        _rec(
            "step_memory",
            partial=[{"what": "8-bit AdamW not measured", "kind": "library", "library": "bitsandbytes"}],
            errors=[("full batch 1", 2.0)],
        ),
    ]
    assert report.exit_status(records, strict=True) == 0
    assert report.strict_problems(records) == []
    assert report.not_checked(records) == [
        "qlora: not checked: no bitsandbytes (bitsandbytes is not installed)",
        "step_memory: 8-bit AdamW not measured (not checked: no bitsandbytes)",
    ]
    summary = report.summarize({"sections": records, "strict": True, "elapsed_s": 10.0, "budget_s": 300.0})
    assert summary["word"] == "INCOMPLETE"  # never PASSED while something was not checked
    assert "qlora" not in summary["passed"] and summary["not_checked_sections"] == ["qlora"]
    md = report.render_markdown(
        {"sections": records, "strict": True, "elapsed_s": 10.0, "budget_s": 300.0, "exit_status": 0}
    )
    assert "Not checked (a missing optional library" in md and "- qlora: not checked: no bitsandbytes" in md
    assert "## 1. Qlora: not checked" in md and "Result: **INCOMPLETE**" in md


@pytest.mark.parametrize(
    "record",
    [
        _rec("ddp", "skipped", "torch.distributed is not available"),
        _rec("trainer", "skipped", "time budget nearly spent: 3 s left"),
        _rec(
            "step_memory",
            partial=[{"what": "torch.compile not measured: 12 s left", "kind": "time", "library": None}],
            errors=[("full batch 1", 2.0)],
        ),
        _rec(
            "step_memory",
            partial=[{"what": "lora batch 1: not checked: peft missing", "kind": "library", "library": "peft"}],
        ),  # nothing else measured: no estimate was checked
    ],
)
def test_another_skip_fails_strict(record):
    records = [_rec("matmul"), record]
    assert report.exit_status(records) == 0
    assert report.exit_status(records, strict=True) == settings.EXIT_STRICT
    assert len(report.strict_problems(records)) == 1
    summary = report.summarize({"sections": records, "strict": True, "exit_status": 3})
    assert summary["word"] == "FAILED (--strict)" and "exit status 3" in summary["line"]
    assert report.summarize({"sections": records, "strict": False, "exit_status": 0})["word"] == "INCOMPLETE"


def test_strict_fails_when_the_estimate_assumed_another_attention_backend():
    record = _rec("step_memory") | {
        "data": {
            "estimate_errors": [{"case": "full batch 1", "error_pct": 2.0}],
            "attention_mismatches": [{"case": "full batch 1", "ran": "math", "assumed": "efficient"}],
        }
    }
    assert report.strict_problems([record]) == [
        "step_memory: full batch 1: the estimate assumed efficient attention, math ran"
    ]
    assert report.exit_status([record]) == 0 and report.exit_status([record], strict=True) == settings.EXIT_STRICT


def test_summary_line_passed_only_when_everything_passed():
    records = [_rec("matmul", partial=[{"what": "bfloat16 emulated", "kind": "n/a", "library": None}]), _rec("ddp")]
    summary = report.summarize({"sections": records, "elapsed_s": 123.4, "budget_s": 300.0})
    assert summary["word"] == "PASSED"
    assert summary["line"] == (
        "gpu_check: PASSED: 2 passed, 0 failed, 0 skipped, 0 not checked of 2 sections; "
        "123 s of a 300 s budget; exit status 0"
    )
    records.append(_rec("qlora", "failed", "boom"))
    line = report.summarize({"sections": records})["line"]
    assert line.startswith("gpu_check: FAILED: 2 passed, 1 failed") and "failed: qlora" in line
    with pytest.raises(ValueError, match="limit_pct"):
        report.strict_problems(records, limit_pct=0)


def _fake_main_sections():
    def estimates(ctx, out):
        out.data["estimate_errors"] = [{"case": "full batch 8", "error_pct": 14.0}]
        out.check("measured", True)

    return (
        runner.Section(1, "step_memory", "Estimates", estimates, min_s=0, cap_s=5),
        runner.Section(2, "qlora", "QLoRA", lambda c, o: None, needs=("bitsandbytes",), min_s=0, cap_s=5),
    )


def test_main_exit_codes_strict_and_summary_on_a_simulated_gpu(monkeypatch, tmp_path, capsys):
    simulate(monkeypatch, "H100")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    patch_check(monkeypatch, "setup_environment", lambda out_dir=None: None)
    patch_check(monkeypatch, "requirement_problem", lambda name: f"{name} is not installed")
    ended = []
    patch_check(monkeypatch, "end_children", lambda grace_s=3.0, root=None: ended.append(grace_s) or [])
    sections = _fake_main_sections()
    assert cli.main(sections, ["--out", str(tmp_path / "plain")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpu_check: INCOMPLETE: 1 passed, 0 failed, 0 skipped, 1 not checked of 2 sections")
    assert cli.main(sections, ["--strict", "--out", str(tmp_path / "strict")]) == settings.EXIT_STRICT
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1].startswith("gpu_check: FAILED (--strict)")
    assert "Fails --strict" in printed and "estimate error +14.0 % for full batch 8" in printed
    saved = json.loads((tmp_path / "strict" / "gpu_check.json").read_text())
    assert saved["exit_status"] == 3 and saved["strict"] is True
    assert saved["summary"]["not_checked"] == ["qlora: not checked: no bitsandbytes (bitsandbytes is not installed)"]
    assert [s["status"] for s in saved["sections"]] == ["passed", "not checked"]
    assert len(ended) == 2  # children ended at the end of each run


# --------------------------------------------------------------------------------------------
# The plans: --dry-run on simulated GPUs, the T4 branch on every card
# --------------------------------------------------------------------------------------------
def _plan(monkeypatch, key, bitsandbytes=True):
    simulate(monkeypatch, key)
    problem = (
        (lambda name: None)
        if bitsandbytes
        else (lambda name: "bitsandbytes is not installed" if name == "bitsandbytes" else None)
    )
    planned = plan.build_plan(torch, SECTIONS, 300, problem=problem)
    return {s["key"]: s for s in planned["sections"]}, planned


@pytest.mark.parametrize("key, native", [("T4", False), ("H100", True), ("H200", True)])
def test_dry_run_plans_the_fp16_cases_on_every_gpu(monkeypatch, key, native):
    sections, planned = _plan(monkeypatch, key)
    assert planned["bf16_native"] is native and planned["planned_s"] <= 300 - settings.RESERVE_S
    for name in ("step_memory", "qlora", "trainer", "mixed_precision"):
        fp16 = [c for c in sections[name]["cases"] if c["fp16"]]
        assert fp16, name
        assert all(c["forced"] is (native and name != "mixed_precision") for c in fp16), name
    step = [c for c in sections["step_memory"]["cases"] if c["fp16"]]
    assert {c["method"] for c in step} == {"lora", "full"} and all(c["autocast"] == "fp16" for c in step)
    qlora = sections["qlora"]["cases"]
    assert [c["compute_dtype"] for c in qlora] == (["bfloat16", "float16"] if native else ["float16"])
    trainer = sections["trainer"]["cases"]
    assert [c["fp16"] for c in trainer] == ([False, True] if native else [True])


@pytest.mark.parametrize("key", ["T4", "H100", "H200"])
def test_dry_run_prints_the_plan_and_runs_nothing(monkeypatch, capsys, tmp_path, key):
    simulate(monkeypatch, key)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    patch_check(monkeypatch, "requirement_problem", lambda name: None)
    patch_check(monkeypatch, "run_all", lambda *a: pytest.fail("a dry run must not run the sections"))
    assert cli.main(SECTIONS, ["--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    name = {"T4": "Tesla T4", "H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}[key]
    assert out.startswith("# gpu_check dry run") and f"GPU: {name}" in out
    assert "fp16 autocast + GradScaler" in out and "float16 compute" in out and "fp16=True" in out
    assert "8192x8192 float16" in out and "4096x4096 float32" in out and "3 measured steps" in out
    assert ("forced: the T4 branch" in out) is (key != "T4")
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_sections_not_checked_for_a_missing_library(monkeypatch):
    sections, _ = _plan(monkeypatch, "H200", bitsandbytes=False)
    assert sections["qlora"]["not_checked"].startswith("not checked: no bitsandbytes")
    assert sections["step_memory"]["not_checked"] is None
    labels = [c["label"] for c in sections["step_memory"]["cases"]]
    assert "trick adamw8bit: not checked: bitsandbytes missing" in labels
    assert "qlora batch 4 (4-bit NF4 base, notebook 01b's recipe): not checked: bitsandbytes missing" in labels
    assert "adamw8bit" not in [c.get("trick") for c in sections["step_memory"]["cases"]]


def test_dry_run_without_peft_plans_the_estimates_and_tricks(monkeypatch, capsys, tmp_path):
    """torch and transformers alone check full tuning, the tricks and compile; LoRA cases are "not checked"."""
    simulate(monkeypatch, "H200")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "peft", None)  # "import peft" fails, as where it is not installed
    assert runner.requirement_problem("peft") == "peft is not installed"
    assert cli.main(SECTIONS, ["--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    step_memory = out[out.index("## 5.") : out.index("## 6.")]
    assert "**not checked" not in step_memory
    for label in (
        "- full batch 1",
        "- full batch 4, fp16 autocast + GradScaler",
        "- full-bf16 batch 4",
        "- trick baseline",
        "- trick checkpointing",
        "- trick bf16",
        "- trick accumulation",
        "- trick compile",
        "- lora batch 1: not checked: peft missing",
        "- qlora batch 4 (4-bit NF4 base, notebook 01b's recipe): not checked: peft missing",
    ):
        assert label in step_memory, label
    qlora = out[out.index("## 6.") : out.index("## 7.")]
    assert "not checked: no peft" in qlora


def test_strict_fails_when_no_estimate_was_checked(monkeypatch, tmp_path, capsys):
    simulate(monkeypatch, "H200")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    patch_check(monkeypatch, "setup_environment", lambda out_dir=None: None)
    patch_check(monkeypatch, "end_children", lambda grace_s=3.0, root=None: [])
    sections = (runner.Section(5, "step_memory", "Estimates", lambda c, o: None, min_s=0, cap_s=5),)
    assert cli.main(sections, ["--out", str(tmp_path / "plain")]) == 0  # without --strict: INCOMPLETE is still exit 0
    assert cli.main(sections, ["--strict", "--out", str(tmp_path / "strict")]) == settings.EXIT_STRICT
    assert "step_memory: no estimate was checked against a measured peak" in capsys.readouterr().out


def test_setup_environment_keeps_every_file_under_out(monkeypatch, tmp_path):
    import tempfile

    for name in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONPATH", *settings.OFFLINE_ENV):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])  # restored after the test
        else:
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    monkeypatch.setattr(tempfile, "tempdir", None)
    cli.setup_environment(tmp_path / "out")
    assert tempfile.gettempdir() == str(tmp_path / "out" / "tmp")
    for name in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert Path(os.environ[name]).is_relative_to(tmp_path / "out") and Path(os.environ[name]).is_dir()
    monkeypatch.setattr(tempfile, "tempdir", None)


def test_long_sequence_case_fits_a_t4_by_the_estimate(monkeypatch):
    from course_utils import datasheets, memory
    from course_utils import step_memory as sm

    batch = plan.long_seq_batch()
    t4 = datasheets.lookup("T4")

    def verdict(b):
        est = sm.estimate_step(
            "smollm2-135m", method="lora", batch=b, seq=1024, autocast=True, device="cuda", capability=t4.capability
        )
        return memory.step_verdict(est.peak_gb, t4.usable_gb), est.attention.backend

    assert verdict(batch) == ("fits", "math") and verdict(2 * batch)[0] != "fits"
    simulate(monkeypatch, "H200")
    (case,) = [c for c in plan.step_cases(True) if c.get("long_seq")]
    assert (case["method"], case["batch"], case["seq"], case["autocast"]) == ("lora", batch, 1024, "auto")
    present = sm.estimate_step("smollm2-135m", method="lora", batch=batch, seq=1024, autocast=True, device="cuda")
    assert present.attention.backend == "cudnn"  # the estimate uses the backend this card (sm90) gets


def test_h200_profile_and_datasheet(monkeypatch):
    from course_utils import hardware

    prof = simulate(monkeypatch, "H200")
    assert torch.cuda.get_device_name(0) == "NVIDIA H200" and torch.cuda.get_device_capability(0) == (9, 0)
    assert torch.cuda.get_device_properties(0).total_memory == 150_754_820_096 == 143_771 * 1024**2
    assert prof.multi_processor_count == 132 and hardware.bf16_native("cuda")
    sheet = hardware.datasheet_for("NVIDIA H200")
    assert sheet is not None and sheet.memory_gb == 141.0 and sheet.tensor16_tflops == 989.0
    assert machine.peak_tflops("float16", sheet, True) == 989.0 and machine.peak_tflops("float32", sheet, True) == 67.0


# --------------------------------------------------------------------------------------------
# Matmuls: 4096² and 8192², blocked_autorange, median and spread
# --------------------------------------------------------------------------------------------
def test_matmul_stats():
    stats = machine.matmul_stats(4096, [1e-3, 2e-3, 3e-3, 4e-3, 5e-3])
    assert stats["median_ms"] == pytest.approx(3.0) and stats["runs"] == 5
    assert (stats["q1_ms"], stats["q3_ms"], stats["iqr_ms"]) == pytest.approx((2.0, 4.0, 2.0))
    assert (stats["min_ms"], stats["max_ms"]) == pytest.approx((1.0, 5.0))
    assert stats["tflops"] == pytest.approx(machine.tflops(4096, 3e-3))
    assert stats["best_tflops"] == pytest.approx(machine.tflops(4096, 1e-3))
    one = machine.matmul_stats(8192, [2e-3])
    assert one["iqr_ms"] == 0 and one["median_ms"] == pytest.approx(2.0)
    for bad in ([], [0.0], [float("nan")]):
        with pytest.raises(ValueError, match="times"):
            machine.matmul_stats(4096, bad)
    with pytest.raises(ValueError, match="size"):
        machine.matmul_stats(0, [1e-3])


def test_matmul_stats_agree_with_torch_benchmark():
    a = torch.ones(32, 32)
    m = benchmark.Timer("a @ a", globals={"a": a}).blocked_autorange(min_run_time=0.02)
    stats = machine.matmul_stats(32, list(m.times))
    assert stats["median_ms"] == pytest.approx(m.median * 1e3) and stats["iqr_ms"] == pytest.approx(m.iqr * 1e3)


class FakeTimer:
    """torch.utils.benchmark.Timer's stand-in: records its use, answers with set per-dtype times."""

    made: list[FakeTimer] = []
    seconds = {"float32": 10e-3, "float16": 1e-3, "bfloat16": 1.2e-3}

    def __init__(self, stmt, globals, label="", description="", **kwargs):
        self.stmt, self.globals, self.label, self.description = stmt, globals, label, description
        self.timeit_calls, self.autorange_calls = [], []
        FakeTimer.made.append(self)

    def timeit(self, number):
        self.timeit_calls.append(number)

    def blocked_autorange(self, min_run_time=0.2, **kwargs):
        self.autorange_calls.append(min_run_time)
        t = self.seconds[self.description] * (2 if "8192" in self.label else 1)
        return SimpleNamespace(times=[t * f for f in (1.0, 1.1, 0.9, 1.2)], number_per_run=7)


def _run_matmul(monkeypatch, key):
    from course_utils import precision

    simulate(monkeypatch, key)
    FakeTimer.made = []
    sizes = []
    monkeypatch.setattr(benchmark, "Timer", FakeTimer)
    patch_check(
        monkeypatch,
        "square_pair",
        lambda torch_, size, dtype, device: sizes.append((size, dtype)) or (torch.ones(2, 2), torch.ones(2, 2)),
    )
    monkeypatch.setattr(
        precision,
        "time_matmul",
        lambda size, dtype, device, **kw: precision.MatmulTiming(
            size, dtype, "cuda:0", 1.0, machine.tflops(size, 1e-3)
        ),
    )
    out, ctx = runner.Outcome(), _ctx(300)
    ctx.torch = torch
    ctx.deadline = time.monotonic() + 30
    machine.section_matmul(ctx, out)
    return out, sizes


def test_matmul_times_both_sizes_with_blocked_autorange(monkeypatch):
    out, sizes = _run_matmul(monkeypatch, "H200")
    assert sizes == [(n, d) for n in (4096, 8192) for d in ("float32", "float16", "bfloat16")]
    assert all(t.stmt == "a @ b" and t.timeit_calls == [3] for t in FakeTimer.made)  # warmed up, then timed
    assert all(t.autorange_calls == [settings.MATMUL_MIN_RUN_S] for t in FakeTimer.made) and len(FakeTimer.made) == 6
    timings = {(t["size"], t["dtype"]): t for t in out.data["timings"]}
    f16 = timings[(8192, "float16")]
    assert f16["median_ms"] == pytest.approx(2.0 * 1.05) and f16["runs"] == 4 and f16["number_per_run"] == 7
    assert f16["iqr_ms"] > 0 and f16["min_ms"] == pytest.approx(1.8) and f16["max_ms"] == pytest.approx(2.4)
    assert f16["tflops"] == pytest.approx(machine.tflops(8192, 2.1e-3))
    assert f16["percent_of_peak"] == pytest.approx(100 * f16["tflops"] / 989.0)  # the H200 datasheet
    table = out.tables[0]
    assert {"median ms", "IQR ms", "min-max ms", "TFLOP/s", "% of peak"} <= set(table["columns"])
    assert all(c["ok"] for c in out.checks), [c for c in out.checks if not c["ok"]]
    assert out.data["float16_speedup_8192"] == pytest.approx(10.0) and out.data["lesson_time_matmul"]["size"] == 4096


def test_matmul_on_a_t4_times_emulated_bfloat16_once(monkeypatch):
    out, sizes = _run_matmul(monkeypatch, "T4")
    assert (4096, "bfloat16") in sizes and (8192, "bfloat16") not in sizes and (8192, "float16") in sizes
    assert [p["kind"] for p in out.partial] == ["n/a"]
    assert next(t for t in out.data["timings"] if t["dtype"] == "bfloat16")["percent_of_peak"] is None


# --------------------------------------------------------------------------------------------
# step_memory: 3 measured steps per case and trick, fp16 with GradScaler, per-case skipped rows
# --------------------------------------------------------------------------------------------
def _measurement(**kw):
    from course_utils.measure import StepMeasurement

    autocast = kw.pop("autocast", None)
    return StepMeasurement(
        peak_bytes=kw.pop("peak_bytes", 2 * 10**9),
        baseline_bytes=0,
        weights_bytes=10**8,
        grads_bytes=10**8,
        optimizer_bytes=kw.pop("optimizer_bytes", 8 * 10**8),
        saved_activations_bytes=10**8,
        step_seconds=0.05,
        device="cuda:0",
        what="CUDA allocator peak",
        autocast=autocast,
        extra={"loss_scaling": autocast == "float16"},
        **kw,
    )


def _run_step_memory(monkeypatch, key="H100", trick_rows=None, problems=None):
    from course_utils import measure, tricks

    simulate(monkeypatch, key)
    calls, trick_calls, order = [], [], []

    def fake_step(config, device=None, **kwargs):
        calls.append(kwargs)
        order.append("case")
        autocast = {"fp16": "float16"}.get(kwargs.get("autocast"))
        m = _measurement(steps=kwargs["steps"], autocast=autocast)
        m.extra["attention"] = "flash" if kwargs["seq"] == 1024 else "efficient"
        return m

    def fake_tricks(config, base, keys, **kwargs):
        trick_calls.append((dict(base), list(keys), kwargs))
        order.append("compile" if keys == ["compile"] else "tricks")
        rows = []
        for k in keys:
            if trick_rows and k in trick_rows:
                rows.append(tricks.TrickResult(k, k, "claim", skipped=trick_rows[k], device="cuda:0"))
                continue
            m = _measurement(steps=base["steps"], optimizer_bytes=2 * 10**8 if k == "adamw8bit" else 8 * 10**8)
            rows.append(
                tricks.TrickResult(
                    k,
                    k,
                    "claim",
                    peak_bytes=m.peak_bytes,
                    step_seconds=0.05,
                    optimizer_bytes=m.optimizer_bytes,
                    saved_activations_bytes=10**8,
                    trained_params=10**8,
                    estimate_bytes=int(2.1e9),
                    estimate_moment="backward",
                    device="cuda:0",
                    measurement=m,
                )
            )
        return rows

    monkeypatch.setattr(measure, "measure_training_step", fake_step)
    monkeypatch.setattr(tricks, "measure_tricks", fake_tricks)
    patch_check(monkeypatch, "free_memory", lambda torch_: None)
    patch_check(monkeypatch, "requirement_problem", lambda name: (problems or {}).get(name))
    errors = {("full", 8): 2.3e9}  # 15 % over: --strict must fail on it
    patch_check(
        monkeypatch,
        "cuda_estimate",
        lambda sm, kw, base: SimpleNamespace(
            peak_bytes=int(errors.get((kw["method"], kw["batch"]), 2.05e9)),
            peak_moment="backward",
            attention=SimpleNamespace(backend="flash" if kw["seq"] == 1024 else "efficient"),
        ),
    )
    ctx = _ctx(300)
    ctx.torch = torch
    section = next(s for s in SECTIONS if s.key == "step_memory")
    return runner.run_section(section, ctx, problem=lambda name: None), calls, trick_calls, order


def test_step_memory_measures_3_steps_per_case_and_trick_with_fp16(monkeypatch):
    rec, calls, trick_calls, order = _run_step_memory(monkeypatch)
    assert rec["status"] == "passed", rec["reason"]
    assert len(calls) == 12 and all(c["steps"] == settings.MEASURED_STEPS == 3 for c in calls)
    assert {c["method"] for c in calls} == {"lora", "full", "full-bf16", "lora-bf16", "qlora"}
    long = [c for c in calls if c["seq"] == 1024]
    assert len(long) == 1 and long[0]["method"] == "lora" and long[0]["batch"] == plan.long_seq_batch()
    assert order == ["case"] * 12 + ["tricks", "compile"]  # compile's child after the timed in-process steps
    fp16 = [c for c in calls if c.get("autocast") == "fp16"]
    assert [(c["method"], c["batch"]) for c in fp16] == [("lora", 4), ("full", 4)]
    assert any("float16 autocast with loss scaling" in c["check"] for c in rec["checks"])
    in_process = [t for t in trick_calls if "compile" not in t[1]]
    compiled = [t for t in trick_calls if t[1] == ["compile"]]
    assert in_process[0][1] == ["baseline", "checkpointing", "bf16", "adamw8bit", "accumulation"]
    assert in_process[0][0]["steps"] == 3
    assert (
        compiled
        and compiled[0][0]["steps"] == 3
        and compiled[0][2]["compile_timeout_s"] >= memory_section.COMPILE_MIN_S
    )
    data = rec["data"]
    assert [t["key"] for t in data["tricks"]] == [
        "baseline",
        "checkpointing",
        "bf16",
        "adamw8bit",
        "accumulation",
        "compile",
    ]
    first = data["tricks"][0]
    assert {
        "optimizer_bytes",
        "saved_activations_bytes",
        "estimate_moment",
        "trained_params",
        "skipped",
        "verdict",
        "mode",
        "error_pct",
    } <= set(first)  # TrickResult's own fields, not copied by hand
    assert first["measurement"]["steps"] == 3 and first["measurement"]["what"] == "CUDA allocator peak"
    assert data["estimate_vs_measured"][0]["measurement"]["steps"] == 3
    assert len(data["estimate_errors"]) == 12 + 5  # compile is not modelled by the estimate
    cases_table, tricks_table = rec["tables"]
    assert "allocator baseline GB" not in cases_table["columns"] + tricks_table["columns"]  # 0 by construction
    ran, assumed = (cases_table["columns"].index(c) for c in ("attention ran", "estimate assumes"))
    assert {(row[ran], row[assumed]) for row in cases_table["rows"]} == {("efficient", "efficient"), ("flash", "flash")}
    assert "attention_mismatches" not in data and all("attention_ran" in t for t in data["tricks"])
    problems = report.strict_problems([rec])
    assert len(problems) == 1 and "full batch 8" in problems[0] and "+15.0 %" in problems[0]
    assert report.exit_status([rec]) == 0 and report.exit_status([rec], strict=True) == settings.EXIT_STRICT


def test_step_memory_skipped_trick_rows_do_not_raise(monkeypatch):
    rows = {
        "checkpointing": "skipped: the step failed (CUDA out of memory)",
        "compile": "skipped: did not finish within its 90 s budget on this machine",
    }
    rec, _, _, _ = _run_step_memory(monkeypatch, trick_rows=rows)
    assert rec["status"] == "failed" and "trick checkpointing: measured" in rec["reason"]
    assert [p["kind"] for p in rec["partial"]] == ["time"] and "compile" in rec["partial"][0]["what"]


def test_skipped_for_time():
    assert memory_section.skipped_for_time("skipped: did not finish within its 240 s budget on this machine")
    assert not memory_section.skipped_for_time("skipped: the step failed (RuntimeError: the compiler timed out)")
    assert not memory_section.skipped_for_time("skipped: the step failed (CUDA out of memory)")
    with pytest.raises(TypeError, match="reason"):
        memory_section.skipped_for_time(None)


def test_check_measurement_wants_the_planned_steps_and_loss_scaling():
    out = runner.Outcome()
    measured = _measurement(steps=1, autocast="float16")
    memory_section.check_measurement(out, "full batch 4", measured, {"steps": 3, "fp16": True})
    assert [c["ok"] for c in out.checks] == [True, False, True]
    out = runner.Outcome()
    memory_section.check_measurement(out, "fp16", _measurement(steps=3), {"steps": 3, "fp16": True})
    assert [c["ok"] for c in out.checks] == [True, True, False]  # no fp16 autocast: the T4 branch did not run


def test_trick_record_uses_the_dataclass_fields():
    from course_utils import tricks

    row = tricks.TrickResult(
        "compile",
        "torch.compile",
        "claim",
        peak_bytes=10**9,
        estimate_bytes=2 * 10**9,
        measurement=_measurement(steps=3),
    )
    rec = memory_section.trick_record(row, "faster", "child process")
    assert rec["error_pct"] is None and rec["estimate_gb"] is None  # not modelled
    assert rec["measurement"]["steps"] == 3 and rec["verdict"] == "faster" and rec["mode"] == "child process"
    assert {f.name for f in dataclasses.fields(row)} - {"measurement"} <= set(rec)
    with pytest.raises(TypeError, match="row"):
        memory_section.trick_record({"key": "x"}, "", "")


# --------------------------------------------------------------------------------------------
# The forced fp16 QLoRA load and Trainer arguments
# --------------------------------------------------------------------------------------------
def _fake_transformers(monkeypatch):
    from course_utils import quiet

    calls = []
    fake = types.ModuleType("transformers")
    fake.AutoModelForCausalLM = SimpleNamespace(
        from_pretrained=lambda name, **kw: calls.append((name, kw)) or SimpleNamespace(eval=lambda: None)
    )
    fake.TrainingArguments = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr(quiet, "quiet_libraries", contextlib.nullcontext)
    return calls


def test_qlora_forced_float16_compute(monkeypatch):
    calls = _fake_transformers(monkeypatch)
    models = SimpleNamespace(
        dtype_kwargs=lambda dt: {"dtype": dt},
        device_map=lambda d: {"": 0},
        quantization_config=lambda bits, dt: ("nf4", bits, dt),
        load_model=lambda choice, bits, device: ("course", bits, device),
    )
    ctx = _ctx()
    ctx.torch = torch
    choice = SimpleNamespace(name="/cache/standin")
    models_section.load_4bit(ctx, models, choice, "float16", default=False)
    assert calls == [
        (
            "/cache/standin",
            {"dtype": torch.float16, "device_map": {"": 0}, "quantization_config": ("nf4", 4, torch.float16)},
        )
    ]
    assert models_section.load_4bit(ctx, models, choice, "bfloat16", default=True) == ("course", 4, "cuda")
    assert (
        models_section.quant_compute_dtype(
            SimpleNamespace(
                config=SimpleNamespace(quantization_config=SimpleNamespace(bnb_4bit_compute_dtype=torch.float16))
            )
        )
        == "float16"
    )
    assert (
        models_section.quant_compute_dtype(
            SimpleNamespace(config=SimpleNamespace(quantization_config={"bnb_4bit_compute_dtype": "bfloat16"}))
        )
        == "bfloat16"
    )
    assert models_section.quant_compute_dtype(SimpleNamespace()) == "?"


def test_trainer_forced_fp16_arguments(monkeypatch, tmp_path):
    _fake_transformers(monkeypatch)
    planned = []

    def fake_plan(folder, max_steps, device, bitsandbytes):
        planned.append((max_steps, device, bitsandbytes))
        return {"output_dir": folder, "bf16": True, "optim": "adamw_8bit", "max_steps": max_steps}, ["warm-up"]

    fake_tricks = SimpleNamespace(
        training_arguments_plan=fake_plan,
        memory_efficient_training_arguments=lambda folder, max_steps, device: ("lesson", []),
    )
    forced = plan.trainer_cases(True)[1]
    args, changes = models_section.trainer_arguments(fake_tricks, str(tmp_path), "cuda", forced, True)
    assert planned == [(2, "cuda", True)]
    assert args.fp16 is True and args.bf16 is False and args.optim == "adamw_8bit" and args.report_to == "none"
    assert changes[0] == "warm-up" and "forced by gpu_check" in changes[1]
    case = plan.trainer_cases(True)[0]
    assert models_section.trainer_arguments(fake_tricks, str(tmp_path), "cuda", case, True)[0] == "lesson"
    assert settings.FP16_TRAINING_KWARGS == {"bf16": False, "fp16": True}


# --------------------------------------------------------------------------------------------
# Child processes end with the run
# --------------------------------------------------------------------------------------------
def test_descendants_walks_the_tree():
    table = {10: (1, 10, "S"), 11: (10, 11, "S"), 12: (11, 11, "S"), 13: (10, 10, "Z"), 20: (1, 20, "S")}
    assert children.descendants(10, table) == [11, 13, 12]
    assert children.descendants(20, table) == [] and children.descendants(99, table) == []
    real = children.process_table()
    assert real[os.getpid()][0] == os.getppid() and real[os.getpid()][1] == os.getpgrp()


END_CHILDREN_SCRIPT = r"""
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from gpucheck import children
from multiprocessing import resource_tracker
resource_tracker.ensure_running()  # spared: it ends by itself with this process
tracker = resource_tracker._resource_tracker._pid
own = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own process group, as the compile child
same = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])  # a grandchild in this process's own group
mark = sys.argv[2]
orphaner = subprocess.Popen(["sh", "-c", f"(sleep 60 & echo $! > {mark}); sleep 60"], start_new_session=True)
deadline = time.monotonic() + 5
while not (os.path.exists(mark) and open(mark).read().strip()) and time.monotonic() < deadline:
    time.sleep(0.05)
orphan = int(open(mark).read())  # left its parent: no longer below this process, still in the group
time.sleep(0.2)
tree = children.descendants(os.getpid(), children.process_table())
start = time.monotonic()
ended = children.end_children(grace_s=2.0)
seconds = time.monotonic() - start
codes = [own.wait(5), same.wait(5), orphaner.wait(5)]
time.sleep(0.2)
print(json.dumps({"own": own.pid, "tree": [p for p in tree if p != tracker], "ended": ended, "codes": codes,
                  "orphan": orphan, "tracker": tracker, "tracker_in_tree": tracker in tree,
                  "tracker_alive": children.is_alive(tracker),
                  "alive": [p for p in tree + [orphan] if children.is_alive(p) and p != tracker], "seconds": seconds}))
"""


def test_end_children_ends_a_sleep_in_its_own_process_group_and_the_rest(tmp_path):
    script = tmp_path / "end_children.py"
    script.write_text(END_CHILDREN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(SCRIPT.parent), str(tmp_path / "orphan.pid")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["own"] in found["tree"] and len(found["tree"]) >= 4 and found["orphan"] not in found["tree"]
    assert found["ended"] == found["tree"]
    assert all(code < 0 for code in found["codes"]), found["codes"]  # ended by a signal
    assert found["alive"] == []  # the orphan too: its process group was signalled
    assert found["seconds"] < 2.0  # SIGTERM was enough: no wait for the grace period
    assert found["tracker_in_tree"] and found["tracker_alive"] and found["tracker"] not in found["ended"]


def test_end_children_arguments():
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        assert children.end_children(grace_s=0, root=sleeper.pid) == []  # a process with no children
        assert children.is_alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not children.is_alive(sleeper.pid)
    with pytest.raises(ValueError, match="grace_s"):
        children.end_children(grace_s=-1)


def test_step_memory_without_peft_measures_full_tuning_and_the_tricks(monkeypatch):
    problems = {"peft": "peft is not installed", "bitsandbytes": "bitsandbytes is not installed"}
    rec, calls, trick_calls, _ = _run_step_memory(monkeypatch, problems=problems)
    assert rec["status"] == "passed", rec["reason"]
    assert {c["method"] for c in calls} == {"full", "full-bf16"} and len(calls) == 5
    assert trick_calls[0][1] == ["baseline", "checkpointing", "bf16", "accumulation"]
    assert trick_calls[1][1] == ["compile"]
    libs = [(p["library"], p["what"]) for p in rec["partial"]]
    assert all(p["kind"] == "library" for p in rec["partial"])
    assert ("peft", "lora batch 1: not checked: peft missing (peft is not installed)") in libs
    assert any(lib == "bitsandbytes" and what.startswith("trick adamw8bit: not checked") for lib, what in libs)
    assert rec["data"]["estimate_errors"] and report.not_checked([rec])


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def _fake_results():
    return {
        "started_utc": "2026-11-30 22:00 UTC",
        "budget_s": 300.0,
        "elapsed_s": 123.4,
        "exit_status": 1,
        "machine": {"gpu": "Tesla T4", "capability": "7.5", "memory_gb": 15.83, "torch": "2.13.0", "cuda": "12.8"},
        "sections": [
            {
                "number": 2,
                "key": "matmul",
                "title": "Matmul speed",
                "status": "passed",
                "seconds": 3.2,
                "reason": "partly skipped: bfloat16 emulated",
                "error": None,
                "checks": [{"check": "float16 is faster than float32", "ok": True, "detail": "8.0x"}],
                "partial": [{"what": "bfloat16 emulated", "kind": "n/a", "library": None}],
                "tables": [
                    {
                        "title": "4096x4096 matmul",
                        "columns": ["dtype", "TFLOP/s", "% of peak"],
                        "rows": [["float16", 25.123, 38.65], ["bfloat16", 1.5, None], ["a|b", 0.001234, True]],
                    }
                ],
                "texts": [{"title": "report", "text": "line one\nline two"}],
                "notes": ["a note"],
                "data": {},
            },
            {
                "number": 6,
                "key": "qlora",
                "title": "QLoRA",
                "status": "failed",
                "seconds": 1.0,
                "reason": "OutOfMemoryError: CUDA out of memory",
                "checks": [],
                "tables": [],
                "texts": [],
                "notes": [],
                "error": {
                    "type": "OutOfMemoryError",
                    "message": "CUDA out of memory",
                    "traceback": "Traceback (most recent call last):\n  ...\nOutOfMemoryError: CUDA out of memory",
                },
                "data": {},
            },
            {
                "number": 8,
                "key": "trainer",
                "title": "Trainer",
                "status": "not checked",
                "seconds": 0.0,
                "reason": "not checked: no accelerate (accelerate is not installed)",
                "error": None,
                "checks": [],
                "tables": [],
                "texts": [],
                "notes": [],
                "data": {},
            },
        ],
    }


def test_render_markdown():
    md = report.render_markdown(_fake_results())
    assert md.startswith("# GPU check")
    assert "Tesla T4" in md and "compute capability 7.5" in md
    assert "Result: **FAILED** (1 passed, 1 failed, 0 skipped, 1 not checked)" in md and "exit status 1" in md
    assert "`gpu_check: FAILED: 1 passed, 1 failed, 0 skipped, 1 not checked of 3 sections; failed: qlora" in md
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
    assert "## 8. Trainer: not checked" in md and "Reason: not checked: no accelerate" in md
    assert "- trainer: not checked: no accelerate" in md


def test_render_markdown_passed_and_watchdog():
    results = _fake_results()
    results["sections"] = results["sections"][:1]
    results["exit_status"] = 0
    assert "Result: **PASSED**" in report.render_markdown(results)
    results["sections"][0]["partial"] = ["an old-style partial skip"]  # a bare string: kind 'other'
    assert "Result: **INCOMPLETE**" in report.render_markdown(results)
    results["stopped_by_watchdog"] = True
    results["ended_children"] = [4242]
    md = report.render_markdown(results)
    assert "stopped by the watchdog" in md and "Child processes ended with the run: 4242." in md


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "n/a"),
        (True, "yes"),
        (0.0, "0"),
        (1234.5, "1,234"),
        (12.345, "12.35"),
        (0.5, "0.500"),
        (0.00012, "1.20e-04"),
        (float("nan"), "nan"),
        (123456, "123,456"),
        (42, "42"),
        ("x\ny", "x y"),
    ],
)
def test_format_cell(value, text):
    assert report.format_cell(value) == text


def test_write_outputs(tmp_path):
    results = _fake_results()
    results["sections"][0]["data"] = {"dtype": object()}  # anything not JSON-able is written as text
    json_path, md_path, markdown = report.write_outputs(results, tmp_path / "out")
    assert json_path == tmp_path / "out" / "gpu_check.json" and md_path == tmp_path / "out" / "gpu_check.md"
    loaded = json.loads(json_path.read_text())
    assert [s["status"] for s in loaded["sections"]] == ["passed", "failed", "not checked"]
    assert loaded["summary"]["failed"] == ["qlora"] and loaded["summary"]["not_checked_sections"] == ["trainer"]
    assert loaded["summary"]["line"].startswith("gpu_check: FAILED")
    assert md_path.read_text() == markdown


def test_watchdog_ends_the_children_writes_what_it_has_and_exits_1(tmp_path, monkeypatch, capsys):
    results = {
        "budget_s": 100.0,
        "machine": {},
        "sections": [
            {**runner.new_record(SECTIONS[0]), "status": "passed"},
            {**runner.new_record(SECTIONS[1]), "status": "running"},
            runner.new_record(SECTIONS[2]),
        ],
    }
    clock = runner.Clock(100.0, start=time.monotonic() - 100)
    dog = children.Watchdog(results, tmp_path, clock)
    ended = []

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    patch_check(monkeypatch, "end_children", lambda grace_s=3.0, root=None: ended.append(grace_s) or [4242])
    with pytest.raises(SystemExit) as info:
        dog.fire()
    assert info.value.code == 1 and ended == [1.0]
    assert [r["status"] for r in results["sections"]] == ["passed", "failed", "skipped"]
    assert "budget" in results["sections"][1]["reason"] and "budget" in results["sections"][2]["reason"]
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["stopped_by_watchdog"] is True and saved["ended_children"] == [4242] and saved["exit_status"] == 1
    out = capsys.readouterr().out
    assert "stopped by the watchdog" in out and out.strip().splitlines()[-1].startswith("gpu_check: FAILED")
    assert dog.finish() is False  # the main thread learns that the watchdog already wrote the results


def test_describe_error_shortens_long_messages():
    try:
        raise RuntimeError("x" * 5000)
    except RuntimeError as err:
        info = runner.describe_error(err)
    assert info["type"] == "RuntimeError" and len(info["message"]) < 2100 and info["message"].endswith("[...]")
    assert info["traceback"].startswith("Traceback") and "RuntimeError: xxx" in info["traceback"]
    assert max(len(line) for line in info["traceback"].splitlines()) < 520


def test_as_plain():
    from course_utils import hardware

    assert machine.as_plain(None) is None
    assert machine.as_plain(hardware.datasheet_for("Tesla T4"))["tensor16_tflops"] == 65.0
    assert machine.as_plain(Sheet(1.0, 2.0)).startswith("<")  # neither NamedTuple nor dataclass: its text


def test_a_section_may_use_the_time_earlier_ones_left(monkeypatch):
    assert runner.section_seconds(30, 200, None) == 30  # alone: its cap
    assert runner.section_seconds(30, 200, 100) == 100  # the later sections keep their 100 s
    assert runner.section_seconds(30, 120, 100) == 30  # never less than its cap...
    assert runner.section_seconds(30, 20, 100) == 20  # ...nor more than what is left
    # a stopped clock: the figures below must not depend on how loaded the machine running the tests is
    patch_check(monkeypatch, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    seen = []
    ctx = runner.Context(torch=None, clock=runner.Clock(300, start=1000.0), out_dir=Path("."))
    ctx.torch = type("NoTorch", (), {"cuda": type("C", (), {"is_available": staticmethod(lambda: False)})})
    sections = [runner.Section(i, f"s{i}", "S", lambda c, o: seen.append(c.left()), min_s=0, cap_s=10) for i in (1, 2)]
    runner.run_all(sections, ctx, {})
    assert seen == [
        300 - settings.RESERVE_S - 10,
        300 - settings.RESERVE_S,
    ]  # all but the last section's cap; then the rest


def test_the_rule_2_probe_reads_autocasts_dtypes() -> None:
    """On a CPU autocast runs softmax and layer_norm in bfloat16; the GPU check expects float32 there (CUDA's list)."""
    import torch

    kept = loops.autocast_float32_ops(torch, "cpu", torch.bfloat16)
    assert kept == {"softmax": torch.bfloat16, "layer_norm": torch.bfloat16}


# --------------------------------------------------------------------------------------------
# 9. One step over time, measured against predicted (simulated: the measurement is made up)
# --------------------------------------------------------------------------------------------
def _measured_like(predicted, scale: float, phase: str, files: dict[str, str]):
    """A made-up measured timeline: two points, the second ``scale`` times the predicted tensor peak, in ``phase``."""
    from course_utils.timeline import Timeline, TimelinePoint, tensor_total

    top = int(tensor_total(predicted.peak) * scale)
    points = [
        TimelinePoint("start", "before the step", {"weights": 10**8}),
        TimelinePoint("top", phase, {"weights": 10**8, "activations": top - 10**8}),
    ]
    return Timeline(points, "made up", times_s=[0.0, 0.1], files=files)


@pytest.mark.parametrize("scale, phase", [(1.0, "backward"), (1.5, "backward"), (1.0, "forward")])
def test_timeline_section_checks_the_peak_and_its_phase(monkeypatch, tmp_path, scale, phase):
    from course_utils import step_memory, timeline, timeline_measure

    est = step_memory.estimate_step(timeline_section.miniature(), **timeline_section.TIMELINE_CASE, device="cuda")
    made = _measured_like(
        timeline.predicted_timeline(est),
        scale,
        phase,
        {"snapshot": str(tmp_path / "timeline" / "step_snapshot.pickle")},
    )
    seen = {}
    monkeypatch.setattr(timeline_measure, "measure_timeline", lambda *a, **k: seen.update(k) or made)
    out = runner.Outcome()
    timeline_section.section_timeline(_ctx(), out)
    assert [c["ok"] for c in out.checks] == [scale == 1.0, phase == "backward"]
    assert seen["device"] == "cuda" and seen["out_dir"].name == "timeline"  # the snapshot goes under --out
    assert out.data["timeline_files"]["snapshot"].endswith("step_snapshot.pickle")
    assert any("memory_viz" in note for note in out.notes)


def test_timeline_section_without_the_export_is_a_skip(monkeypatch):
    from course_utils import timeline_measure

    def no_export(*args, **kwargs):
        raise RuntimeError(timeline_measure.NO_EXPORT.format("2.0"))

    monkeypatch.setattr(timeline_measure, "measure_timeline", no_export)
    with pytest.raises(runner.Skip, match=re.escape(timeline_measure.NO_EXPORT.format("2.0"))):
        timeline_section.section_timeline(_ctx(), runner.Outcome())
