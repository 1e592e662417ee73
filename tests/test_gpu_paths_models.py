"""course_utils.models, hub, standin and lora on simulated devices: every device-dependent decision.

``simulate(monkeypatch, key)`` (tests/gpu_sim.py) makes ``torch.cuda`` *answer* like a T4, L4, A100 or H100
(or like a machine without CUDA). This CPU build of torch raises at the first CUDA allocation, so these tests
check decisions (dtype, device_map, quantization config, gradient checkpointing, loss scaling),
never results. ``from_pretrained`` is replaced by a spy that records its arguments instead of loading.

The rule under test: 16-bit means float16 on a T4 (compute capability 7.5: bfloat16 only by emulation, even
though ``torch.cuda.is_bf16_supported()`` says True there), bfloat16 from compute capability 8.0 on, and
bfloat16 on a CPU.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from course_utils import hub, lora, packaged, standin
from course_utils import models as M
from course_utils.architecture import PROJECTIONS
from course_utils.hardware import autocast_dtype, needs_loss_scaling
from course_utils.quiet import import_bitsandbytes
from gpu_sim import CUDA_PROFILES, PROFILES, simulate
import tiny_models

# Import bitsandbytes now, on the real (CPU) machine: imported under a simulated GPU, it would look for its
# CUDA library, which this machine does not have. On a real GPU machine it loads its CUDA build.
BNB = import_bitsandbytes()
needs_bnb = pytest.mark.skipif(BNB is None, reason="bitsandbytes is not installed (8 and 4 bits need it)")

#: The 16-bit dtype each profile must get (CPU: bfloat16, CPU autocast's 16-bit type).
EXPECTED_DTYPE = {
    "T4": torch.float16,
    "L4": torch.bfloat16,
    "A100": torch.bfloat16,
    "H100": torch.bfloat16,
    "CPU": torch.bfloat16,
}
DEVICES = tuple(EXPECTED_DTYPE)  # the four GPUs and a machine without CUDA

TINY = tiny_models.TINY


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once per simulated device; returns its key ("T4", ..., "CPU")."""
    simulate(monkeypatch, request.param)
    return request.param


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No offline switch set, and no packaged copy installed (the tests that want one say so)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(packaged, "availability", lambda folder=None: None)


