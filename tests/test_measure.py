"""course_utils.measure: peak memory of a piece of work, and a measured training step on a tiny config."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

from course_utils import measure, training_step
from course_utils.measure import StepMeasurement, measure_training_step
from course_utils.peak import measure_peak, track_peak
from course_utils.quiet import import_bitsandbytes, quiet_libraries

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: A tiny config of SmolLM2's family (Llama: SwiGLU, RMSNorm, grouped-query attention, tied embeddings).
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "_source": "a tiny test config", "torch_dtype": "bfloat16"}
#: q, o: 64x64; k, v: 64x32 (2 of 4 heads); MLP 3 x 64x128; two norms per layer; final norm; tied embedding
TINY_PARAMS = 512 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64


@pytest.fixture(scope="module")
def full_step() -> StepMeasurement:
    return measure_training_step(TINY, method="full", batch=2, seq=16, timeout_s=120)


def test_full_step_counts_exactly(full_step: StepMeasurement) -> None:
    m = full_step
    assert m.total_params == TINY_PARAMS
    assert m.trained_params == TINY_PARAMS
    buffer = 8 * 4  # rotary inv_freq: head_dim/2 = 8 float32 numbers; transformers 5 keeps an original copy too
    assert m.weights_bytes - 4 * TINY_PARAMS in (buffer, 2 * buffer)
    assert m.grads_bytes == 4 * TINY_PARAMS
    n_tensors = 1 + 2 * 9 + 1  # embedding, 9 per layer (7 matrices, 2 norms), the final norm
    assert m.optimizer_bytes == 8 * TINY_PARAMS + 4 * n_tensors  # two float32 states + a float32 step count each
    assert m.saved_activations_bytes > 0
    assert m.peak_bytes > m.baseline_bytes > 0
    assert m.step_seconds > 0 and m.first_step_seconds > 0
    assert m.device == "cpu" and "fresh child process" in m.what
    assert m.steps == 1 and m.autocast is None and m.compile_seconds is None


def test_lora_step_trains_only_adapters() -> None:
    if not training_step.adamw8bit_available("cpu"):
        pytest.skip("this bitsandbytes has no 8-bit AdamW for the CPU (0.49+ has)")
    m = measure_training_step(TINY, method="lora", batch=1, seq=8, lora_rank=4, optimizer="adamw8bit",
                              timeout_s=120)
    # per layer: A (rank x 64) and B (out x rank) for q (64 -> 64) and v (64 -> 32)
    assert m.trained_params == 2 * ((64 * 4 + 4 * 64) + (64 * 4 + 4 * 32))
    assert m.grads_bytes == 4 * m.trained_params
    # 8-bit AdamW keeps float32 states for tensors under 4096 numbers: these adapters are all that small
    assert m.optimizer_bytes >= 8 * m.trained_params


def test_full_bf16_model_and_adamw_states_are_bfloat16() -> None:
    """Pure bf16: every parameter bfloat16 and trainable; torch AdamW keeps exp_avg and exp_avg_sq in bfloat16."""
    spec = {"config": TINY, "method": "full-bf16", "lora_rank": 8, "targets": ["q_proj"], "seed": 0,
            "optimizer": "adamw"}  # the config says bfloat16 too, but build_model sets the dtype itself
    model = training_step.build_model(spec, torch.device("cpu"))
    params = list(model.parameters())
    assert all(p.dtype == torch.bfloat16 and p.requires_grad for p in params)
    assert sum(p.numel() for p in params) == TINY_PARAMS
    opt = training_step._make_optimizer(spec, params)
    ids = torch.randint(0, 512, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad.dtype == torch.bfloat16 for p in params)
    opt.step()
    states = list(opt.state.values())
    assert {st["exp_avg"].dtype for st in states} == {st["exp_avg_sq"].dtype for st in states} == {torch.bfloat16}
    state_bytes = training_step._unique_nbytes(v for st in states for v in st.values())
    assert state_bytes == 4 * TINY_PARAMS + 4 * len(states)  # + the step counts


@pytest.mark.skipif(import_bitsandbytes() is None, reason="QLoRA's 4-bit layers need bitsandbytes, not installed here")
@pytest.mark.parametrize("kbit_preparation, checkpointing", [(True, True), (True, False), (False, True)])
def test_qlora_model_is_notebook_01bs_recipe(kbit_preparation: bool, checkpointing: bool) -> None:
    """4-bit NF4 load, peft's k-bit preparation (float32 embedding and norms) unless switched off, then LoRA."""
    spec = measure.step_spec(TINY, method="qlora", lora_rank=4, checkpointing=checkpointing,
                             kbit_preparation=kbit_preparation)
    with quiet_libraries():
        model = training_step.build_model(spec, torch.device("cpu"))
    rest = torch.float32 if kbit_preparation else torch.bfloat16
    named = dict(model.named_parameters())
    assert {p.dtype for n, p in named.items() if "norm" in n or "embed_tokens" in n} == {rest}
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}
    assert all(p.requires_grad == ("lora_" in n) for n, p in named.items())
    assert sum(isinstance(m, import_bitsandbytes().nn.Linear4bit) for m in model.modules()) == 2 * 7
    assert any(training_step._is_checkpointed_layer(m) for m in model.modules()) is checkpointing
    # the hidden states and the logits take the embedding's dtype: 4-bit layers cast their output back to their input's
    ids = torch.randint(0, 512, (2, 8))
    out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    assert {h.dtype for h in out.hidden_states} == {out.logits.dtype} == {rest}
    out.loss.backward()
    assert all(p.grad is not None for n, p in named.items() if "lora_" in n)


