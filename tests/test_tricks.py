"""course_utils.tricks (trick_claims, trick_runs, trick_verdicts, training_arguments, trainer_demo), as notebook 05
reads it, and the bottleneck planner's text."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from course_utils import trick_claims, trick_runs, training_arguments, tricks
from course_utils.bottleneck import what_is_my_bottleneck
from course_utils.tricks import TrickResult, trick_kwargs, verdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": True,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}


def test_comparison_table_has_a_row_per_technique() -> None:
    table = tricks.comparison_table()
    assert table.startswith("| Technique | What changes? | Main benefit | Main trade-off |")
    assert table.count("\n") == 1 + len(trick_claims.COMPARISON)


def test_seed_claims() -> None:
    assert tricks.TRICKS["checkpointing"].claim == "~50 % memory reduction at ~30 % speed cost"
    seed = training_arguments.LESSON_TRAINING_ARGUMENTS
    assert seed["optim"] == "adamw_8bit" and seed["gradient_accumulation_steps"] == 8
    assert seed["per_device_train_batch_size"] == 2 and seed["warmup_ratio"] == 0.03 and seed["torch_compile"] is False


def test_trick_kwargs() -> None:
    base = {"method": "full", "batch": 8, "seq": 128}
    assert trick_kwargs("baseline", base) == base
    assert trick_kwargs("checkpointing", base)["checkpointing"] is True
    acc = trick_kwargs("accumulation", base)
    assert acc["batch"] == 2 and acc["accumulation"] == 4
    with pytest.raises(ValueError, match="trick"):
        trick_kwargs("magic", base)
    with pytest.raises(ValueError, match="batch"):
        trick_kwargs("accumulation", {**base, "batch": 6})


def _row(key: str, peak: float, secs: float, **kw) -> TrickResult:
    return TrickResult(
        key, tricks.TRICKS[key].label, tricks.TRICKS[key].claim, peak_bytes=int(peak * 1e9), step_seconds=secs, **kw
    )


def test_a_verdict_gives_no_cause_that_nothing_measured_shows() -> None:
    """The peak fell by 3 %, below every trick's claim: with nothing counted and no estimate, no cause is given."""
    bare = _row("baseline", 3.0, 10.0)
    said = {
        "bf16": " (bfloat16 autocast)",
        "accumulation": " for the same examples per optimizer step, as 4 micro-batches",
    }
    for key in ("checkpointing", "bf16", "adamw8bit", "accumulation"):
        assert verdict(_row(key, 2.91, 12.0), bare) == "peak -3 %, step time +20 %" + said.get(key, "")


def test_verdicts_report_what_was_counted_and_the_causes_it_shows() -> None:
    base = _row("baseline", 3.0, 10.0, saved_activations_bytes=int(0.6e9), optimizer_bytes=8_000, trained_params=1000)
    ck = verdict(_row("checkpointing", 2.6, 13.0, saved_activations_bytes=int(0.1e9)), base)
    assert ck == (
        "peak -13 %, step time +30 %; saved for backward 600.0 MB -> 100.0 MB (counted); not -50 % here: "
        "checkpointing removes saved activations, and they were 20 % of the baseline peak"
    )
    assert "not -50 %" not in verdict(_row("checkpointing", 1.4, 13.0, saved_activations_bytes=1), base)
    eight = verdict(_row("adamw8bit", 2.5, 12.0, optimizer_bytes=2_100, trained_params=1000), base)
    assert eight == "peak -17 %, step time +20 %; optimizer states 8.00 -> 2.10 bytes per trained number (counted)"
    comp = verdict(_row("compile", 3.0, 9.5, compile_seconds=40.0), base)
    assert comp == "peak +0 %, step time -5 % (1.05x speed); compile 40 s once; no 1.2-1.5x here"
    assert "no 1.2-1.5x" not in verdict(_row("compile", 3.0, 7.0, compile_seconds=40.0), base)
    skipped = TrickResult("compile", "torch.compile", "", skipped="skipped: did not finish within its 5 s budget")
    assert verdict(skipped, base).startswith("skipped") and verdict(base, base) == "reference"


