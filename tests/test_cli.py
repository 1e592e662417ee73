"""The command line: ``python -m course_utils memory``, its options, exit codes and the step-mode hand-off."""
from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import pytest

from course_utils import __main__ as cli
from course_utils import memory as mem

from test_memory import SEED_TABLE_TOP

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors and --help
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_memory_prints_the_seed_table(capsys) -> None:
    status, out, err = run(capsys, "memory")
    assert status == 0 and err == ""
    assert out == mem.seed_table() + "\n"
    assert out.startswith(SEED_TABLE_TOP)


def test_python_dash_m_in_a_subprocess() -> None:
    result = subprocess.run([sys.executable, "-m", "course_utils", "memory"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(SEED_TABLE_TOP)
    assert "torch" not in result.stderr


def test_config_preset_gives_exact_counts(capsys) -> None:
    status, out, _ = run(capsys, "memory", "--config", "smollm2-135m")
    assert status == 0
    assert "134,515,008 parameters" in out and "460,800 numbers" in out
    assert "smollm2-135m   LoRA, base in float32            0.54" in out


def test_config_path_with_targets_rank_and_budgets(capsys) -> None:
    path = mem.config_presets()["qwen2.5-1.5b-instruct"]
    status, out, _ = run(capsys, "memory", "--config", str(path), "--lora-rank", "16",
                         "--targets", "q_proj,k_proj,v_proj,o_proj", "--budgets", "12,24")
    assert status == 0
    assert f"{mem.lora_adapter_params(path, 16, 'q_proj,k_proj,v_proj,o_proj'):,} numbers" in out
    header = out.splitlines()[2]
    assert header.endswith("12 GB         24 GB")


def test_params_and_method(capsys) -> None:
    status, out, _ = run(capsys, "memory", "--params", "7e9", "--method", "qlora", "--budgets", "8")
    assert status == 0
    rows = [ln for ln in out.splitlines() if ln.startswith("a 7B model")]
    assert rows == ["a 7B model     QLoRA, base in 4 bits            3.79          fits"]
    assert "assumed" in out
    status, out, _ = run(capsys, "memory", "--params", "1.7B", "--method", "full")
    assert status == 0 and "assumed" not in out and "QLoRA" not in out  # no LoRA row, no adapter note


def test_lora_rank_on_the_lesson_table_is_noted(capsys) -> None:
    status, out, _ = run(capsys, "memory", "--lora-rank", "16", "--method", "lora")
    assert status == 0 and "LoRA rank 16 is assumed to train 0.69% of the model" in out
    assert "SmolLM2-135M   LoRA, base in float32            0.55" in out  # 0.5381 + 921,600 x 12 bytes


@pytest.mark.parametrize("argv,option", [
    (["--params", "-5"], "--params"),
    (["--params", "0"], "--params"),
    (["--params", "lots"], "--params"),
    (["--method", "dpo"], "--method"),
    (["--budgets", "0"], "--budgets"),
    (["--budgets", "12,-1"], "--budgets"),
    (["--budgets", "twelve"], "--budgets"),
    (["--config", "/no/such/config.json"], "--config"),
    (["--config", "not-a-preset"], "--config"),
    (["--lora-rank", "0"], "--lora-rank"),
    (["--lora-rank", "2.5"], "--lora-rank"),
    (["--targets", "q_proj"], "--targets"),
    (["--config", "smollm2-135m", "--targets", "lm_head"], "--targets"),
    (["--params", "7e9", "--config", "smollm2-135m"], "--config"),
    (["--batch", "0"], "--batch"),
    (["--seq", "-1"], "--seq"),
    (["--optimizer", "sgd"], "--optimizer"),
])
def test_bad_input_is_one_line_naming_the_option_and_exit_2(capsys, argv: list[str], option: str) -> None:
    status, out, err = run(capsys, "memory", *argv)
    assert status == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert "error:" in last and option in last


def test_unreadable_config_file(capsys, tmp_path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    status, _, err = run(capsys, "memory", "--config", str(bad))
    assert status == 2 and "--config" in err and "not a readable JSON file" in err


def test_no_command_is_an_error(capsys) -> None:
    status, _, err = run(capsys)
    assert status == 2 and "COMMAND" in err


def test_commands_are_registered_in_one_place() -> None:
    assert cli.COMMANDS == {"memory": "course_utils.memory"}
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(cli.COMMANDS)


# --------------------------------------------------------------------------------------------
# Step mode: hand-off to course_utils.step_memory
# --------------------------------------------------------------------------------------------
@pytest.fixture
def fake_step_memory(monkeypatch):
    calls: list[argparse.Namespace] = []
    fake = types.ModuleType("course_utils.step_memory")

    def fake_cli(args: argparse.Namespace) -> int:
        calls.append(args)
        print("fake step estimate")
        return 0

    fake.cli = fake_cli
    monkeypatch.setitem(sys.modules, "course_utils.step_memory", fake)
    return calls


def test_batch_hands_a_complete_namespace_to_step_memory(capsys, fake_step_memory) -> None:
    status, out, _ = run(capsys, "memory", "--batch", "4")
    assert status == 0 and out == "fake step estimate\n"
    (args,) = fake_step_memory
    assert vars(args) == {"config": None, "params": None, "method": "lora", "lora_rank": 8,
                          "targets": ["q_proj", "v_proj"], "batch": 4, "seq": 128, "checkpointing": False,
                          "optimizer": "adamw", "measure": False, "budgets": [16.0, 24.0, 80.0]}


def test_every_step_option_is_passed_on(capsys, fake_step_memory) -> None:
    status, _, _ = run(capsys, "memory", "--config", "smollm2-135m", "--method", "full", "--lora-rank", "16",
                       "--targets", "q_proj,k_proj", "--batch", "8", "--seq", "256", "--checkpointing",
                       "--optimizer", "adamw8bit", "--measure", "--budgets", "12")
    assert status == 0
    (args,) = fake_step_memory
    assert args.config == mem.config_presets()["smollm2-135m"] and isinstance(args.config, Path)
    assert (args.method, args.lora_rank, args.targets) == ("full", 16, ["q_proj", "k_proj"])
    assert (args.batch, args.seq, args.checkpointing, args.optimizer, args.measure) == (8, 256, True, "adamw8bit", True)
    assert args.budgets == [12.0] and args.params is None


def test_seq_alone_or_measure_alone_is_step_mode(capsys, fake_step_memory) -> None:
    run(capsys, "memory", "--params", "1.7B", "--seq", "512")
    run(capsys, "memory", "--measure")
    assert [(a.params, a.batch, a.seq, a.measure) for a in fake_step_memory] == [
        (1_700_000_000, 1, 512, False), (None, 1, 128, True)]


def test_step_memory_exit_status_is_returned(capsys, monkeypatch) -> None:
    fake = types.ModuleType("course_utils.step_memory")
    fake.cli = lambda args: 3
    monkeypatch.setitem(sys.modules, "course_utils.step_memory", fake)
    assert run(capsys, "memory", "--batch", "2")[0] == 3


def test_step_mode_without_step_memory_is_a_one_line_error(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "course_utils.step_memory", None)  # makes the import fail
    status, out, err = run(capsys, "memory", "--batch", "2")
    assert status == 2 and out == ""
    assert "step_memory" in err.strip().splitlines()[-1]


def test_table_mode_never_imports_step_memory(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "course_utils.step_memory", None)
    assert run(capsys, "memory", "--budgets", "12")[0] == 0