def test_measurement_round_trips_through_a_dict() -> None:
    m = StepMeasurement(1, 2, 3, 4, 5, 6, 0.5, "cpu", "a test", extra={"base_dtype": "float32"})
    again = StepMeasurement(**m.to_dict())
    assert again == m and again.peak_gb == 1e-9


@pytest.mark.parametrize("kwargs, name", [
    ({"method": "half"}, "method"), ({"batch": 0}, "batch"), ({"seq": -1}, "seq"),
    ({"lora_rank": 0}, "lora_rank"), ({"optimizer": "sgd"}, "optimizer"), ({"autocast": "int8"}, "autocast"),
    ({"steps": 0}, "steps"), ({"targets": []}, "targets"), ({"timeout_s": 0}, "timeout_s"),
    ({"seq": 10_000}, "seq"), ({"autocast": "fp16"}, "autocast"), ({"accumulation": 0}, "accumulation"),
])
def test_bad_input_names_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        measure_training_step(TINY, **kwargs)


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="config"):
        measure_training_step("no-such-preset")
    with pytest.raises(ValueError, match="config"):
        measure_training_step({"hidden_size": 3})
    with pytest.raises(TypeError, match="config"):
        measure_training_step(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch"):
        measure_training_step(TINY, batch=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kbit_preparation"):
        measure_training_step(TINY, method="qlora", kbit_preparation="no")  # type: ignore[arg-type]


def test_spec_reads_a_preset_without_notes_or_dtype() -> None:
    spec = measure.step_spec("smollm2-135m", batch=1, seq=8, targets="q_proj,v_proj")
    cfg = spec["config"]
    assert "_source" not in cfg and "torch_dtype" not in cfg
    assert cfg["hidden_size"] == 576 and cfg["num_hidden_layers"] == 30 and spec["targets"] == ["q_proj", "v_proj"]


def test_timeout_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def too_slow(cmd, env, timeout_s):
        raise subprocess.TimeoutExpired(cmd="x", timeout=timeout_s)

    monkeypatch.setattr(measure, "_run_bounded", too_slow)
    with pytest.raises(TimeoutError, match="timeout_s=5"):
        measure_training_step(TINY, timeout_s=5)


def test_child_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    monkeypatch.setattr(measure, "_run_bounded",
                        lambda cmd, env, t: subprocess.CompletedProcess(cmd, 1, stdout="", stderr="boom\n"))
    with pytest.raises(RuntimeError, match="boom"):
        measure_training_step(TINY, timeout_s=5)


def test_track_peak_on_cpu_sees_a_big_allocation() -> None:
    def work() -> int:
        big = torch.ones(20_000_000)  # 80 MB
        return int(big.numel())

    result, peak = measure_peak(work, device="cpu")
    assert result == 20_000_000
    assert peak.bytes - peak.start_bytes > 60_000_000, peak
    assert peak.what.startswith("CPU") and peak.device == "cpu" and peak.reserved_bytes is None


def test_track_peak_uses_cuda_counters_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 5_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 8_000)
    with track_peak("cuda") as peak:
        calls.append("work")
    assert calls == ["sync", "reset", "work", "sync"]
    assert (peak.bytes, peak.start_bytes, peak.reserved_bytes) == (5_000, 100, 8_000)
    assert peak.what.startswith("CUDA") and peak.device == "cuda"


def test_cuda_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_sim import simulate

    seen = {}
    simulate(monkeypatch, "A100")
    monkeypatch.setattr(measure, "run_step", lambda spec: seen.setdefault("spec", spec) and {
        "peak_bytes": 1, "baseline_bytes": 0, "weights_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 0,
        "saved_activations_bytes": 0, "step_seconds": 0.1, "device": "cuda", "what": "CUDA"})
    m = measure_training_step(TINY, device="cuda", autocast="fp16")
    assert m.device == "cuda" and seen["spec"]["autocast"] == "float16" and seen["spec"]["device"] == "cuda"


def test_track_peak_rejects_a_bad_device() -> None:
    with pytest.raises(ValueError, match="device"):
        with track_peak("tpu9"):
            pass
    with pytest.raises(TypeError, match="fn"):
        measure_peak(42)  # type: ignore[arg-type]


def test_run_bounded_kills_the_whole_group() -> None:
    import subprocess
    import sys
    import time

    start = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        measure._run_bounded([sys.executable, "-c", "import subprocess, time; "
                              "subprocess.Popen(['sleep', '30']); time.sleep(30)"], dict(os.environ), 1.0)
    assert time.perf_counter() - start < 10
    done = measure._run_bounded([sys.executable, "-c", "print('hi')"], dict(os.environ), 30.0)
    assert done.returncode == 0 and done.stdout.strip() == "hi"


def _library_state() -> tuple:
    import logging
    import warnings

    import transformers

    names = ("bitsandbytes", "peft", "transformers", "accelerate", "torch._inductor", "torch._dynamo", "")
    return (list(warnings.filters), {n: logging.getLogger(n).level for n in names},
            transformers.utils.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled())


def test_quiet_libraries_restores_warnings_and_loggers() -> None:
    import logging
    import warnings

    import transformers

    logging.getLogger("peft").setLevel(logging.INFO)  # a student's own setting must survive
    transformers.utils.logging.set_verbosity_warning()
    try:
        before = _library_state()
        with quiet_libraries():
            assert logging.getLogger("peft").level == logging.ERROR
            assert transformers.utils.logging.get_verbosity() == logging.ERROR
            with warnings.catch_warnings(record=True) as caught:
                warnings.warn("hidden", UserWarning, stacklevel=1)
            assert caught == []  # ignored inside
        assert _library_state() == before
        with pytest.raises(KeyError):  # restored on an error too
            with quiet_libraries():
                raise KeyError("x")
        assert _library_state() == before
    finally:
        logging.getLogger("peft").setLevel(logging.NOTSET)


def test_run_trainer_steps_leaves_the_kernel_as_it_was(tmp_path) -> None:
    from course_utils import tricks

    tiny = {k: v for k, v in TINY.items() if not k.startswith("_") and k != "torch_dtype"}
    args, _ = tricks.memory_efficient_training_arguments(tmp_path, max_steps=1, device="cpu")
    args.gradient_accumulation_steps = 1
    before = _library_state()
    out = tricks.run_trainer_steps(tiny, args, batch_examples=2, seq=8)
    assert out["steps"] == 1 and _library_state() == before


def test_checkpointed_layers_are_found() -> None:
    from transformers.modeling_layers import GradientCheckpointingLayer

    class Layer(GradientCheckpointingLayer):
        pass

    layer, off = Layer(), Layer()
    layer.gradient_checkpointing = True
    assert training_step._is_checkpointed_layer(layer) and not training_step._is_checkpointed_layer(off)
    assert not training_step._is_checkpointed_layer(torch.nn.Linear(2, 2))


def test_checkpointed_step_counts_the_kept_layer_inputs() -> None:
    m = measure_training_step(TINY, method="lora", batch=1, seq=8, checkpointing=True, timeout_s=120)
    assert m.saved_activations_bytes > 0


def test_step_precision_on_a_cpu() -> None:
    from course_utils.training_step import _Precision, _step_precision

    assert _step_precision("full", None, "cpu") == _Precision("float32", None, False)
    assert _step_precision("lora-bf16", None, "cpu") == _Precision("bfloat16", None, False)
    assert _step_precision("qlora", "auto", "cpu") == _Precision("bfloat16", "bfloat16", False)
    assert _step_precision("full", "float16", "cpu").loss_scaling  # on purpose: float16 needs loss scaling


def test_auto_autocast_is_resolved_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    monkeypatch.setattr(measure, "_run_in_child", lambda spec, t: seen.setdefault("spec", spec) and {
        "peak_bytes": 1, "baseline_bytes": 0, "weights_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 0,
        "saved_activations_bytes": 0, "step_seconds": 0.1, "device": "cpu", "what": "CPU"})
    measure_training_step(TINY, autocast="auto", device="cpu")
    assert seen["spec"]["autocast"] == "bfloat16"


def test_adamw8bit_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_step, "adamw8bit_available", lambda device="cpu": False)
    param = torch.nn.Parameter(torch.ones(8))
    with pytest.raises(RuntimeError, match="no 8-bit AdamW for the CPU"):
        training_step._make_optimizer({"optimizer": "adamw8bit"}, [param])
    from course_utils import tricks

    args, changes = tricks.memory_efficient_training_arguments("/tmp/unused-out", max_steps=1, device="cpu")
    assert args.optim.value == "adamw_torch" and any("8-bit AdamW" in c for c in changes)