def test_the_16bit_copies_are_named_only_where_the_estimate_matches_the_count() -> None:
    base = _row("baseline", 1.0, 2.0, saved_activations_bytes=int(0.22e9))
    parts = {"bf16 weight copies (autocast)": 38_000_000, "logits path (log-softmax, float32)": 34_000_000}
    parts["norms"] = 130_000_000
    ran = SimpleNamespace(autocast="bfloat16")
    matched = _row("bf16", 0.98, 1.8, saved_activations_bytes=202_000_000, estimate_saved=parts, measurement=ran)
    text = verdict(matched, base)
    assert text.startswith("peak -2 %, step time -10 % (bfloat16 autocast); saved for backward 220.0 MB -> 202.0 MB")
    assert "of the bytes saved, 38.0 MB are bfloat16 copies of the weights" in text and "34.0 MB the loss's" in text
    off = _row("bf16", 0.98, 1.8, saved_activations_bytes=250_000_000, estimate_saved=parts, measurement=ran)
    assert "copies" not in verdict(off, base)  # the estimate's parts do not add up to what was counted
    halved = _row("bf16", 0.7, 1.8, saved_activations_bytes=202_000_000, estimate_saved=parts, measurement=ran)
    assert "copies" not in verdict(halved, base)  # the peak fell: nothing to explain


def test_the_optimizer_scratch_is_named_only_where_the_estimate_puts_the_peak_there() -> None:
    base = _row("baseline", 1.0, 2.0, optimizer_bytes=8_000, trained_params=1000, device="cpu")
    kw = {"optimizer_bytes": 2_100, "trained_params": 1000, "estimate_bytes": 990_000_000}
    there = _row("adamw8bit", 0.97, 2.4, estimate_moment="optimizer step", device="cpu", **kw)
    assert "The peak comes at the optimizer step" in verdict(there, base) and "5 float32 copies" in verdict(there, base)
    for row in (
        _row("adamw8bit", 0.97, 2.4, estimate_moment="start of backward (loss gradient)", device="cpu", **kw),
        _row("adamw8bit", 0.97, 2.4, estimate_moment="optimizer step", device="cuda:0", **kw),  # a fused kernel
        _row("adamw8bit", 0.8, 2.4, estimate_moment="optimizer step", device="cpu", **kw),  # the estimate is off
    ):
        assert verdict(row, base).endswith("bytes per trained number (counted)")


def test_accumulation_names_the_kept_gradients_where_they_were_counted() -> None:
    base = _row("baseline", 1.0, 3.0, saved_activations_bytes=int(0.2e9))
    fell = verdict(_row("accumulation", 0.86, 4.0, saved_activations_bytes=int(0.05e9)), base)
    assert fell == (
        "peak -14 %, step time +33 % for the same examples per optimizer step, as 4 micro-batches; "
        "saved per micro-batch 200.0 MB -> 50.0 MB (counted)"
    )
    kept = _row("accumulation", 0.99, 3.0, measurement=SimpleNamespace(grads_bytes=76_000_000))
    assert verdict(kept, base).endswith(
        ". The peak did not fall: the gradients (76.0 MB, counted) stay from one micro-batch to the next"
    )
    assert "did not fall" not in verdict(_row("accumulation", 0.99, 3.0), base)  # no gradients counted


def test_bottleneck_fits() -> None:
    diag = what_is_my_bottleneck("smollm2-135m", "lora", 8, 16.0, seq=512)
    assert diag.fits and "It fits" in diag.text()


def test_bottleneck_names_the_problem_and_the_fix() -> None:
    diag = what_is_my_bottleneck("smollm2-135m", "full", 16, 8.0, seq=512)
    assert not diag.fits
    text = diag.text()
    assert "does not fit" in text and "activations saved for backward" in text
    first = next(o for o in diag.options if o.fits)  # checkpointing alone is tight (94 % of 7.5 GB usable)
    assert not first.method_changed and first.peak_gb <= 0.9 * 7.5
    # float32 with grouped-query heads: math attention keeps the s x s scores, so 8 micro-batches of 2 are needed
    assert first.changes == ("micro-batch 2 x 8 accumulation steps",) and first.time_factor == pytest.approx(1.0)
    assert all(o.fits for o in diag.options[: sum(o.fits for o in diag.options)])


