"""course_utils.models: the online/offline decision (no network), footprints, meta-device counts, LoRA, bad input.

The end-to-end tests use a tiny Llama (hidden 64, 2 layers) built through the same code path as the
135M stand-in, so they stay fast; the 135M model itself is exercised by notebook 01b.
"""
from __future__ import annotations

import socket
import time

import pytest
import torch

from course_utils import models as M
from course_utils.hardware import import_bitsandbytes

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 128, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def tiny_config(**overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model(**{**TINY, **overrides})


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a socket fails the test: the decision must not touch the network."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the network was touched")
    monkeypatch.setattr(socket, "create_connection", forbidden)


def _cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


# --------------------------------------------------------------------------------------------
# Online / offline decision
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, offline", [("1", True), ("true", True), ("YES", True), ("on", True),
                                            ("0", False), ("", False), ("false", False)])
def test_offline_env_parsing(value: str, offline: bool) -> None:
    assert M.hub_offline_env({"HF_HUB_OFFLINE": value}) is offline
    assert M.hub_offline_env({"TRANSFORMERS_OFFLINE": value}) is offline
    assert M.hub_offline_env({}) is False


def test_no_gpu_means_standin_without_any_network(monkeypatch, no_network) -> None:
    _cuda(monkeypatch, False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    decision = M.decide_source()
    assert decision.source == "standin" and "no CUDA GPU" in decision.reason


def test_offline_env_decides_at_once(monkeypatch, no_network) -> None:
    _cuda(monkeypatch, True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(M, "cached_on_disk", lambda name: False)
    start = time.perf_counter()
    decision = M.decide_source()
    assert decision.source == "standin" and "HF_HUB_OFFLINE" in decision.reason
    assert time.perf_counter() - start < 0.5


def test_offline_but_cached_uses_the_real_model(monkeypatch, no_network) -> None:
    _cuda(monkeypatch, True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(M, "cached_on_disk", lambda name: True)
    assert M.decide_source().source == "real"


@pytest.mark.parametrize("reachable, source", [(False, "standin"), (True, "real")])
def test_online_decision_follows_one_reachability_check(monkeypatch, reachable: bool, source: str) -> None:
    _cuda(monkeypatch, True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []
    monkeypatch.setattr(M, "hub_reachable", lambda timeout_s=1.5: calls.append(timeout_s) or reachable)
    decision = M.decide_source(timeout_s=1.0)
    assert decision.source == source and calls == [1.0]
    if not reachable:
        assert "did not answer within 1 s" in decision.reason


def test_reachability_true_false_and_never_longer_than_the_timeout(monkeypatch) -> None:
    class Conn:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: Conn())
    assert M.hub_reachable("example.invalid", 443, timeout_s=0.5) is True

    def refused(address, timeout):
        raise ConnectionRefusedError("no")
    monkeypatch.setattr(socket, "create_connection", refused)
    assert M.hub_reachable("example.invalid", 443, timeout_s=0.5) is False

    def hangs(address, timeout):  # a DNS lookup that hangs far beyond the timeout
        time.sleep(3)
        raise OSError("too late")
    monkeypatch.setattr(socket, "create_connection", hangs)
    start = time.perf_counter()
    assert M.hub_reachable("example.invalid", 443, timeout_s=0.2) is False
    assert time.perf_counter() - start < 1.0


def test_hub_address_follows_hf_endpoint() -> None:
    assert M.hub_address({}) == ("huggingface.co", 443)
    assert M.hub_address({"HF_ENDPOINT": "http://mirror.local:8080"}) == ("mirror.local", 8080)
    with pytest.raises(ValueError, match="HF_ENDPOINT"):
        M.hub_address({"HF_ENDPOINT": "not a url"})


@pytest.mark.parametrize("timeout, error", [(0, ValueError), (-1, ValueError), (11, ValueError),
                                            ("1", TypeError), (True, TypeError)])
def test_reachability_rejects_bad_timeouts(timeout, error) -> None:
    with pytest.raises(error, match="timeout_s"):
        M.hub_reachable("example.invalid", 443, timeout_s=timeout)


def test_decide_rejects_a_bad_model_name() -> None:
    with pytest.raises(ValueError, match="model_name"):
        M.decide_source("not-a-hub-id")


def test_choose_model_labels_the_standin(monkeypatch, no_network, tmp_path) -> None:
    _cuda(monkeypatch, False)
    monkeypatch.setattr(M, "ensure_standin", lambda seed=0: tmp_path)
    choice = M.choose_model()
    assert choice.is_standin and "STAND-IN" in choice.label and "random weights" in choice.label
    assert choice.name == str(tmp_path)
    assert M.ModelChoice(M.REAL_MODEL, False, "gpu").label == f"[{M.REAL_MODEL}]"


# --------------------------------------------------------------------------------------------
# Bits and quantization configs
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits, error", [(3, ValueError), (32, ValueError), (0, ValueError),
                                         ("4", TypeError), (4.0, TypeError), (True, TypeError)])
def test_bad_bits(bits, error) -> None:
    with pytest.raises(error, match="bits"):
        M.check_bits(bits)
    with pytest.raises(error, match="bits"):
        M.load_model("/nonexistent", bits)  # rejected before anything is loaded
    with pytest.raises(error, match="bits"):
        M.footprint_parts(torch.nn.Linear(2, 2), bits)


def test_quantization_configs(monkeypatch) -> None:
    assert M.quantization_config(16) is None
    eight = M.quantization_config(8)
    assert eight.load_in_8bit and not eight.load_in_4bit
    four = M.quantization_config(4, device="cpu")
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4"
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    # A T4 (compute capability 7.5) computes in float16, an A100 in bfloat16.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert M.quantization_config(4, device="cuda").bnb_4bit_compute_dtype == torch.float16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert M.quantization_config(4, device="cuda").bnb_4bit_compute_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="compute_dtype"):
        M.quantization_config(4, torch.int8)


def test_load_model_rejects_a_bad_model_argument() -> None:
    with pytest.raises(TypeError, match="model"):
        M.load_model(42, 16)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Counts and footprints on the meta device (the real architectures, no memory)
# --------------------------------------------------------------------------------------------
def test_meta_counts_of_the_shipped_architectures() -> None:
    smol = M.meta_model(M.STANDIN_CONFIG)
    assert M.count_parameters(smol) == M.STANDIN_PARAMS == 134_515_008
    assert M.is_tied(smol) and next(smol.parameters()).device.type == "meta"
    assert M.count_parameters(M.meta_model(M.QWEN25_CONFIG)) == 1_543_714_304
    assert M.count_parameters(M.meta_model(M.QWEN3_CONFIG)) == 4_022_468_096


def test_standin_footprint_arithmetic() -> None:
    smol = M.meta_model(M.STANDIN_CONFIG)
    parts = {p.name: p for p in M.footprint_parts(smol, 4)}
    assert parts["embedding table"].params == 49152 * 576 == 28_311_552
    linears = parts["attention linears (q, k, v, o)"].params + parts["MLP linears (gate, up, down)"].params
    assert linears == 106_168_320 and parts["norms"].params == (2 * 30 + 1) * 576
    assert parts["lm_head"].params == 0  # tied: no bytes of its own
    # rotary frequencies, float32: 256 bytes on transformers 5 (two copies), 128 on 4.57 (one)
    buffers = parts["buffers"].bytes
    assert buffers in (128, 256)
    assert M.footprint_bytes(smol, 16) == 2 * 134_515_008 + buffers
    assert M.footprint_bytes(smol, 8) == 28_311_552 * 2 + 106_168_320 + 35_136 * 2 + buffers
    assert M.footprint_bytes(smol, 4) == 28_311_552 * 2 + 106_168_320 // 2 + 35_136 * 2 + buffers
    assert [M.format_bytes(M.footprint_bytes(smol, b)) for b in (16, 8, 4)] == ["269.0 MB", "162.9 MB", "109.8 MB"]
    assert M.scale_bytes(smol, 4) == 106_168_320 // 64 * 4 == 6_635_520
    assert M.scale_bytes(smol, 16) == 0
    assert round(100 * M.footprint_bytes(smol, 4) / M.footprint_bytes(smol, 16)) == 41


def test_real_model_sizes_are_computed_about_a_third() -> None:
    sizes = M.computed_sizes(M.QWEN25_CONFIG, "Qwen2.5-1.5B-Instruct")
    assert sizes.params == 1_543_714_304
    buffers = sizes.bytes16 - 2 * 1_543_714_304  # float32 rotary buffers of head_dim / 2: two on transformers 5
    assert buffers in (64 * 4, 2 * 64 * 4)
    assert round(sizes.bytes16 / 1e9, 1) == 3.1 and round(sizes.bytes4 / 1e9, 1) == 1.1
    assert 0.30 < sizes.bytes4 / sizes.bytes16 < 0.40  # about a third, not a quarter
    assert "COMPUTED" in sizes.summary() and "not loaded" in sizes.summary()
    parts = {p.name: p for p in M.footprint_parts(M.meta_model(M.QWEN25_CONFIG), 4)}
    assert parts["linear biases"].params == 28 * (1536 + 256 + 256)  # Qwen2 has q, k, v biases: kept 16-bit
    assert not parts["linear biases"].quantized and parts["MLP linears (gate, up, down)"].quantized


def test_untied_head_stays_16_bit() -> None:
    model = M.meta_model(tiny_config(tie_word_embeddings=False))
    parts = {p.name: p for p in M.footprint_parts(model, 4)}
    assert not M.is_tied(model)
    assert parts["lm_head"].params == 512 * 64 and parts["lm_head"].bytes == 2 * 512 * 64


def test_closed_form_matches_the_meta_model() -> None:
    parts = M.llama_like_parts(576, 30, 49152, mlp_ratio=1536 / 576, kv_fraction=1 / 3)
    assert sum(parts.values()) == 134_515_008
    assert parts["embedding table"] == 28_311_552 and parts["lm_head"] == 0
    report = M.four_bit_ratio_report(576, 30, 49152)
    assert "41 %" in report and "135 M parameters" in report
    assert M.llama_like_parts(576, 30, 49152, tied=False)["lm_head"] == 28_311_552


@pytest.mark.parametrize("kwargs, error", [
    ({"hidden_size": 32}, ValueError), ({"num_layers": 0}, ValueError), ({"vocab_size": 10}, ValueError),
    ({"hidden_size": 576.0}, TypeError), ({"mlp_ratio": 20}, ValueError), ({"kv_fraction": 0}, ValueError)])
def test_closed_form_bad_input(kwargs, error) -> None:
    args = {"hidden_size": 576, "num_layers": 30, "vocab_size": 49152, **kwargs}
    with pytest.raises(error, match=next(iter(kwargs))):
        M.llama_like_parts(**args)


def test_format_bytes() -> None:
    assert M.format_bytes(269_030_272) == "269.0 MB"
    assert M.format_bytes(3_087_428_736) == "3.09 GB"


# --------------------------------------------------------------------------------------------
# LoRA counts
# --------------------------------------------------------------------------------------------
def test_lora_counts_on_the_meta_device() -> None:
    smol = M.lora_count(M.STANDIN_CONFIG)
    assert smol.trainable == 4_884_480 and smol.base == 134_515_008
    assert round(smol.percent, 1) == 3.5  # peft's trainable%: adapter / (base + adapter)
    qwen3 = M.lora_count(M.QWEN3_CONFIG)
    assert (qwen3.trainable, qwen3.base) == (33_030_144, 4_022_468_096)
    assert round(qwen3.percent_of_base, 2) == 0.82 and round(qwen3.percent, 2) == 0.81
    assert "trainable params: 33,030,144" in qwen3.summary()
    # the seeds' other figure: rank 8 on q_proj and v_proj of SmolLM2 trains 460,800
    assert M.lora_count(M.STANDIN_CONFIG, r=8, alpha=16, targets=["q_proj", "v_proj"]).trainable == 460_800


def test_lora_by_hand_matches_peft() -> None:
    smol = M.meta_model(M.STANDIN_CONFIG)
    assert M.lora_params_by_hand(smol, 16) == 4_884_480
    assert M.lora_params_by_hand(smol, 8, ["q_proj", "v_proj"]) == 460_800
    assert M.lora_params_by_hand(M.meta_model(M.QWEN3_CONFIG), 16) == 33_030_144


@pytest.mark.parametrize("kwargs, error, word", [
    ({"r": 0}, ValueError, "r "), ({"r": 2.5}, TypeError, "r must"), ({"alpha": 0}, ValueError, "alpha"),
    ({"targets": "q_proj"}, TypeError, "targets"), ({"targets": []}, ValueError, "targets"),
    ({"targets": ["no_such_layer"]}, ValueError, "targets")])
def test_lora_bad_input(kwargs, error, word) -> None:
    smol = M.meta_model(tiny_config())
    with pytest.raises(error, match=word):
        if "alpha" in kwargs:
            M.lora_config(**kwargs)
        else:
            M.lora_params_by_hand(smol, **kwargs)


# --------------------------------------------------------------------------------------------
# The same code path end to end, on a tiny stand-in
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_standin(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("cache")
    path = M.ensure_standin(tiny_config(), seed=0, folder=folder)
    assert M.ensure_standin(tiny_config(), seed=0, folder=folder) == path  # built once, then reused
    assert (path / "STANDIN.txt").exists() and not any(p.name.startswith(".building") for p in folder.iterdir())
    return str(path)


def test_standin_is_seeded(tiny_standin, tmp_path) -> None:
    other = M.ensure_standin(tiny_config(), seed=0, folder=tmp_path)
    a, b = M.load_model(tiny_standin, 16, device="cpu"), M.load_model(other, 16, device="cpu")
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    with pytest.raises(ValueError, match="seed"):
        M.ensure_standin(tiny_config(), seed=-1, folder=tmp_path)


def test_standin_cache_falls_back_to_the_temp_dir(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(M.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = M.ensure_standin(tiny_config(), seed=0)
    assert path.parent == tmp_path / "tmp" / "course_utils" and (path / "config.json").exists()
    with pytest.raises(OSError):
        M.ensure_standin(tiny_config(), seed=0, folder=blocker / "cache")  # an explicit folder is not replaced


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_footprints_measured_match_computed(tiny_standin) -> None:
    m16 = M.load_model(tiny_standin, 16, device="cpu")
    m4 = M.load_model(tiny_standin, 4, device="cpu")
    assert m16.get_memory_footprint() == M.footprint_bytes(m16, 16)
    assert m4.get_memory_footprint() == M.footprint_bytes(m16, 4) == M.footprint_bytes(m4, 4)
    assert M.measured_scale_bytes(m4) == M.scale_bytes(m16, 4)
    assert M.count_parameters(m4) == M.count_parameters(m16)  # packed 4-bit weights counted at their true size
    table = M.breakdown_table(m16, 4)
    assert "embedding table" in table and "tied" in table and "4-bit / 16-bit" in table


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_qlora_steps_lower_the_loss(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    model = M.add_lora(M.load_model(tiny_standin, 4, device="cpu"))
    trainable, total = M.trainable_counts(model)
    assert trainable == M.lora_params_by_hand(model, 16) and total > trainable
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    batches = M.training_batches(tok, M.training_texts()[:8], batch_size=4, max_length=16)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = M.mean_loss(model, batches)
    with pytest.raises(ValueError, match="batches"):
        M.mean_loss(model, [])
    torch.manual_seed(0)
    losses = []
    model.train()
    for step in range(6):
        loss = model(**batches[step % 2]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and M.mean_loss(model, batches) < before
    text = M.generate_text(model, tok, "The capital of France is", max_new_tokens=3)
    assert text.startswith("The capital of France is")


def test_lora_start_is_reproducible(tiny_standin) -> None:
    def first_a(seed):
        model = M.add_lora(M.load_model(tiny_standin, 16, device="cpu"), seed=seed)
        return next(p for n, p in model.named_parameters() if "lora_A" in n).detach().clone()

    state = torch.get_rng_state()
    assert torch.equal(first_a(0), first_a(0)) and not torch.equal(first_a(0), first_a(1))
    assert torch.equal(torch.get_rng_state(), state)  # the global random state is left alone
    with pytest.raises(ValueError, match="seed"):
        M.add_lora(M.load_model(tiny_standin, 16, device="cpu"), seed=-3)


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_cpu_repack_pitfall_is_caught(tiny_standin) -> None:
    from bitsandbytes import functional

    has_avx512bf16 = getattr(functional, "has_avx512bf16", lambda: False)  # absent before bitsandbytes 0.49
    model = M.load_model(tiny_standin, 4, device="cpu")
    assert M.keep_4bit_trainable_on_cpu(model) == 2 * 7  # 2 layers x 7 projections
    tok = M.load_tokenizer(tiny_standin)
    M.generate_text(model, tok, "Hello", max_new_tokens=2)  # no repack after the switch: still trainable
    M.keep_4bit_trainable_on_cpu(model)
    if not has_avx512bf16():
        pytest.skip("this CPU has no AVX-512-bf16: bitsandbytes never repacks here")
    fresh = M.load_model(tiny_standin, 4, device="cpu")
    M.generate_text(fresh, tok, "Hello", max_new_tokens=2)  # repacks the weights for inference
    with pytest.raises(RuntimeError, match="repacked"):
        M.keep_4bit_trainable_on_cpu(fresh)


def test_training_batches_mask_the_padding(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    texts = ["short", "a somewhat longer line of text"]
    (batch,) = M.training_batches(tok, texts, batch_size=2, max_length=32)
    pad = batch["attention_mask"] == 0
    assert pad.any() and (batch["labels"][pad] == -100).all()
    assert (batch["labels"][~pad] == batch["input_ids"][~pad]).all()
    assert len(M.training_batches(tok, M.training_texts(), batch_size=8)) == 5  # 40 lines
    for kwargs in ({"batch_size": 0}, {"max_length": 1}, {"batch_size": True}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            M.training_batches(tok, texts, **kwargs)
    with pytest.raises(ValueError, match="texts"):
        M.training_batches(tok, "not a list")


def test_generate_bad_input(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    model = M.load_model(tiny_standin, 16, device="cpu")
    with pytest.raises(ValueError, match="prompt"):
        M.generate_text(model, tok, "")
    with pytest.raises(ValueError, match="max_new_tokens"):
        M.generate_text(model, tok, "Hi", max_new_tokens=0)


def test_shipped_training_texts() -> None:
    texts = M.training_texts()
    assert len(texts) == 40 and all(isinstance(t, str) and t for t in texts)


# --------------------------------------------------------------------------------------------
# Unsloth: only with CUDA and the Hub
# --------------------------------------------------------------------------------------------
def test_unsloth_plan(monkeypatch) -> None:
    real = M.ModelChoice(M.REAL_MODEL, False, "gpu and hub")
    standin = M.ModelChoice("/tmp/x", True, "HF_HUB_OFFLINE is set")
    _cuda(monkeypatch, False)
    plan = M.unsloth_plan(real)
    assert not plan.run and "skipped" in plan.reason and "CUDA GPU" in plan.reason
    assert "peft cells above did the same job" in plan.message() and "pip install unsloth" in plan.message()
    _cuda(monkeypatch, True)
    plan = M.unsloth_plan(standin)
    assert not plan.run and "Hub" in plan.reason and "HF_HUB_OFFLINE" in plan.reason
    monkeypatch.setattr(M, "unsloth_importable", lambda: True)
    plan = M.unsloth_plan(real)
    assert plan.run and plan.command is None and "same job" not in plan.message()
    with pytest.raises(TypeError, match="choice"):
        M.unsloth_plan("Qwen/Qwen2.5-1.5B-Instruct")  # type: ignore[arg-type]


@pytest.mark.parametrize("colab", [True, False])
def test_unsloth_is_never_installed_into_a_running_kernel(monkeypatch, colab: bool) -> None:
    """Missing Unsloth on a GPU with the Hub: skip, and print the command for a *fresh* runtime."""
    real = M.ModelChoice(M.REAL_MODEL, False, "gpu and hub")
    _cuda(monkeypatch, True)
    monkeypatch.setattr(M, "unsloth_importable", lambda: False)
    monkeypatch.setattr(M, "on_colab", lambda: colab)
    plan = M.unsloth_plan(real)
    assert not plan.run and not hasattr(plan, "install")
    text = plan.message()
    assert "restart" in text.lower() or "new kernel" in text
    if colab:
        assert "In a fresh Colab runtime, run `!pip install unsloth` in the first cell" in text.replace("To run it: in", "In")
    else:
        assert "`pip install unsloth` in a fresh environment" in text
    assert "peft cells above did the same job" in text


def test_unsloth_importable_reads_the_spec(monkeypatch) -> None:
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "unsloth" else find(name))
    assert M.unsloth_importable() is True
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "unsloth" else find(name))
    assert M.unsloth_importable() is False


def test_notebook_never_pip_installs_into_its_kernel() -> None:
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01b_real_models_qlora.py").read_text(
        encoding="utf-8")
    code = "\n".join(line for line in source.splitlines() if not line.startswith("#"))
    assert "pip" not in code and "subprocess" not in code


# --------------------------------------------------------------------------------------------
# Version-fragile calls: one compatibility helper
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version, key", [((4, 55), "torch_dtype"), ((4, 56), "dtype"), ((4, 57), "dtype"),
                                          ((5, 24), "dtype")])
def test_dtype_keyword_follows_the_transformers_version(version, key) -> None:
    assert M.dtype_kwargs(torch.float16, version) == {key: torch.float16}


def test_dtype_keyword_of_the_installed_transformers() -> None:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    assert M.transformers_version() == (major, minor)
    assert M.dtype_kwargs(torch.bfloat16) == {"dtype": torch.bfloat16}  # the course supports 4.57 and newer
    with pytest.raises(TypeError, match="dtype"):
        M.dtype_kwargs("float16")  # type: ignore[arg-type]


def test_generate_drops_token_type_ids(tiny_standin) -> None:
    """transformers 4.x rejects token_type_ids in a decoder-only generate: never pass them."""
    tok = M.load_tokenizer(tiny_standin)
    model = M.load_model(tiny_standin, 16, device="cpu")
    seen = {}
    original = model.generate

    def spy(**kwargs):
        seen.update(kwargs)
        return original(**kwargs)

    model.generate = spy
    real_call = type(tok).__call__

    def with_type_ids(self, *args, **kwargs):  # a tokenizer that adds token_type_ids unless told not to
        kwargs.setdefault("return_token_type_ids", True)
        return real_call(self, *args, **kwargs)

    type(tok).__call__ = with_type_ids
    try:
        assert "token_type_ids" in tok("Hi", return_tensors="pt")
        M.generate_text(model, tok, "Hi", max_new_tokens=2)
        (batch,) = M.training_batches(tok, ["a line", "another line"], batch_size=2)
    finally:
        type(tok).__call__ = real_call
    assert "token_type_ids" not in seen and "input_ids" in seen
    assert set(batch) == {"input_ids", "attention_mask", "labels"}


# --------------------------------------------------------------------------------------------
# Without bitsandbytes (e.g. a Mac where it does not install): say so, never crash the 16-bit path
# --------------------------------------------------------------------------------------------
@pytest.fixture
def no_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a machine where bitsandbytes is missing (models asks course_utils.hardware through this name)."""
    monkeypatch.setattr(M, "import_bitsandbytes", lambda: None)


def test_bitsandbytes_missing_is_one_clear_sentence(no_bitsandbytes) -> None:
    reason = M.bitsandbytes_missing()
    assert reason and "bitsandbytes" in reason and "pip install bitsandbytes" in reason and "\n" not in reason


def test_bitsandbytes_present_gives_none() -> None:
    expected = None if import_bitsandbytes() is not None else str
    got = M.bitsandbytes_missing()
    assert got is None if expected is None else isinstance(got, str)


def test_without_bitsandbytes_16_bit_still_loads_and_4_bit_says_why(no_bitsandbytes, tiny_standin) -> None:
    assert M.quantization_config(16) is None
    for bits in (8, 4):
        with pytest.raises(RuntimeError, match=f"loading in {bits} bits needs bitsandbytes.*pip install"):
            M.quantization_config(bits, device="cpu")
        with pytest.raises(RuntimeError, match="needs bitsandbytes"):
            M.load_model(tiny_standin, bits, device="cpu")
    model = M.load_model(tiny_standin, 16, device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert M.keep_4bit_trainable_on_cpu(model) == 0
    assert M.footprint_bytes(model, 4) < M.footprint_bytes(model, 16)  # 4-bit sizes can still be computed


def test_without_bitsandbytes_lora_runs_on_the_16_bit_model(no_bitsandbytes, tiny_standin) -> None:
    """The notebook's fallback: LoRA on the 16-bit model, the same adapter count as QLoRA."""
    model = M.add_lora(M.load_model(tiny_standin, 16, device="cpu"))
    trainable, total = M.trainable_counts(model)
    assert trainable == M.lora_params_by_hand(model, 16) and total > trainable
    tok = M.load_tokenizer(tiny_standin)
    batches = M.training_batches(tok, M.training_texts()[:4], batch_size=4, max_length=16)
    model.train()
    loss = model(**batches[0]).loss
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# Chart and widget callback
# --------------------------------------------------------------------------------------------
def test_footprint_chart_and_groups() -> None:
    from course_utils.plots import models as P

    smol = M.meta_model(M.STANDIN_CONFIG)
    groups = P.group_bytes(M.footprint_parts(smol, 4))
    assert groups["embedding table (stays 16-bit)"] == 2 * 28_311_552
    assert M.format_bytes(sum(groups.values())) == "109.8 MB" and sum(groups.values()) == M.footprint_bytes(smol, 4)
    b16 = M.footprint_bytes(smol, 16)
    fig = P.footprint_chart([("16-bit", M.footprint_parts(smol, 16), b16), ("4-bit", M.footprint_parts(smol, 4), b16)])
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    with pytest.raises(TypeError, match="parts"):
        P.group_bytes([1, 2])
    with pytest.raises(ValueError, match="bars"):
        P.footprint_chart([])
    with pytest.raises(ValueError, match="bytes16"):
        P.footprint_chart([("x", M.footprint_parts(smol, 4), 0)])
    import matplotlib.pyplot as plt
    plt.close("all")


def test_widget_callback_prints_the_report(capsys) -> None:
    from course_utils.widgets.models import show_ratio

    show_ratio(576, 30, 49152, True)
    assert "41 %" in capsys.readouterr().out