def test_time_frozen_layer_small() -> None:
    times = measure.time_frozen_layer(32, 48, 16, min_run_time=0.01, device="cpu")
    assert {"float32", "bfloat16"} <= set(times) and all(t > 0 for t in times.values())


def test_frozen_layer_plan_on_a_cpu_uses_bfloat16() -> None:
    plan = measure._frozen_layer_plan("cpu")
    assert [label for label, _, _ in plan] == ["float32", "bfloat16", "4-bit NF4"]
    assert plan[2][2] == torch.bfloat16  # NF4 computes in the device's 16-bit dtype


@pytest.mark.parametrize("kwargs,error,match", [({"tokens": 0}, ValueError, "tokens"),
                                                ({"in_features": 10**6}, ValueError, "in_features"),
                                                ({"out_features": 2.5}, TypeError, "out_features"),
                                                ({"min_run_time": 60}, ValueError, "min_run_time")])
def test_time_frozen_layer_rejects_bad_sizes(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        measure.time_frozen_layer(**kwargs)




def test_several_steps_share_one_child_and_each_is_measured_alone() -> None:
    cases = [{"method": "full", "batch": 2, "seq": 16}, {"method": "lora", "batch": 1, "seq": 8, "lora_rank": 4}]
    full, lora = measure.measure_training_steps(TINY, cases, timeout_s=120, device="cpu")
    alone = measure_training_step(TINY, method="lora", batch=1, seq=8, lora_rank=4, timeout_s=120, device="cpu")
    assert full.trained_params > lora.trained_params == alone.trained_params
    assert lora.weights_bytes == alone.weights_bytes and lora.saved_activations_bytes == alone.saved_activations_bytes
    # a forked process starts from the imports only: its baseline is a fresh process's, not the first case's peak
    assert abs(lora.baseline_bytes - alone.baseline_bytes) < 0.1 * alone.baseline_bytes
    assert lora.baseline_bytes < full.peak_bytes


def test_a_failing_case_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [{"method": "lora", "batch": 1, "seq": 8, "lora_rank": 4, "optimizer": "adamw8bit"},
             {"method": "full", "batch": 1, "seq": 8}]
    monkeypatch.setattr(measure.sys, "platform", "linux")  # the forking child, wherever the test runs
    monkeypatch.setattr(measure, "_run_in_child_lines", lambda args, timeout_s: [
        '{"index": 0, "error": "TimeoutError: past its time limit"}',
        '{"index": 1, "error": "RuntimeError: boom"}'])
    first, second = measure.measure_training_steps(TINY, cases, timeout_s=5, device="cpu")
    assert isinstance(first, measure.Skipped) and first.timed_out and "timeout_s=5" in first.reason
    assert isinstance(second, measure.Skipped) and not second.timed_out and second.reason == "RuntimeError: boom"
    monkeypatch.setattr(measure, "_run_in_child_lines", lambda args, timeout_s: 1 / 0)  # the whole child failed
    assert measure.measure_training_steps(TINY, cases, timeout_s=5, device="cpu") == [
        measure.Skipped("ZeroDivisionError: division by zero")] * 2


def _fake_step(spec: dict) -> dict:
    return StepMeasurement(1, 0, 0, 0, 0, 0, 0.1, spec["device"], "fake", steps=spec["steps"]).to_dict()


def test_an_out_of_memory_case_leaves_nothing_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed case's model and tensors can be freed: the row keeps the error as text, not its traceback."""
    import weakref

    from gpu_sim import simulate

    simulate(monkeypatch, "T4")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    refs = []

    def run_step(spec: dict) -> dict:
        if spec["batch"] == 1:
            return _fake_step(spec)
        model = torch.nn.Linear(8, 8)  # what the step built, held by this frame's locals only
        refs.append(weakref.ref(model))
        activations = torch.ones(10_000_000)  # 40 MB, the tensors an out-of-memory error leaves in the frame
        refs.append(weakref.ref(activations))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(measure, "run_step", run_step)
    failed, done = measure.measure_training_steps(TINY, [{"batch": 8}, {"batch": 1}], device="cuda")
    assert isinstance(failed, measure.Skipped) and failed.reason.startswith("OutOfMemoryError: CUDA out of memory")
    assert len(refs) == 2 and all(ref() is None for ref in refs)  # nothing of the failed case is alive
    assert isinstance(done, StepMeasurement)  # the next case ran


@pytest.mark.parametrize("where", ["cuda", "fork"])
def test_any_error_is_a_skipped_row(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A TypeError (a bug, an incompatible library) is a row too, in this process (CUDA) or in a forked child."""
    from gpu_sim import simulate

    def broken(spec: dict) -> dict:
        if spec["batch"] == 2:
            raise TypeError("unexpected keyword argument 'dtype'")
        return _fake_step(spec)

    monkeypatch.setattr(measure, "run_step", broken)
    cases = [{"batch": 2}, {"batch": 1}]
    if where == "cuda":
        simulate(monkeypatch, "H100")
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        rows = measure.measure_training_steps(TINY, cases, device="cuda")
    else:  # the forking child's own loop, run here on the specs (every fork answers on stdout)
        monkeypatch.setattr(measure.sys, "platform", "linux")
        monkeypatch.setattr(measure, "_run_in_child_lines", lambda args, timeout_s: _forked_lines(args, timeout_s))
        rows = measure.measure_training_steps(TINY, cases, device="cpu", timeout_s=30)
    assert rows[0] == measure.Skipped("TypeError: unexpected keyword argument 'dtype'")
    assert isinstance(rows[1], StepMeasurement)


def _forked_lines(args: list, timeout_s: float) -> list[str]:
    """What ``--many`` prints, with each case run in this process instead of a forked one."""
    import json

    lines = []
    for index, spec in enumerate(json.loads(args[1])):
        try:
            lines.append(json.dumps({"index": index, "result": measure.run_step(spec)}))
        except Exception as err:  # noqa: BLE001 - as _fork_each reports it
            lines.append(json.dumps({"index": index, "error": f"{type(err).__name__}: {err}"}))
    return lines


def test_default_steps_are_3_on_a_gpu_and_1_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_sim import simulate

    seen = []
    monkeypatch.setattr(measure, "run_step", lambda spec: seen.append(spec) or _fake_step(spec))
    monkeypatch.setattr(measure, "_run_in_child", lambda spec, timeout_s: seen.append(spec) or _fake_step(spec))
    assert measure_training_step(TINY, device="cpu").steps == 1
    simulate(monkeypatch, "L4")
    assert measure_training_step(TINY, device="cuda", timeout_s=42).steps == measure.DEFAULT_STEPS["cuda"] == 3
    assert measure_training_step(TINY, device="cuda", steps=5).steps == 5
    assert seen[1]["timeout_s"] == 42  # a step in this process gets its time limit


def test_counting_is_an_extra_untimed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up, the timed steps inside the peak, then one counting step outside it (its hooks cost time)."""
    calls, window = [], []
    real_track, real_run = training_step.track_peak, training_step._Step.run

    @contextlib.contextmanager
    def tracked(dev):
        window.append("open")
        with real_track(dev) as peak:
            yield peak
        window.append("closed")

    def run(self, count: bool) -> None:
        calls.append((count, len(window), window[-1] if window else None))
        real_run(self, count)

    monkeypatch.setattr(training_step, "track_peak", tracked)
    monkeypatch.setattr(training_step._Step, "run", run)
    spec = measure.step_spec(TINY, method="full", batch=1, seq=8, steps=2)
    spec["device"] = "cpu"
    out = training_step.run_step(spec)
    # (count?, windows opened or closed so far, the last of them): warm-up, 2 timed, 1 counting after the peak
    assert calls == [(False, 1, "open"), (False, 3, "open"), (False, 3, "open"), (True, 4, "closed")]
    assert out["steps"] == 2 and out["saved_activations_bytes"] > 0 and out["grads_bytes"] > 0
    assert out["extra"]["attention"] != "unknown"


def test_a_step_in_this_process_stops_at_its_deadline() -> None:
    """Checked between micro-batches (a CUDA kernel cannot be interrupted): past timeout_s, a TimeoutError."""
    spec = measure.step_spec(TINY, method="full", batch=1, seq=8, steps=3, accumulation=2)
    spec.update(device="cpu", timeout_s=1e-6)
    with pytest.raises(TimeoutError, match=r"timeout_s=1e-06 s .*cannot be interrupted"):
        training_step.run_step(spec)
    deadline = training_step._Deadline(None, torch.device("cpu"))
    deadline.check()  # no limit: never raises


def test_the_gpu_is_warmed_up_before_the_first_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_sim import simulate

    assert hasattr(training_step._warm_up_cuda, "cache_info")  # once per process and GPU (functools.cache)
    simulate(monkeypatch, "A100")
    order = []
    monkeypatch.setattr(training_step, "_warm_up_cuda", lambda device: order.append(("warm-up", device)))
    monkeypatch.setattr(training_step, "memory_in_use", lambda dev: order.append(("baseline", str(dev))) or 0)

    def stop(spec, dev):
        raise KeyError("stop here")

    monkeypatch.setattr(training_step, "build_model", stop)
    spec = measure.step_spec(TINY, batch=1, seq=8)
    spec["device"] = "cuda"
    with pytest.raises(KeyError, match="stop here"):
        training_step.run_step(spec)
    assert order == [("warm-up", "cuda"), ("baseline", "cuda")]


def test_without_peft_full_tuning_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """peft is imported for every method only where it is installed: a machine with torch and transformers alone
    still measures full tuning."""
    import builtins
    import sys

    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "peft", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_peft)
    spec = measure.step_spec(TINY, method="full", batch=1, seq=8, steps=1)
    spec["device"] = "cpu"
    assert training_step.run_step(spec)["trained_params"] == TINY_PARAMS


def test_a_compiled_case_gets_a_child_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def child(spec: dict, timeout_s: float) -> dict:
        seen.append((spec["compile"], timeout_s))
        return StepMeasurement(1, 0, 0, 0, 0, 0, 0.1, "cpu", "CPU").to_dict()

    monkeypatch.setattr(measure, "_run_forked_children", lambda specs, t: pytest.fail("a compiled case was forked"))
    monkeypatch.setattr(measure, "_run_in_child", child)
    out = measure.measure_training_steps(TINY, [{"compile": True}, {"method": "full"}], timeout_s=9, device="cpu")
    assert seen == [(True, 9), (False, 9)] and all(isinstance(m, StepMeasurement) for m in out)


@pytest.mark.parametrize("cases,match", [([], "at least one"), ([{"batchsize": 2}], "unknown argument")])
def test_several_steps_reject_bad_cases(cases, match) -> None:
    with pytest.raises(ValueError, match=match):
        measure.measure_training_steps(TINY, cases, device="cpu")