def test_bottleneck_accumulation_time_is_a_floor_not_a_promise() -> None:
    # 2 x 8 accumulation does the same arithmetic in more, smaller steps: the planner must not print "time x1.00"
    # as if it were free (notebook 05 measures it), but the arithmetic factor as a floor, and say to measure it
    diag = what_is_my_bottleneck("smollm2-135m", "full", 16, 8.0, seq=512)
    acc = next(o for o in diag.options if o.fits and o.micro_batches > 1)
    assert acc.changes == ("micro-batch 2 x 8 accumulation steps",)
    assert acc.time_text() == "time x1.00 or more" and "measure" in acc.cost and "8 smaller steps" in acc.cost
    text = diag.text()
    assert "time x1.00 or more" in text and "time x1.00 (" not in text
    ck = next(o for o in diag.options if o.changes == ("gradient checkpointing",))
    assert ck.micro_batches == 1 and ck.time_text() == "time x1.33"
    assert all(o.time_text().endswith(" or more") == (o.micro_batches > 1) for o in diag.options)


def test_arithmetic_time_factor() -> None:
    from course_utils.bottleneck import arithmetic_time_factor

    assert arithmetic_time_factor("full", "full", False, True) == pytest.approx(4 / 3)  # one extra forward
    assert arithmetic_time_factor("lora", "lora", False, True) == pytest.approx(3 / 2)
    assert arithmetic_time_factor("full", "lora") == pytest.approx(2 / 3)
    assert arithmetic_time_factor("full", "full") == 1.0


def test_notebook_05_checkpointing_claims() -> None:
    # 05's knowledge check: on the miniature (CPU) checkpointing saves far less than "~50 %"; on the whole model at
    # batch 8 x 512 (GPU) it more than halves the peak
    from course_utils.configs import read_config

    mini = read_config("smollm2-135m")
    mini.update(num_hidden_layers=4, vocab_size=8192)
    base, at_scale = {"method": "full", "batch": 4, "seq": 256}, {"method": "full", "batch": 8, "seq": 512}
    before, after = (
        tricks.estimate_step_for(trick_kwargs(k, base), mini, "cpu").peak_bytes for k in ("baseline", "checkpointing")
    )
    assert 0.05 < 1 - after / before < 0.25
    before, after = (
        tricks.estimate_step_for(trick_kwargs(k, at_scale), "smollm2-135m", "cuda").peak_bytes
        for k in ("baseline", "checkpointing")
    )
    assert after < before / 2


def test_bottleneck_bad_budget() -> None:
    with pytest.raises(ValueError, match="budget_gb"):
        what_is_my_bottleneck("smollm2-135m", "full", 8, 0)
    with pytest.raises(ValueError, match="method"):
        what_is_my_bottleneck("smollm2-135m", "half", 8, 16)
    with pytest.raises(ValueError, match="method"):
        what_is_my_bottleneck("smollm2-135m", "full-bf16", 8, 16)  # not one the planner moves between
    with pytest.raises(TypeError, match="checkpointing"):
        what_is_my_bottleneck("smollm2-135m", "full", 8, 16, checkpointing=1)


def test_training_arguments_for_this_machine(tmp_path) -> None:
    args, changes = tricks.memory_efficient_training_arguments(tmp_path, max_steps=2, device="cpu")
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 8
    # bitsandbytes before 0.49 has no CPU 8-bit AdamW: the helper then falls back to torch's AdamW (and says so)
    from course_utils.step_model import adamw8bit_available

    expected_optim = "adamw_8bit" if adamw8bit_available("cpu") else "adamw_torch"
    assert tricks.checkpointing_enabled(args) and args.optim.value == expected_optim and args.torch_compile is False
    # an integer warm-up count (3 % of 2 steps, rounded up) means the same in transformers 4 and 5
    assert args.warmup_steps == 1 and isinstance(args.warmup_steps, int) and args.max_steps == 2 and args.disable_tqdm
    assert args.fp16 is False and args.use_cpu
    assert any("warmup_ratio" in c for c in changes) and any("use_cpu" in c for c in changes)
    with pytest.raises(ValueError, match="max_steps"):
        tricks.memory_efficient_training_arguments(tmp_path, max_steps=0)
    with pytest.raises(TypeError, match="max_steps"):
        tricks.memory_efficient_training_arguments(tmp_path, max_steps=2.5)


