"""course_utils.step_model and course_utils.training_step: the model a measured step trains, and the step itself,
run in this process on a tiny config (the measuring around them is tests/test_measure.py's)."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from course_utils import measure, step_model, training_step
from course_utils.quiet import import_bitsandbytes, quiet_libraries
from test_measure import TINY, TINY_PARAMS

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_full_bf16_model_and_adamw_states_are_bfloat16() -> None:
    """Pure bf16: every parameter bfloat16 and trainable; torch AdamW keeps exp_avg and exp_avg_sq in bfloat16."""
    spec = {
        "config": TINY,
        "method": "full-bf16",
        "lora_rank": 8,
        "targets": ["q_proj"],
        "seed": 0,
        "optimizer": "adamw",
    }  # the config says bfloat16 too, but build_model sets the dtype itself
    model = step_model.build_model(spec, torch.device("cpu"))
    params = list(model.parameters())
    assert all(p.dtype == torch.bfloat16 and p.requires_grad for p in params)
    assert sum(p.numel() for p in params) == TINY_PARAMS
    opt = step_model._make_optimizer(spec, params)
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
    spec = measure.step_spec(
        TINY, method="qlora", lora_rank=4, checkpointing=checkpointing, kbit_preparation=kbit_preparation
    )
    with quiet_libraries():
        model = step_model.build_model(spec, torch.device("cpu"))
    rest = torch.float32 if kbit_preparation else torch.bfloat16
    named = dict(model.named_parameters())
    assert {p.dtype for n, p in named.items() if "norm" in n or "embed_tokens" in n} == {rest}
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}
    assert all(p.requires_grad == ("lora_" in n) for n, p in named.items())
    assert sum(isinstance(m, import_bitsandbytes().nn.Linear4bit) for m in model.modules()) == 2 * 7
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules()) is checkpointing
    # the hidden states and the logits take the embedding's dtype: 4-bit layers cast their output back to their input's
    ids = torch.randint(0, 512, (2, 8))
    out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    assert {h.dtype for h in out.hidden_states} == {out.logits.dtype} == {rest}
    out.loss.backward()
    assert all(p.grad is not None for n, p in named.items() if "lora_" in n)


def test_step_precision_on_a_cpu() -> None:
    from course_utils.step_model import _Precision, _step_precision

    assert _step_precision("full", None, "cpu") == _Precision("float32", None, False)
    assert _step_precision("lora-bf16", None, "cpu") == _Precision("bfloat16", None, False)
    assert _step_precision("qlora", "auto", "cpu") == _Precision("bfloat16", "bfloat16", False)
    assert _step_precision("full", "float16", "cpu").loss_scaling  # on purpose: float16 needs loss scaling


def test_adamw8bit_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from course_utils import training_arguments

    monkeypatch.setattr(step_model, "adamw8bit_available", lambda device="cpu": False)
    monkeypatch.setattr(training_arguments, "adamw8bit_available", lambda device="cpu": False)
    param = torch.nn.Parameter(torch.ones(8))
    with pytest.raises(RuntimeError, match="no 8-bit AdamW for the CPU here"):
        step_model._make_optimizer({"optimizer": "adamw8bit"}, [param])
    args, changes = training_arguments.memory_efficient_training_arguments("/tmp/unused", max_steps=1, device="cpu")
    assert args.optim.value == "adamw_torch" and any(
        c.startswith("optim='adamw_torch': no bitsandbytes") for c in changes
    )


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
    with pytest.raises(TimeoutError, match=r"timeout_s=1e-06 s \(its limit is checked between micro-batches\)"):
        training_step.run_step(spec)
    spec.pop("timeout_s")
    training_step._Step(spec, torch.nn.Linear(2, 2), torch.device("cpu"))._check_time()  # no limit: never raises


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


def test_cuda_peaks_count_above_what_was_allocated_before() -> None:
    """The notebook's own CUDA tensors are not the step's: the peak is counted above them."""
    from types import SimpleNamespace

    import torch

    from course_utils import step_model, training_step
    from course_utils.peak import WorkPeak

    step = SimpleNamespace(
        dev=torch.device("cuda", 0),
        model=torch.nn.Linear(2, 2),
        counts={},
        trained=[],
        attention_backends=["flash"],
        optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
        precision=step_model._Precision("float32", None, False),
    )
    peak = WorkPeak(bytes=3_000, start_bytes=2_500, what="CUDA: peak", seconds=0.01)
    spec = {
        "method": "full",
        "batch": 1,
        "seq": 8,
        "lora_rank": 8,
        "targets": ("q_proj",),
        "optimizer": "adamw",
        "steps": 1,
        "accumulation": 1,
    }
    out = training_step._result(spec, step, peak, baseline=2_000, first=0.1)
    assert out["peak_bytes"] == 1_000 and out["start_bytes"] == 500 and out["baseline_bytes"] == 0
    assert "above the 2,000 bytes" in out["what"]
    cpu = training_step._result(
        spec, SimpleNamespace(**{**vars(step), "dev": torch.device("cpu")}), peak, baseline=2_000, first=0.1
    )
    assert cpu["peak_bytes"] == 3_000 and cpu["baseline_bytes"] == 2_000  # a CPU child's baseline is its own
