"""The command line: ``python -m course_utils memory``, its options, exit codes, --model (a fake Hub) and --gpu."""

from __future__ import annotations

import functools
import http.server
import importlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from course_utils import cli, step_memory
from course_utils import memory as mem
from course_utils.architecture import lora_adapter_params
from course_utils.configs import config_presets

import tiny_models
from test_memory import LESSON_TABLE_TOP

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors and --help
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_memory_prints_the_lesson_table(capsys) -> None:
    status, out, err = run(capsys, "memory")
    assert status == 0 and err == ""
    assert out == mem.format_table(mem.estimate_table(), mem.BUDGETS) + "\n"
    assert out.startswith(LESSON_TABLE_TOP)
    assert "(bfloat16)" not in out  # full-bf16 is selectable, never in the lesson's four methods


def test_full_bf16_is_selectable_in_the_table_and_the_step(capsys) -> None:
    from course_utils.step_memory import estimate_step

    status, out, _ = run(capsys, "memory", "--params", "7e9", "--method", "full-bf16")
    assert status == 0
    assert [ln for ln in out.splitlines() if ln.startswith("a 7B")] == [
        "a 7B model     full fine-tuning (bfloat16)     56.00            no            no          fits"
    ]
    status, out, err = run(capsys, "memory", "--config", "smollm2-135m", "--method", "full-bf16", "--batch", "2")
    assert status == 0 and err == ""
    assert out.startswith(estimate_step("smollm2-135m", method="full-bf16", batch=2, seq=128).format() + "\n")
    assert "full fine-tuning (bfloat16), batch 2 x 128 tokens" in out


def test_python_dash_m_in_a_subprocess() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "course_utils", "memory"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(LESSON_TABLE_TOP)
    assert "torch" not in result.stderr


def test_config_preset_gives_exact_counts(capsys) -> None:
    status, out, _ = run(capsys, "memory", "--config", "smollm2-135m")
    assert status == 0
    assert "134,515,008 parameters" in out and "460,800 numbers" in out
    assert "smollm2-135m   LoRA, base in float32            0.54" in out


def test_config_path_with_targets_rank_and_budgets(capsys) -> None:
    path = config_presets()["qwen2.5-1.5b-instruct"]
    status, out, _ = run(
        capsys,
        "memory",
        "--config",
        str(path),
        "--lora-rank",
        "16",
        "--targets",
        "q_proj,k_proj,v_proj,o_proj",
        "--budgets",
        "12,24",
    )
    assert status == 0
    assert f"{lora_adapter_params(path, 16, 'q_proj,k_proj,v_proj,o_proj'):,} numbers" in out
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


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--params", "-5"], "--params"),
        (["--params", "lots"], "--params"),
        (["--params", "1e30"], "--params"),
        (["--params", "999"], "--params"),
        (["--params", "1e400"], "--params"),
        (["--budgets", "1e30"], "--budgets"),
        (["--budgets", "16,0.001"], "--budgets"),
        (["--lora-rank", "100000"], "--lora-rank"),
        (["--batch", "2000000"], "--batch"),
        (["--seq", "99999999999"], "--seq"),
        (["--config", "smollm2-135m", "--seq", "100000"], "--seq"),  # past the config's 8,192 positions
        (["--config", "smollm2-135m", "--batch", "5000", "--measure"], "--batch"),  # a measured step: at most 4,096
        (["--method", "full-bf16", "--params", "1e30"], "--params"),
        (["--method", "dpo"], "--method"),
        (["--budgets", "12,-1"], "--budgets"),
        (["--budgets", "twelve"], "--budgets"),
        (["--budgets", "nan"], "--budgets"),
        (["--budgets", ""], "--budgets"),
        (["--budgets", "12k"], "--budgets"),  # a count suffix is not a size in GB
        (["--config", "/no/such/config.json"], "--config"),
        (["--config", "not-a-preset"], "--config"),
        (["--lora-rank", "2.5"], "--lora-rank"),
        (["--targets", "q_proj"], "--targets"),
        (["--config", "smollm2-135m", "--targets", "lm_head"], "--targets"),
        (["--params", "7e9", "--config", "smollm2-135m"], "--config"),
        (["--batch", "0"], "--batch"),
        (["--seq", "-1"], "--seq"),
        (["--optimizer", "sgd"], "--optimizer"),
        (["--gpu", "X9"], "--gpu"),
        (["--gpu", "T4", "--budgets", "12"], "--budgets"),
        (["--model", "not an id"], "--model"),
        (["--params", "7e9", "--batch", "2"], "--params"),  # the option given is blamed, not the one missing
        (["--checkpointing"], "--checkpointing"),
        (["--timeline", "t.txt"], "--timeline"),
    ],
)
def test_bad_input_is_one_line_naming_the_option_and_exit_2(capsys, argv: list[str], option: str) -> None:
    status, out, err = run(capsys, "memory", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"error: argument {option}:" in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--params", "1e30"],
            "argument --params: must be between 1,000 and 1e14 (100 trillion) parameters, got '1e30'",
        ),
        (["--batch", "0"], "argument --batch: must be a whole number between 1 and 1,000,000, got 0"),
        (["--seq", "20000000"], "argument --seq: must be a whole number between 1 and 10,000,000, got 20000000"),
        (["--lora-rank", "100000"], "argument --lora-rank: must be a whole number between 1 and 65,536, got 100000"),
        (["--budgets", "1e30"], "argument --budgets: every budget must be between 0.01 and 10,000 GB, got 1e+30"),
    ],
)
def test_absurd_sizes_give_the_allowed_range(capsys, argv: list[str], message: str) -> None:
    status, out, err = run(capsys, "memory", *argv)
    assert status == 2 and out == ""
    assert err == f"{cli.build_parser().prog} memory: error: {message} (see --help)\n"