@pytest.mark.parametrize(
    "fields, expect",
    [
        ({"warmup_ratio", "warmup_steps", "gradient_checkpointing"}, {"warmup_ratio": 0.03}),  # transformers 4
        ({"warmup_steps", "gradient_checkpointing", "activation_checkpointing"}, {"warmup_steps": 0.03}),  # 5
    ],
)
def test_warmup_without_max_steps_uses_the_installed_spelling(tmp_path, fields, expect) -> None:
    kwargs, _ = tricks.training_arguments_plan(tmp_path, device="cpu", fields=fields)
    assert {k: kwargs[k] for k in expect} == expect
    assert ("activation_checkpointing" in kwargs) == ("activation_checkpointing" in fields)
    assert ("gradient_checkpointing" in kwargs) != ("activation_checkpointing" in fields)
    assert not {"warmup_ratio", "activation_checkpointing"} & (set(kwargs) - fields)


def test_warmup_count_from_max_steps(tmp_path) -> None:
    for steps, count in ((1, 1), (2, 1), (100, 3), (101, 4)):
        kwargs, _ = tricks.training_arguments_plan(tmp_path, max_steps=steps, device="cpu", fields={"warmup_steps"})
        assert kwargs["warmup_steps"] == count and "warmup_ratio" not in kwargs
    kwargs, changes = tricks.training_arguments_plan(
        tmp_path, device="cpu", bitsandbytes=False, cpu_bf16=False, fields={"warmup_steps"}
    )
    assert kwargs["optim"] == "adamw_torch" and kwargs["bf16"] is False
    changed = {c.split("=")[0] for c in changes}
    assert changed == {"optim", "report_to", "warmup_steps", "bf16", "use_cpu", "disable_tqdm"}


def test_trainer_runs_a_few_steps(tmp_path) -> None:
    args, _ = tricks.memory_efficient_training_arguments(tmp_path, max_steps=2, device="cpu")
    args.gradient_accumulation_steps = 2
    out = tricks.run_trainer_steps(TINY, args, batch_examples=8, seq=16)
    assert out["steps"] == 2 and len(out["losses"]) == 2
    assert all(6.0 < loss < 7.5 for loss in out["losses"])  # ln(1000) = 6.9 for random weights
    assert out["peak"].bytes > 0


def test_compile_on_a_cpu_is_skipped_unless_asked(monkeypatch) -> None:
    from course_utils import measure

    calls = []
    monkeypatch.setattr(measure, "measure_training_steps", lambda *a, **k: calls.append(k) or None)
    (row,) = tricks.measure_tricks("smollm2-135m", {"method": "full", "batch": 4, "seq": 64}, ["compile"], device="cpu")
    assert calls == [] and row.skipped.startswith("skipped on a CPU") and "compile_on_cpu=True" in row.skipped
    assert row.estimate_bytes is not None  # the estimate is still there