@pytest.fixture
def spy_from_pretrained(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace AutoModelForCausalLM.from_pretrained: record (name, kwargs) and return a stub model."""
    from transformers import AutoModelForCausalLM

    calls: list[dict] = []

    def fake(name, **kwargs):
        calls.append({"name": name, **kwargs})
        return SimpleNamespace(eval=lambda: None, kwargs=kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake)
    return calls


def test_profiles_cover_the_course_gpus() -> None:
    assert set(CUDA_PROFILES) | {"CPU"} == set(DEVICES) and set(DEVICES) <= set(PROFILES)
    assert PROFILES["T4"].capability == (7, 5) and PROFILES["A100"].capability == (8, 0)


def test_a_t4_claims_bf16_but_the_course_does_not_believe_it(monkeypatch) -> None:
    simulate(monkeypatch, "T4")
    assert torch.cuda.is_bf16_supported()  # true on a real T4 too: emulation
    assert autocast_dtype("cuda") == torch.float16 and M.load_settings(16, "cuda")["dtype"] == torch.float16


# --------------------------------------------------------------------------------------------
# Real model or stand-in
# --------------------------------------------------------------------------------------------
def test_decide_source_per_device(device, offline_env, monkeypatch) -> None:
    """The Hub decides on every device: a CPU that reaches it gets the real small model too."""
    calls = []
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: calls.append(timeout_s) or True)
    decision = hub.decide_source()
    assert decision.source == "real" and calls == [1.5]
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: False)
    assert hub.decide_source().source == "offline"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "cached_on_disk", lambda name: True)
    assert hub.decide_source().source == "real"
    monkeypatch.setattr(hub, "cached_on_disk", lambda name: False)
    assert hub.decide_source().source == "offline"


@pytest.mark.parametrize("reachable", [True, False])
def test_choose_model_follows_the_hub_on_every_device(device, offline_env, monkeypatch, reachable) -> None:
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: reachable)
    monkeypatch.setattr(standin, "ensure_standin", lambda seed=0: "/standin")
    choice = standin.choose_model()
    assert choice.is_standin is (not reachable)
    assert choice.name == (hub.REAL_MODEL if reachable else "/standin")


def test_the_lesson_model_loads_only_on_a_gpu_with_the_hub_and_4_bits(device) -> None:
    real = hub.ModelChoice(hub.REAL_MODEL, False, "the Hub is reachable")
    offline = hub.ModelChoice("/standin", True, "HF_HUB_OFFLINE is set")
    copy = hub.ModelChoice("/packaged", False, "the Hub did not answer", "packaged")
    reason = standin.lesson_model_skip_reason(real)
    if device == "CPU":
        assert "CUDA GPU" in reason
    else:
        assert reason is None
        assert "HF_HUB_OFFLINE" in standin.lesson_model_skip_reason(offline)
        assert "did not answer" in standin.lesson_model_skip_reason(copy)  # the packaged copy: no Hub either
        missing = "bitsandbytes is not installed"
        assert standin.lesson_model_skip_reason(real, missing) == missing
    with pytest.raises(TypeError, match="choice"):
        standin.lesson_model_skip_reason("Qwen/Qwen2.5-1.5B-Instruct")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no_4bit"):
        standin.lesson_model_skip_reason(real, True)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Quantization config and from_pretrained arguments
# --------------------------------------------------------------------------------------------
@needs_bnb
def test_nf4_compute_dtype_follows_the_device(device) -> None:
    expected = EXPECTED_DTYPE[device]
    assert M.quantization_config(4).bnb_4bit_compute_dtype == expected  # default: the device pick_device picks
    assert M.load_settings(4, "cpu")["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16
    assert M.quantization_config(4, torch.float32).bnb_4bit_compute_dtype == torch.float32  # explicit wins
    eight = M.quantization_config(8)
    assert eight.load_in_8bit and M.quantization_config(16) is None


@pytest.mark.parametrize("bits", [16, pytest.param(8, marks=needs_bnb), pytest.param(4, marks=needs_bnb)])
def test_load_model_arguments_per_device(device, spy_from_pretrained, bits) -> None:
    expected = EXPECTED_DTYPE[device]
    M.load_model(hub.REAL_MODEL, bits)
    (call,) = spy_from_pretrained
    assert call["name"] == hub.REAL_MODEL
    assert call["dtype"] == expected and "torch_dtype" not in call
    assert call["device_map"] == ("cpu" if device == "CPU" else {"": 0})  # one GPU, never "auto" over two
    qc = call["quantization_config"]
    if bits == 16:
        assert qc is None
    elif bits == 8:
        assert qc.load_in_8bit
    else:
        assert qc.load_in_4bit and qc.bnb_4bit_quant_type == "nf4" and qc.bnb_4bit_compute_dtype == expected


@needs_bnb
def test_an_explicit_cpu_device_wins_on_a_gpu_machine(device, spy_from_pretrained) -> None:
    M.load_model(hub.REAL_MODEL, 4, device="cpu")
    (call,) = spy_from_pretrained
    assert call["device_map"] == "cpu" and call["dtype"] == torch.bfloat16
    assert call["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16


def test_load_model_rejects_a_bad_device(device, spy_from_pretrained) -> None:
    with pytest.raises(ValueError, match="device"):
        M.load_model(hub.REAL_MODEL, 16, device="gpu0")
    with pytest.raises(TypeError, match="device"):
        M.load_model(hub.REAL_MODEL, 16, device=0.5)  # type: ignore[arg-type]
    assert spy_from_pretrained == []


# --------------------------------------------------------------------------------------------
# The stand-in: stored in bfloat16, loaded in the device's dtype
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_standin(tmp_path_factory) -> str:
    from transformers import AutoConfig

    return str(standin.ensure_standin(AutoConfig.for_model(**TINY), seed=0, folder=tmp_path_factory.mktemp("cache")))


def test_standin_is_stored_in_bf16_and_loaded_per_device(device, tiny_standin, spy_from_pretrained) -> None:
    import json
    from pathlib import Path

    stored = json.loads((Path(tiny_standin) / "config.json").read_text())
    assert stored.get("dtype", stored.get("torch_dtype")) == "bfloat16"  # a storage choice only
    M.load_model(tiny_standin, 16)
    if BNB is not None:
        M.load_model(tiny_standin, 4)
    for call in spy_from_pretrained:
        assert call["name"] == tiny_standin and call["dtype"] == EXPECTED_DTYPE[device]


def test_building_the_standin_never_touches_cuda(device, tmp_path) -> None:
    """ensure_standin builds on the CPU whatever the machine; a CUDA allocation here would raise."""
    from transformers import AutoConfig

    path = standin.ensure_standin(AutoConfig.for_model(**TINY), seed=1, folder=tmp_path)
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()


@pytest.mark.parametrize("key", CUDA_PROFILES)
def test_the_real_from_pretrained_gets_the_devices_dtype(monkeypatch, tiny_standin, key) -> None:
    """The decisions above, through the *real* from_pretrained (no spy), on a simulated GPU.

    The weights would go to GPU 0 (``device_map={"": 0}``, tested above), where a simulated GPU stops at the
    first allocation; so only the placement is sent to the CPU here. The dtype is the decision this test can
    see: float16 for a T4, bfloat16 from compute capability 8.0.
    """
    simulate(monkeypatch, key)
    monkeypatch.setattr(M, "device_map", lambda device=None: "cpu")
    model = M.load_model(tiny_standin, 16)
    assert model.dtype == EXPECTED_DTYPE[key]


def test_device_map_is_one_device_on_two_gpus(monkeypatch) -> None:
    """Kaggle's 2 x T4: the whole model goes on the device asked for, never spread by "auto"."""
    simulate(monkeypatch, "T4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert M.device_map("cuda") == {"": 0} and M.device_map("cuda:0") == {"": 0}
    assert M.device_map("cpu") == "cpu" and M.load_settings(4, "cuda")["device_map"] == {"": 0}


def test_a_real_cpu_load_under_a_gpu_profile_uses_bf16(monkeypatch, tiny_standin) -> None:
    simulate(monkeypatch, "T4")
    model = M.load_model(tiny_standin, 16, device="cpu")
    assert model.dtype == torch.bfloat16 and next(model.parameters()).device.type == "cpu"


# --------------------------------------------------------------------------------------------
# LoRA / QLoRA: gradient checkpointing on a GPU, the RNG of the model's device
# --------------------------------------------------------------------------------------------
class FakeQuantizedModel(torch.nn.Module):
    """Looks like a 4-bit model sitting on ``device`` without allocating there (the parameter lives on meta)."""

    is_loaded_in_4bit = True

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.where = device
        self.config = SimpleNamespace(use_cache=True)
        self.weight = torch.nn.Parameter(torch.empty(1, device="meta"))

    def parameters(self, recurse: bool = True):
        yield SimpleNamespace(device=self.where)


@pytest.fixture
def spy_peft(monkeypatch: pytest.MonkeyPatch) -> dict:
    import peft

    seen: dict = {}

    def prepare(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None, **kwargs):
        seen["checkpointing"] = use_gradient_checkpointing
        seen["checkpointing_kwargs"] = gradient_checkpointing_kwargs
        return model

    def wrap(model, config, **kwargs):
        seen["targets"] = set(config.target_modules)
        return model

    @contextlib.contextmanager
    def fork_rng(devices=None, **kwargs):
        seen["rng_devices"] = list(devices or [])
        yield

    monkeypatch.setattr(peft, "prepare_model_for_kbit_training", prepare)
    monkeypatch.setattr(peft, "get_peft_model", wrap)
    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)
    return seen


def test_add_lora_decisions_per_device(device, spy_peft) -> None:
    on_gpu = device != "CPU"
    model = FakeQuantizedModel(torch.device("cuda", 0) if on_gpu else torch.device("cpu"))
    out = lora.add_lora(model, r=16, alpha=16)
    assert out is model and spy_peft["targets"] == set(PROJECTIONS)
    assert spy_peft["checkpointing"] is on_gpu  # gradient checkpointing: on a GPU only
    assert spy_peft["checkpointing_kwargs"] == {"use_reentrant": False}  # else torch warns on every GPU run
    assert model.config.use_cache is (not on_gpu)
    assert spy_peft["rng_devices"] == ([0] if on_gpu else [])  # the seed also fixes the GPU's RNG there


def test_a_cpu_model_on_a_gpu_machine_is_trained_as_on_a_cpu(device, spy_peft) -> None:
    model = FakeQuantizedModel(torch.device("cpu"))
    lora.add_lora(model)
    assert spy_peft["checkpointing"] is False and spy_peft["rng_devices"] == []


def test_training_loop_loss_scaling_flag(device) -> None:
    """The notebook's GradScaler flag: needs_loss_scaling(autocast_dtype(device)) is on for float16 only."""
    dev = torch.device("cpu" if device == "CPU" else "cuda")
    assert needs_loss_scaling(autocast_dtype(dev)) is (device == "T4")


def test_offline_the_packaged_copy_is_chosen_on_every_device(device, offline_env, monkeypatch, tmp_path) -> None:
    """No Hub, the packaged copy installed: its converted folder, never the stand-in, whatever the device."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the stand-in was built although the packaged copy is there")

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: False)
    monkeypatch.setattr(packaged, "availability", lambda folder=None: "converted")
    monkeypatch.setattr(packaged, "convert", lambda folder=None, gguf=None: tmp_path)
    monkeypatch.setattr(standin, "ensure_standin", forbidden)
    choice = standin.choose_model()
    assert choice.source == "packaged" and not choice.is_standin and not choice.from_hub
    assert choice.name == str(tmp_path) and "Q4_1" in choice.label


# --------------------------------------------------------------------------------------------
# Notebook 01b's own loading cells on a simulated GPU, down to the first allocation
# --------------------------------------------------------------------------------------------
class _LoadedStub(torch.nn.Module):
    """What the spy's from_pretrained returns: a module that remembers its arguments and has a footprint."""

    def __init__(self, name: str, kwargs: dict) -> None:
        super().__init__()
        self.name, self.kwargs = name, kwargs
        self.layer = torch.nn.Linear(2, 2)

    @property
    def dtype(self) -> torch.dtype:
        return self.kwargs.get("dtype", torch.float32)

    def get_memory_footprint(self) -> int:
        return 1000 if self.kwargs.get("quantization_config") is None else 400


@needs_bnb
@pytest.mark.parametrize("key", CUDA_PROFILES)
def test_notebook_01b_loads_everything_on_the_one_gpu(monkeypatch, offline_env, key) -> None:
    """The notebook's visible from_pretrained calls, run as cells on a simulated GPU: GPU 0, its 16-bit type.

    The 16-bit model and the 4-bit maths in float16 on a T4 (the course text's config exactly), bfloat16 from
    compute capability 8.0; QLoRA's config adds double quantization. from_pretrained is a spy (a simulated GPU
    cannot allocate), and the generation cells are left out; everything else is the notebook's own code.
    """
    from pathlib import Path

    import matplotlib
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from course_utils import footprint

    matplotlib.use("Agg")
    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "scripts"))
    import build_notebooks

    simulate(monkeypatch, key)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: True)
    calls: list[_LoadedStub] = []

    def spy(name, **kwargs):
        calls.append(_LoadedStub(name, kwargs))
        return calls[-1]

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda name, **kwargs: SimpleNamespace(name=name))
    monkeypatch.setattr(
        footprint,
        "measured_scale_bytes",  # the stubs store no scales: plain 4, nested 1
        lambda model: 1 if model.kwargs["quantization_config"].bnb_4bit_use_double_quant else 4,
    )
    cells = build_notebooks.parse_source((root / "notebooks" / "src" / "01b_real_models_qlora.py").read_text())
    skip = ("setup_report()", "four_bit_ratio_panel", "generate(", "answers.values()")  # no widgets, no text
    code = [c.source for c in cells if c.cell_type == "code" and not any(word in c.source for word in skip)]
    last = next(i for i, source in enumerate(code) if "bnb_4bit_use_double_quant=True" in source)
    namespace: dict = {}
    with contextlib.redirect_stdout(None):
        for source in code[: last + 1]:
            exec(compile(source, "01b", "exec"), namespace)  # the notebook's own cells, in order
    expected = EXPECTED_DTYPE[key]
    assert namespace["device"].type == "cuda" and namespace["dtype"] == expected
    (m16, m4, base) = calls
    assert m16.name == m4.name == base.name == hub.REAL_MODEL
    for call in calls:
        assert call.kwargs["device_map"] == {"": 0} and call.kwargs["dtype"] == expected  # one GPU, never "auto"
    course = m4.kwargs["quantization_config"]
    assert course.load_in_4bit and course.bnb_4bit_quant_type == "nf4" and not course.bnb_4bit_use_double_quant
    assert course.bnb_4bit_compute_dtype == expected  # float16 on a T4, as in the course text
    qc = base.kwargs["quantization_config"]
    assert qc.bnb_4bit_use_double_quant and qc.bnb_4bit_compute_dtype == expected and qc.bnb_4bit_quant_type == "nf4"
    assert needs_loss_scaling(namespace["compute"]) is (key == "T4")  # the training cell's GradScaler flag
