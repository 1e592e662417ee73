"""course_utils.measure (with step_model, training_step, children and fresh_process): measured training steps of a
tiny config, in this process, in a bounded child, and in processes forked from one child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from course_utils import children, fresh_process, measure, step_model, training_step
from course_utils.measure import StepMeasurement, measure_training_step
from course_utils.quiet import quiet_libraries
import tiny_models

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: A tiny config of SmolLM2's family (Llama: SwiGLU, RMSNorm, grouped-query attention, tied embeddings).
TINY = {
    **tiny_models.TINY,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "_source": "a tiny test config",
    "torch_dtype": "bfloat16",
}
#: q, o: 64x64; k, v: 64x32 (2 of 4 heads); MLP 3 x 64x128; two norms per layer; final norm; tied embedding
TINY_PARAMS = 512 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64


FULL = {"method": "full", "batch": 2, "seq": 16}
#: LoRA rank 4 on q and v, checkpointing on: each checkpointed layer keeps its input only.
LORA = {"method": "lora", "batch": 2, "seq": 8, "lora_rank": 4, "checkpointing": True}
#: The 8-bit optimizer, where this bitsandbytes has one for the CPU (0.49+).
EIGHT_BIT = {"method": "lora", "batch": 1, "seq": 8, "lora_rank": 4, "optimizer": "adamw8bit"}
HAS_8BIT = step_model.adamw8bit_available("cpu")


@pytest.fixture(scope="module")
def forked() -> list[StepMeasurement]:
    """FULL, LORA (and EIGHT_BIT) measured in processes forked from one child, which imported the libraries once."""
    cases = [FULL, LORA, *([EIGHT_BIT] if HAS_8BIT else [])]
    return measure.measure_training_steps(TINY, cases, timeout_s=120, device="cpu")


@pytest.fixture(scope="module")
def alone() -> StepMeasurement:
    """LORA measured alone, in a fresh child process."""
    return measure_training_step(TINY, **LORA, timeout_s=120, device="cpu")


def test_full_step_counts_exactly(forked: list[StepMeasurement]) -> None:
    m = forked[0]
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


@pytest.mark.skipif(not HAS_8BIT, reason="this bitsandbytes has no 8-bit AdamW for the CPU (0.49+ has)")
def test_lora_step_trains_only_adapters(forked: list[StepMeasurement]) -> None:
    m = forked[2]
    # per layer: A (rank x 64) and B (out x rank) for q (64 -> 64) and v (64 -> 32)
    assert m.trained_params == 2 * ((64 * 4 + 4 * 64) + (64 * 4 + 4 * 32))
    assert m.grads_bytes == 4 * m.trained_params
    # 8-bit AdamW keeps float32 states for tensors under 4096 numbers: these adapters are all that small
    assert m.optimizer_bytes >= 8 * m.trained_params


def test_measurement_round_trips_through_a_dict() -> None:
    m = StepMeasurement(1, 2, 3, 4, 5, 6, 0.5, "cpu", "a test", extra={"base_dtype": "float32"})
    again = StepMeasurement(**m.to_dict())
    assert again == m and again.extra == {"base_dtype": "float32"}


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"method": "half"}, "method"),
        ({"batch": 0}, "batch"),
        ({"seq": -1}, "seq"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"autocast": "int8"}, "autocast"),
        ({"steps": 0}, "steps"),
        ({"targets": []}, "targets"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"seq": 10_000}, "seq"),
        ({"autocast": "fp16"}, "autocast"),
        ({"accumulation": 0}, "accumulation"),
    ],
)
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
    def too_slow(cmd, env, timeout_s):
        raise subprocess.TimeoutExpired(cmd="x", timeout=timeout_s)

    monkeypatch.setattr(children, "run_bounded", too_slow)
    with pytest.raises(TimeoutError, match="timeout_s=5"):
        measure_training_step(TINY, timeout_s=5)


def test_child_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        children, "run_bounded", lambda cmd, env, t: subprocess.CompletedProcess(cmd, 1, stdout="", stderr="boom\n")
    )
    with pytest.raises(RuntimeError, match="boom"):
        measure_training_step(TINY, timeout_s=5)


def fake_result(device: str) -> dict:
    """What run_step returns, with nothing measured: for tests of what the step was asked to do."""
    bytes_zero = dict.fromkeys(["baseline_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes"], 0)
    return {
        **bytes_zero,
        "peak_bytes": 1,
        "saved_activations_bytes": 0,
        "step_seconds": 0.1,
        "device": device,
        "what": device.upper(),
    }


def test_cuda_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_sim import simulate

    seen = {}
    simulate(monkeypatch, "A100")
    monkeypatch.setattr(measure, "run_step", lambda spec: seen.setdefault("spec", spec) and fake_result("cuda"))
    m = measure_training_step(TINY, device="cuda", autocast="fp16")
    assert m.device == "cuda" and seen["spec"]["autocast"] == "float16" and seen["spec"]["device"] == "cuda"


def test_run_bounded_kills_the_whole_group() -> None:
    import time

    start = time.perf_counter()
    code = "import subprocess, time; print(subprocess.Popen(['sleep', '30']).pid, flush=True); time.sleep(30)"
    with pytest.raises(subprocess.TimeoutExpired):
        children.run_bounded([sys.executable, "-c", code], dict(os.environ), 1.0)
    assert time.perf_counter() - start < 10
    done = children.run_bounded([sys.executable, "-c", "print('hi')"], dict(os.environ), 30.0)
    assert done.returncode == 0 and done.stdout.strip() == "hi"


def test_a_child_calls_a_function_and_says_what_it_raised() -> None:
    assert children.call("math:fsum", [0.1] * 10, timeout_s=60) == 1.0
    with pytest.raises(RuntimeError, match="^ValueError: math domain error$"):
        children.call("math:sqrt", -1, timeout_s=60)


def test_forked_processes_answer_each_payload_and_are_stopped_past_their_time() -> None:
    """One child, a process forked per payload: the second sleeps past its 1 s and is stopped; the others answer."""
    answers = children.call_each("time:sleep", [0, 30, "a"], timeout_s=1, prepare="gc:collect")
    assert answers[0] == {"result": None}
    assert answers[1]["error"].startswith("TimeoutError: ") and "timeout_s=1 s" in answers[1]["error"]
    assert answers[2]["error"].startswith("TypeError")


def test_a_forked_process_maps_back_the_library_pages_of_its_parent() -> None:
    """fork() leaves out the library pages this process holds: a forked process reads less resident memory until it
    touches them again, and then holds what this process held (within 10 %)."""
    from course_utils.peak import memory_in_use

    cpu = torch.device("cpu")
    pages = fresh_process.resident_file_pages()
    before = memory_in_use(cpu)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked process: its resident memory before and after touching the pages, then exit
        plain = memory_in_use(cpu)
        fresh_process.touch(pages)
        os.write(write, json.dumps([plain, memory_in_use(cpu)]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    plain, touched = json.loads(os.read(read, 100))
    assert len(pages) > 1000 and plain < 0.8 * before
    assert abs(touched - before) < 0.1 * before


def _library_state() -> tuple:
    import logging
    import warnings

    import transformers

    names = ("bitsandbytes", "peft", "transformers", "accelerate", "torch._inductor", "torch._dynamo", "")
    return (
        list(warnings.filters),
        {n: logging.getLogger(n).level for n in names},
        transformers.utils.logging.get_verbosity(),
        transformers.utils.logging.is_progress_bar_enabled(),
    )


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


def test_checkpointed_step_counts_the_kept_layer_inputs(alone: StepMeasurement) -> None:
    """With checkpointing a layer keeps only its input: the count holds each checkpointed layer's float32 input, whole
    and once, and the measured step counted the same bytes as this forward pass of the same step."""
    spec = {**measure.step_spec(TINY, **LORA, steps=1), "device": "cpu"}
    step = training_step._Step(spec, step_model.build_model(spec, torch.device("cpu")), torch.device("cpu"))
    params = {key[0] for key in map(training_step._storage_key, training_step._tensors_of_params(step.model)) if key}
    inputs: dict[int, tuple[int, int]] = {}

    def note_input(layer: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        inputs[id(layer)] = training_step._storage_key(args[0] if args else kwargs["hidden_states"])

    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in step.model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    hooks = [layer.register_forward_pre_hook(note_input, with_kwargs=True) for layer in layers]
    with training_step._count_saved_tensors(params) as seen:
        step.model(input_ids=step.micro_batches[0], labels=step.micro_batches[0])
    for hook in hooks:
        hook.remove()
    assert len(inputs) == TINY["num_hidden_layers"]
    assert (
        sum(nbytes for _, nbytes in inputs.values())
        == len(inputs) * LORA["batch"] * LORA["seq"] * TINY["hidden_size"] * 4
    )
    assert all(seen[pointer] == nbytes for pointer, nbytes in inputs.values())
    assert alone.saved_activations_bytes == sum(seen.values())


def test_auto_autocast_is_resolved_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    monkeypatch.setattr(measure, "_run_in_child", lambda spec, t: seen.setdefault("spec", spec) and fake_result("cpu"))
    measure_training_step(TINY, autocast="auto", device="cpu")
    assert seen["spec"]["autocast"] == "bfloat16"


def test_time_frozen_layer_small() -> None:
    times = measure.time_frozen_layer(32, 48, 16, min_run_time=0.01, device="cpu")
    assert {"float32", "bfloat16"} <= set(times) and all(t > 0 for t in times.values())


def test_frozen_layer_plan_on_a_cpu_uses_bfloat16() -> None:
    plan = measure._frozen_layer_plan("cpu")
    assert [label for label, _, _ in plan] == ["float32", "bfloat16", "4-bit NF4"]
    assert plan[2][2] == torch.bfloat16  # NF4 computes in the device's 16-bit dtype


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"tokens": 0}, ValueError, "tokens"),
        ({"in_features": 10**6}, ValueError, "in_features"),
        ({"out_features": 2.5}, TypeError, "out_features"),
        ({"min_run_time": 60}, ValueError, "min_run_time"),
    ],
)
def test_time_frozen_layer_rejects_bad_sizes(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        measure.time_frozen_layer(**kwargs)


def test_several_steps_share_one_child_and_each_is_measured_alone(
    forked: list[StepMeasurement], alone: StepMeasurement
) -> None:
    full, lora = forked[:2]
    assert full.trained_params > lora.trained_params == alone.trained_params
    assert lora.weights_bytes == alone.weights_bytes and lora.saved_activations_bytes == alone.saved_activations_bytes
    # a forked process starts from the imports only: its baseline is a fresh process's, not the first case's peak
    assert abs(lora.baseline_bytes - alone.baseline_bytes) < 0.1 * alone.baseline_bytes
    assert lora.baseline_bytes < full.peak_bytes


def test_a_failing_case_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [{"batch": 1, "optimizer": "adamw8bit"}, {"batch": 2}, {"batch": 3}]
    monkeypatch.setattr(measure.sys, "platform", "linux")  # the forking child, wherever the test runs
    timed_out = json.dumps({"index": 0, "error": "TimeoutError: " + children.TIMEOUT.format(5)})
    measured = json.dumps({"index": 2, "result": _fake_step({"device": "cpu", "steps": 1})})
    monkeypatch.setattr(children, "_run", lambda args, timeout_s: [timed_out, measured])  # no answer for case 1
    first, second, third = measure.measure_training_steps(TINY, cases, timeout_s=5, device="cpu")
    assert (
        isinstance(first, measure.Skipped) and first.reason.startswith("TimeoutError") and "timeout_s=5" in first.reason
    )
    assert second == measure.Skipped("RuntimeError: the child process gave no answer for this payload")
    assert isinstance(third, StepMeasurement) and third.what == "fake"
    monkeypatch.setattr(children, "_run", lambda args, timeout_s: 1 / 0)  # the whole child failed
    assert (
        measure.measure_training_steps(TINY, cases, timeout_s=5, device="cpu")
        == [measure.Skipped("ZeroDivisionError: division by zero")] * 3
    )


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
        monkeypatch.setattr(children, "_run", _forked_lines)
        rows = measure.measure_training_steps(TINY, cases, device="cpu", timeout_s=30)
    assert rows[0] == measure.Skipped("TypeError: unexpected keyword argument 'dtype'")
    assert isinstance(rows[1], StepMeasurement)


def _forked_lines(args: list, timeout_s: float) -> list[str]:
    """What ``--each`` prints, with each payload answered in this process instead of a forked one."""
    payloads = json.loads(args[-1])
    return [json.dumps({"index": i, **children._answer(measure.run_step, p)}) for i, p in enumerate(payloads)]


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


def test_a_compiled_case_gets_a_child_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def child(spec: dict, timeout_s: float) -> dict:
        seen.append((spec["compile"], timeout_s))
        return StepMeasurement(1, 0, 0, 0, 0, 0, 0.1, "cpu", "CPU").to_dict()

    monkeypatch.setattr(children, "call_each", lambda *a, **k: pytest.fail("a compiled case was forked"))
    monkeypatch.setattr(measure, "_run_in_child", child)
    out = measure.measure_training_steps(TINY, [{"compile": True}, {"method": "full"}], timeout_s=9, device="cpu")
    assert seen == [(True, 9), (False, 9)] and all(isinstance(m, StepMeasurement) for m in out)


@pytest.mark.parametrize("cases,match", [([], "at least one"), ([{"batchsize": 2}], "unknown argument")])
def test_several_steps_reject_bad_cases(cases, match) -> None:
    with pytest.raises(ValueError, match=match):
        measure.measure_training_steps(TINY, cases, device="cpu")