# --------------------------------------------------------------------------------------------
# On a GPU (simulated): in-process measuring, errors as rows, GPU wording, times, the Trainer's trackers
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["T4", "H100"])
def test_a_failing_case_on_a_gpu_becomes_a_skipped_row(monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    """On CUDA the steps run in this process: an out-of-memory error in one case must not stop the others."""
    import torch
    from gpu_sim import simulate

    from course_utils import measure

    simulate(monkeypatch, profile)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    done = []

    def run_step(spec):
        if spec.get("checkpointing"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if spec["autocast"]:  # any error is a row: a bug or an incompatible library must not stop the others
            raise TypeError("autocast() got an unexpected keyword argument 'cache_enabled'")
        done.append(spec)
        return {
            "peak_bytes": 10**9,
            "baseline_bytes": 0,
            "weights_bytes": 1,
            "grads_bytes": 1,
            "optimizer_bytes": 1,
            "saved_activations_bytes": 1,
            "step_seconds": 0.004,
            "device": "cuda:0",
            "what": "CUDA",
            "trained_params": 1,
        }

    monkeypatch.setattr(measure, "run_step", run_step)
    rows = tricks.measure_tricks(
        TINY,
        {"method": "full", "batch": 4, "seq": 32},
        ["baseline", "checkpointing", "bf16", "accumulation"],
        device="cuda",
    )
    assert [r.skipped is None for r in rows] == [True, False, False, True] and len(done) == 2
    assert rows[1].skipped.startswith("skipped: the step failed") and "out of memory" in rows[1].skipped
    assert rows[2].skipped == (
        "skipped: the step failed (TypeError: autocast() got an unexpected keyword argument 'cache_enabled')"
    )
    assert {r.estimate_attention for r in rows} <= {"flash", "efficient", "cudnn", "math"}  # the estimate's backend
    lines = tricks.results_text(rows).splitlines()
    assert "  4.0 ms  reference" in lines[1] and "  -  skipped: the step failed" in lines[2]  # never "0.0 s"


@pytest.mark.parametrize("profile", ["T4", "L4", "A100", "H100", "CPU"])
def test_no_tracker_on_any_device(monkeypatch: pytest.MonkeyPatch, tmp_path, profile: str) -> None:
    """transformers 4 reports to every tracker it finds by default; Colab ships wandb (a login prompt)."""
    from gpu_sim import simulate

    simulate(monkeypatch, profile)
    kwargs, changes = tricks.training_arguments_plan(tmp_path, max_steps=2)
    assert kwargs["report_to"] == "none" and any(c.startswith("report_to='none'") for c in changes)


def test_compile_gets_minutes_on_a_gpu() -> None:
    import inspect

    limit = inspect.signature(tricks.measure_tricks).parameters["compile_timeout_s"].default
    assert limit == tricks.COMPILE_TIMEOUT_S >= 300  # imports, CUDA start and Inductor on 2 vCPUs


# --------------------------------------------------------------------------------------------
# Notebook 05's compact table, the CPU's 16-bit check, and what a step keeps for backward
# --------------------------------------------------------------------------------------------
def test_results_text_is_one_compact_table() -> None:
    base = _row("baseline", 1.0, 2.5, estimate_bytes=int(1.0e9))
    ck = _row("checkpointing", 0.84, 3.1, estimate_bytes=int(0.83e9))
    slow = TrickResult(
        "bf16",
        tricks.TRICKS["bf16"].label,
        "",
        estimate_bytes=int(0.98e9),
        skipped="skipped on this CPU: it has no bfloat16 instructions",
    )
    comp = TrickResult("compile", "torch.compile", "", skipped="skipped on a CPU: compiling takes minutes here")
    late = TrickResult(
        "adamw8bit",
        tricks.TRICKS["adamw8bit"].label,
        "",
        skipped="skipped: did not finish within its 5 s budget on this machine",
    )
    lines = tricks.results_text([base, ck, slow, comp, late]).splitlines()
    assert lines[0].split() == ["trick", "estimate", "GB", "peak", "GB", "step", "time", "vs", "baseline"]
    assert lines[1].endswith("reference") and "2.5 s" in lines[1]
    assert lines[2].endswith("peak -16 %, time +24 %") and "0.83" in lines[2] and "0.84" in lines[2]
    assert lines[3].endswith("skipped: no fast bfloat16 on this CPU") and "0.98" in lines[3]
    assert lines[4].endswith("skipped on a CPU: compiling takes minutes")
    assert lines[5].endswith("skipped: ran out of time")
    width = max(len(r) for r in (base.label, ck.label, slow.label, comp.label, late.label))
    assert all(line[width : width + 2] == "  " for line in lines) and lines[0].index("estimate") == width + 2
    assert tricks.results_table([base, ck])[1] == {"trick": ck.label, "claim": ck.claim, "measured": verdict(ck, base)}
    assert tricks.verdict(ck, None, short=True) == "no baseline to compare with"


@pytest.mark.parametrize(
    "cpuinfo, fast",
    [
        ("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n", True),  # Intel, AMX
        ("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n", False),  # AVX-512 without BF16
        ("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n", False),  # a plain AVX2 laptop
        ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # ARMv8.6 with BF16
    ],
)
def test_cpu_bf16_fast_reads_the_flags(cpuinfo: str, fast: bool) -> None:
    flags = tricks.cpu_flags(cpuinfo)
    assert flags is not None and training_arguments.cpu_bf16_fast(flags) is fast
    assert tricks.cpu_flags("no flags here\n") is None and training_arguments.cpu_bf16_fast(frozenset()) is False


def test_bf16_is_skipped_on_a_cpu_without_bf16_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    from course_utils import measure

    seen = []
    monkeypatch.setattr(trick_runs, "cpu_bf16_fast", lambda flags=None: False)
    monkeypatch.setattr(
        measure,
        "measure_training_steps",
        lambda config, cases, **kw: (
            seen.append(cases) or [measure.Skipped("TimeoutError: past its time limit") for _ in cases]
        ),
    )
    base = {"method": "full", "batch": 4, "seq": 16}
    rows = tricks.measure_tricks(TINY, base, ["baseline", "bf16"], device="cpu", skip_slow_bf16=True)
    assert len(seen[0]) == 1 and "autocast" not in seen[0][0]  # only the baseline was run
    assert rows[1].skipped.startswith("skipped on this CPU") and "skip_slow_bf16=False" in rows[1].skipped
    assert rows[1].estimate_bytes is not None
    seen.clear()
    tricks.measure_tricks(TINY, base, ["baseline", "bf16"], device="cpu")  # the default measures it anyway
    assert len(seen[0]) == 2
    monkeypatch.setattr(trick_runs, "cpu_bf16_fast", lambda flags=None: None)  # flags unknown (macOS): measure it
    seen.clear()
    tricks.measure_tricks(TINY, base, ["baseline", "bf16"], device="cpu", skip_slow_bf16=True)
    assert len(seen[0]) == 2


def test_training_arguments_switch_bf16_off_on_a_cpu_without_it(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(training_arguments, "cpu_bf16_fast", lambda flags=None: False)
    args, _ = tricks.memory_efficient_training_arguments(tmp_path, max_steps=1, device="cpu")
    assert args.bf16 is False
    kwargs, changes = tricks.training_arguments_plan(tmp_path, device="cpu", cpu_bf16=False, fields={"warmup_steps"})
    assert kwargs["bf16"] is False and any(
        c.startswith("bf16=False") and "without bfloat16 instructions" in c for c in changes
    )


def test_saved_for_backward_counts_what_autograd_keeps() -> None:
    import torch

    w = torch.randn(100, requires_grad=True)
    x = torch.randn(100)
    # x * w keeps x (for w's gradient); sigmoid keeps its output: 2 x 400 bytes
    out, kept = tricks.saved_for_backward(lambda: torch.sigmoid(x * w).sum(), [w])
    assert kept == 800 and out.requires_grad
    _, without_x = tricks.saved_for_backward(lambda: torch.sigmoid(x * w).sum(), [x])  # excluded storages
    assert without_x == 400
    with torch.no_grad():
        assert tricks.saved_for_backward(lambda: torch.sigmoid(x * w).sum(), [w])[1] == 0
    # a tensor saved twice (h by mul and by sigmoid's input path) counts once
    h = torch.randn(100, requires_grad=True)
    _, once = tricks.saved_for_backward(lambda: (h * torch.sigmoid(h)).sum(), [])
    assert once == 800  # h and sigmoid(h), 400 bytes each


def test_bottleneck_text_is_short() -> None:
    text = what_is_my_bottleneck("smollm2-135m", "full", 16, 8.0, seq=512).text()
    lines = text.splitlines()
    assert len(lines) == 7 and len(text.split()) < 160  # three options that fit, then the tight one
    assert lines[0].endswith("it does not fit (15.24 GB over)") and "(GPU allocator counter; math attention" in lines[0]
    assert lines[1].startswith("biggest at the peak (start of backward): activations saved for backward 17.90 GB")
    assert lines[-1].startswith("  tight  gradient checkpointing ") and "7.07 GB" in lines[-1]
    assert "(one extra forward" in lines[-1]
    kwame = what_is_my_bottleneck("qwen2.5-1.5b-instruct", "full", 8, 24.0, seq=512).text()
    assert "(one extra forward of every layer; about the same time on a GPU)" in kwame
    assert "(" not in kwame.splitlines()[-1].split("(", 1)[1]  # no unclosed explanation left in a cost