def test_the_bounds_are_the_apis(capsys) -> None:
    assert cli.param_count("1e14") == mem.MAX_PARAMS and cli.param_count("1K") == mem.MIN_PARAMS
    status, _, err = run(capsys, "memory", "--config", "smollm2-135m", "--seq", "8193")
    assert status == 2 and err.strip().endswith("argument --seq: seq must be between 1 and 8192, got 8193")


def test_unreadable_config_file(capsys, tmp_path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    status, _, err = run(capsys, "memory", "--config", str(bad))
    assert status == 2 and "--config" in err and "not a readable JSON file" in err


def test_no_command_is_an_error(capsys) -> None:
    status, _, err = run(capsys)
    assert status == 2 and "COMMAND" in err


# --------------------------------------------------------------------------------------------
# A whole training step
# --------------------------------------------------------------------------------------------
def test_step_mode_prints_the_step_estimate_and_each_budget(capsys) -> None:
    from course_utils.step_memory import estimate_step

    status, out, err = run(
        capsys,
        "memory",
        "--config",
        "smollm2-135m",
        "--batch",
        "4",
        "--seq",
        "256",
        "--checkpointing",
        "--optimizer",
        "adamw8bit",
        "--budgets",
        "2,8",
    )
    assert status == 0 and err == ""
    est = estimate_step("smollm2-135m", method="lora", batch=4, seq=256, checkpointing=True, optimizer="adamw8bit")
    assert out.startswith(est.format() + "\n")
    assert f"2 GB budget: {mem.step_verdict(est.peak_gb, 2)} (" in out and "8 GB budget: fits" in out
    assert "at most 90 % of the memory" in out and "budget, usable" not in out  # a CPU estimate: no CUDA context


def _step_lines(out: str, label: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(f"  {label} ")]


@pytest.mark.parametrize(
    "share,verdict", [(0.5, "fits"), (0.89, "fits"), (0.95, "tight"), (1.01, "does not fit"), (2.0, "does not fit")]
)
def test_a_gpu_step_fits_up_to_90_percent_of_usable_and_is_tight_up_to_100(
    capsys, monkeypatch, share: float, verdict: str
) -> None:
    from course_utils import datasheets
    from course_utils.step_memory import estimate_step

    peak = estimate_step("smollm2-135m", method="full", batch=4, seq=256, device="cuda").peak_gb
    card = peak / share + 0.5  # a card whose usable memory (less the 0.5 GB context) puts the peak at `share`
    monkeypatch.setitem(datasheets.DATASHEETS, "X1", datasheets.Datasheet("Test X1", 1.0, 1.0, card))
    status, out, err = run(
        capsys, "memory", "--config", "smollm2-135m", "--method", "full", "--batch", "4", "--seq", "256", "--gpu", "X1"
    )
    assert status == 0 and err == ""
    assert _step_lines(out, "X1") == [
        f"  X1 {card:.4g} GB budget, usable {card - 0.5:.4g} GB: {verdict} "
        f"(the predicted peak is {100 * share:.0f} % of usable)"
    ]
    assert "at most 90 % of usable (the card's memory less the 0.5 GB CUDA context)" in out


@pytest.mark.parametrize("share,verdict", [(0.89, "fits"), (0.95, "tight"), (1.01, "does not fit")])
def test_a_cpu_step_against_typed_budgets_uses_the_same_90_percent_rule(capsys, share: float, verdict: str) -> None:
    from course_utils.step_memory import estimate_step

    peak = estimate_step("smollm2-135m", method="lora", batch=2, seq=128).peak_gb  # the CLI's CPU estimate
    memory = f"{peak / share:.6f}"
    status, out, _ = run(capsys, "memory", "--config", "smollm2-135m", "--batch", "2", "--budgets", memory)
    label = f"{float(memory):g} GB"
    assert status == 0 and _step_lines(out, label) == [
        f"  {label} budget: {verdict} (the predicted peak is {100 * share:.0f} % of it)"
    ]


def test_gpu_budgets_use_the_datasheet_and_the_allocator_counter(capsys) -> None:
    status, out, _ = run(
        capsys,
        "memory",
        "--config",
        "smollm2-135m",
        "--method",
        "full",
        "--batch",
        "16",
        "--seq",
        "512",
        "--gpu",
        "T4,L4,A100-40GB,H100",
    )
    assert status == 0
    assert "(cuda)" in out.splitlines()[0] and "framework baseline (allocator counter" in out
    labels = [ln.split(": ")[0].strip() for ln in out.splitlines() if " budget, usable " in ln]
    assert labels == [
        "T4 15.83 GB budget, usable 15.33 GB",
        "L4 24 GB budget, usable 23.5 GB",  # every card alike
        "A100-40GB 40 GB budget, usable 39.5 GB",
        "H100 80 GB budget, usable 79.5 GB",
    ]
    status, out, _ = run(capsys, "memory", "--gpu", "t4,h100")  # the table, budgeted by GPU
    header = out.splitlines()[1]
    assert status == 0 and header.endswith("t4 15.83 GB    h100 80 GB") and "usable" not in out
    smol_full = next(ln for ln in out.splitlines() if ln.startswith("SmolLM2-135M   full"))
    assert smol_full.split()[-2:] == ["fits", "fits"]  # 2.15 GB <= the 70 % line of 15.83 GB


def test_a_t4_in_the_table_has_its_70_percent_line_at_11_08_gb(capsys) -> None:
    status, out, _ = run(capsys, "memory", "--params", "0.7B", "--method", "full", "--gpu", "T4")
    assert status == 0 and "11.20" in out and out.splitlines()[2].endswith("no")  # 11.2 GB > 0.7 x 15.83 GB
    status, out, _ = run(capsys, "memory", "--params", "0.69B", "--method", "full", "--gpu", "T4")
    assert out.splitlines()[2].endswith("fits")  # 11.04 GB <= 11.08 GB


# --------------------------------------------------------------------------------------------
# --model: a config.json from the Hub (a local fake Hub here: no network)
# --------------------------------------------------------------------------------------------
SMOL = json.loads(config_presets()["smollm2-135m"].read_text())
#: An architecture the arithmetic does not know (counted with transformers instead).
GEMMA = {**tiny_models.TINY, "model_type": "gemma", "head_dim": 16}


class _FakeHub(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/HuggingFaceTB/SmolLM2-135M/resolve/main/config.json":
            body, code = json.dumps(SMOL).encode(), 200
        elif self.path == "/google/gemma-tiny/resolve/main/config.json":
            body, code = json.dumps(GEMMA).encode(), 200
        elif self.path.startswith("/meta-llama/"):
            body, code = b"gated", 401
        else:
            body, code = b"not found", 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # keep the test's output clean
        pass


@pytest.fixture
def fake_hub(monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    yield
    server.shutdown()


def test_model_reads_only_the_config_from_the_hub(capsys, fake_hub) -> None:
    status, out, err = run(capsys, "memory", "--model", "HuggingFaceTB/SmolLM2-135M")
    assert status == 0 and err == ""
    assert out.startswith("HuggingFaceTB/SmolLM2-135M: 134,515,008 parameters") and "460,800 numbers" in out
    status, out, _ = run(capsys, "memory", "--model", "HuggingFaceTB/SmolLM2-135M", "--batch", "2", "--gpu", "T4")
    assert status == 0 and "HuggingFaceTB/SmolLM2-135M, LoRA" in out
    assert "T4 15.83 GB budget, usable 15.33 GB: fits" in out


@pytest.mark.parametrize(
    "model,why", [("meta-llama/Llama-3.1-8B", "gated or private"), ("nobody/nothing", "not on the Hub")]
)
def test_gated_or_unknown_model_is_one_line_naming_the_presets(capsys, fake_hub, model: str, why: str) -> None:
    status, out, err = run(capsys, "memory", "--model", model)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert why in err and "--config" in err and "smollm2-135m" in err


def test_offline_model_is_one_line_naming_the_presets(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, err = run(capsys, "memory", "--model", "HuggingFaceTB/SmolLM2-135M")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE" in err and "--config" in err and "qwen2.5-1.5b-instruct" in err


def test_unreachable_hub_answers_within_seconds(capsys, monkeypatch) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    status, _, err = run(capsys, "memory", "--model", "HuggingFaceTB/SmolLM2-135M")
    assert status == 2 and "did not answer" in err and "--config" in err


@pytest.mark.parametrize(
    "text,value",
    [
        ("134515008", 134_515_008),
        ("7e9", 7_000_000_000),
        ("1.7B", 1_700_000_000),
        ("135M", 135_000_000),
        ("7_000_000_000", 7_000_000_000),
        ("70b", 70 * 10**9),
    ],
)
def test_param_count(text: str, value: int) -> None:
    assert cli.param_count(text) == value


@pytest.mark.parametrize("text", ["seven", "1.5.2", ""])  # signs and out-of-range counts: through the CLI above
def test_param_count_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        cli.param_count(text)


def test_qlora_step_without_kbit_preparation_is_an_explicit_option(capsys) -> None:
    from course_utils import step_memory

    argv = ("memory", "--config", "smollm2-135m", "--method", "qlora", "--batch", "8", "--seq", "512", "--gpu", "T4")
    status, prepared, _ = run(capsys, *argv)
    assert status == 0 and "k-bit preparation (float32 embedding and norms)" in prepared
    status, skipped, _ = run(capsys, *argv, "--no-kbit-preparation")
    assert status == 0 and "no k-bit preparation" in skipped
    for out, flag in ((prepared, True), (skipped, False)):  # each printout is the estimate of its own recipe
        est = step_memory.estimate_step(
            "smollm2-135m", method="qlora", batch=8, seq=512, device="cuda", kbit_preparation=flag, capability=(7, 5)
        )  # the T4's attention kernel
        assert f"total (predicted peak) {est.peak_gb:.2f} GB".split() == next(
            line.split() for line in out.splitlines() if "total (predicted peak)" in line
        )
    status, _, err = run(capsys, "memory", "--config", "smollm2-135m", "--batch", "2", "--no-kbit-preparation")
    assert status == 2 and "--no-kbit-preparation: only for --method qlora" in err


# ---------------------------------------------------------------- --timeline: when the peak comes
#: Llama-family, tiny: a measured timeline of it takes seconds.
TINY_TIMELINE = {**tiny_models.TINY, "vocab_size": 4096}


def test_timeline_draws_the_prediction_and_names_its_peak(capsys, tmp_path) -> None:
    from course_utils.timeline import predicted_timeline

    out_png = tmp_path / "t.png"
    status, out, err = run(
        capsys, "memory", "--config", "smollm2-135m", "--batch", "8", "--seq", "64", "--timeline", str(out_png)
    )
    assert status == 0, err
    est = step_memory.estimate_step("smollm2-135m", batch=8, seq=64)
    peak = predicted_timeline(est).peak
    assert (
        f"predicted timeline: peak {(peak.total - peak.by_kind['framework']) / 1e9:.2f} GB of tensors in the "
        f"backward phase ({est.peak_moment})" in out
    )
    assert out_png.read_bytes()[:4] == b"\x89PNG" and "measured timeline" not in out
    status, out, err = run(capsys, "memory", "--config", "smollm2-135m", "--batch", "2", "--timeline", "t.txt")
    assert status == 2 and out == "" and "argument --timeline:" in err and ".png" in err  # before any estimate


def test_timeline_with_measure_prints_both_peaks(capsys, monkeypatch, tmp_path) -> None:
    """A real profiled step of a tiny model, run in this process: the child process a CPU gets (a second import of
    torch and transformers, most of the cost) is tests/test_timeline_measure.py's. The measured step itself is a fake
    (its real run: tests/test_measure.py), so its printed comparison is known."""
    from course_utils import children, measure

    def in_this_process(function: str, payload, timeout_s: float):  # children.call, without the child
        module, name = function.split(":")
        answer = getattr(importlib.import_module(module), name)(json.loads(json.dumps(payload)))
        return json.loads(json.dumps(answer))

    @functools.wraps(measure.measure_training_step)  # its signature: step_spec reads the arguments it allows
    def fake_step(config, **step):
        return measure.StepMeasurement(10**9, 0, 0, 0, 0, 0, 1.0, "cpu", "CPU: a fake step")

    monkeypatch.setattr(children, "call", in_this_process)
    monkeypatch.setattr(measure, "measure_training_step", fake_step)
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY_TIMELINE))
    step = ["--config", str(config), "--method", "full", "--batch", "2", "--seq", "64"]
    status, out, err = run(capsys, "memory", *step, "--timeline", str(tmp_path / "t.svg"), "--measure")
    assert status == 0, err
    peaks = [line for line in out.splitlines() if line.endswith(")") and " timeline: peak " in line]
    assert [line.split()[0] for line in peaks] == ["predicted", "measured"]
    assert all(" in the backward phase " in line for line in peaks)  # the same phase, measured and predicted
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")
    est = step_memory.estimate_step(str(config), method="full", batch=2, seq=64)  # the CPU estimate, like with like
    assert out.splitlines()[-2:] == ["measured: CPU: a fake step", step_memory.comparison_line(est.peak_bytes, 1e9)]


# ---------------------------------------------------------------- a library that is not installed
def test_measure_without_torch_is_one_line_naming_what_to_install() -> None:
    """torch is not a dependency of the package: --measure without it says what to install, exit status 2."""
    code = (
        "import sys; sys.modules['torch'] = None; from course_utils.cli import main; "
        "sys.exit(main(['memory', '--config', 'smollm2-135m', '--batch', '2', '--measure']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.endswith(
        ": error: argument --measure: needs torch, which is not installed here (pip install torch)\n"
    )
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("option", ["--config", "--model"])
def test_a_missing_library_blames_the_option_the_architecture_came_from(
    capsys, monkeypatch, fake_hub, tmp_path, option: str
) -> None:
    """An architecture outside the arithmetic (Gemma) is counted with torch and transformers on the meta device."""
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(GEMMA))
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    status, out, err = run(capsys, "memory", option, str(path) if option == "--config" else "google/gemma-tiny")
    assert status == 2 and out == ""
    assert err == (
        f"{cli.build_parser().prog} memory: error: argument {option}: needs torch, which is not installed "
        "here (pip install torch)\n"
    )
