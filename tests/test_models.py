"""course_utils.models: loading in 16, 8 or 4 bits, configs and the meta device, generating text, bad input.

The end-to-end tests use a tiny Llama (hidden 64, 2 layers) built through the same code path as the
135M stand-in (see test_standin.py), so they stay fast; the 135M model itself is exercised by notebook 01b.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import models as M
from course_utils import units
from course_utils.quiet import import_bitsandbytes
from course_utils.standin import STANDIN_CONFIG
from tiny_models import TINY


# --------------------------------------------------------------------------------------------
# Bits and quantization configs
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bits, error",
    [(3, ValueError), (32, ValueError), (0, ValueError), ("4", TypeError), (4.0, TypeError), (True, TypeError)],
)
def test_bad_bits(bits, error) -> None:
    with pytest.raises(error, match="bits"):
        M.check_load_bits(bits)
    with pytest.raises(error, match="bits"):
        M.load_model("/nonexistent", bits)  # rejected before anything is loaded
    with pytest.raises(error, match="bits"):
        M.load_settings(bits)


def test_quantization_configs(monkeypatch) -> None:
    assert M.quantization_config(16) is None
    eight = M.quantization_config(8)
    assert eight.load_in_8bit and not eight.load_in_4bit
    four = M.load_settings(4, "cpu")["quantization_config"]
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4"
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    # A T4 (compute capability 7.5) computes in float16, an A100 in bfloat16.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert M.load_settings(4, "cuda:0")["quantization_config"].bnb_4bit_compute_dtype == torch.float16
    assert M.quantization_config(4).bnb_4bit_compute_dtype == torch.float16  # default: this machine's device
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert M.load_settings(4, "cuda:0")["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="compute_dtype"):
        M.quantization_config(4, torch.int8)


def test_load_model_rejects_a_bad_model_argument() -> None:
    with pytest.raises(TypeError, match="model"):
        M.load_model(42, 16)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Configs and the meta device
# --------------------------------------------------------------------------------------------
def test_transformers_config_reads_presets_paths_and_dicts(tmp_path) -> None:
    from course_utils.configs import resolve_config

    by_name = M.transformers_config(STANDIN_CONFIG)
    by_path = M.transformers_config(resolve_config(STANDIN_CONFIG))
    by_dict = M.transformers_config(TINY)
    assert by_name.model_type == by_path.model_type == "llama" and by_name.hidden_size == by_path.hidden_size == 576
    assert by_dict.hidden_size == 64 and by_dict.num_hidden_layers == 2
    assert "_source" not in by_name.to_dict()  # the shipped file's note is dropped
    with pytest.raises(ValueError, match="model_type"):
        M.transformers_config({k: v for k, v in TINY.items() if k != "model_type"})
    with pytest.raises(ValueError, match="config"):
        M.transformers_config("no-such-preset")


def test_meta_model_builds_shapes_without_memory() -> None:
    model = M.meta_model(dict(TINY))
    assert next(model.parameters()).device.type == "meta" and model.config.hidden_size == 64


# --------------------------------------------------------------------------------------------
# On a tiny stand-in: the CPU repack pitfall, generation
# --------------------------------------------------------------------------------------------
needs_bnb = pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")


def _linear4bit_layers(model) -> list:
    bnb = import_bitsandbytes()
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def _load_4bit_as_is(folder):
    """The same from_pretrained call as load_model's, without keep_4bit_trainable_on_cpu: the layers as loaded."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, **M.load_settings(4, "cpu"))


@needs_bnb
def test_the_repack_guard_catches_repacked_weights_on_any_cpu(tiny_standin) -> None:
    """The guard, tested by marking a layer as bitsandbytes' repack does: it needs no AVX-512-bf16."""
    model = _load_4bit_as_is(tiny_standin)  # as loaded: no switch yet
    assert M.keep_4bit_trainable_on_cpu(model) == 2 * 7  # 2 layers x 7 projections
    assert all(m.support_avx512bf16_for_cpu is False for m in _linear4bit_layers(model))
    _linear4bit_layers(model)[3].weight.quant_state.packing_format_for_cpu = True  # what the repack sets
    with pytest.raises(RuntimeError, match="repacked"):
        M.keep_4bit_trainable_on_cpu(model)


@needs_bnb
@pytest.mark.parametrize("cpu_has_avx512bf16", [True, False])
def test_the_repack_decision_with_the_feature_on_and_off(tiny_standin, monkeypatch, cpu_has_avx512bf16) -> None:
    """bitsandbytes asks the CPU once per layer, at construction; a no-grad forward then repacks where it said yes.

    The CPU's answer is patched both ways, so the premise holds (or fails) on every machine. The repack itself is
    replaced by a recorder that stops the forward: a native AVX-512-bf16 kernel must never run on a CPU without
    those instructions (it would crash the process).
    """
    from bitsandbytes.nn import modules

    if not hasattr(modules, "has_avx512bf16"):
        pytest.skip("bitsandbytes before 0.49 never repacks a 4-bit layer for a CPU")

    class Repacked(Exception):
        pass

    def recorder(weight, quant_state):
        raise Repacked

    monkeypatch.setattr(modules, "has_avx512bf16", lambda: cpu_has_avx512bf16)
    monkeypatch.setattr(modules, "_convert_weight_packed_for_cpu", recorder)
    untouched = _load_4bit_as_is(tiny_standin)
    assert all(m.support_avx512bf16_for_cpu is cpu_has_avx512bf16 for m in _linear4bit_layers(untouched))
    layer = _linear4bit_layers(untouched)[0]
    x = torch.randn(2, layer.in_features)
    if cpu_has_avx512bf16:  # the pitfall: an inference forward would repack the weights
        with pytest.raises(Repacked), torch.no_grad():
            layer.eval()(x)
    else:
        with torch.no_grad():
            layer.eval()(x)  # nothing to repack on this CPU
    kept = M.load_model(tiny_standin, 4, device="cpu")  # the default: the switch is off from the load on
    assert all(m.support_avx512bf16_for_cpu is False for m in _linear4bit_layers(kept))
    with torch.no_grad():
        _linear4bit_layers(kept)[0].eval()(x)  # no repack, whatever the CPU says: still trainable
    tok = M.load_tokenizer(tiny_standin)
    M.generate_text(kept, tok, "Hello", max_new_tokens=2)
    assert M.keep_4bit_trainable_on_cpu(kept) == 2 * 7


@needs_bnb
def test_a_real_repack_on_a_cpu_with_avx512bf16(tiny_standin) -> None:
    """Only where the CPU really has AVX-512-bf16: generate repacks an untouched model, and the guard sees it."""
    from bitsandbytes import functional

    if not getattr(functional, "has_avx512bf16", lambda: False)():  # absent before bitsandbytes 0.49
        pytest.skip("this CPU has no AVX-512-bf16; the decision is tested both ways above")
    fresh = _load_4bit_as_is(tiny_standin)
    M.generate_text(fresh, M.load_tokenizer(tiny_standin), "Hello", max_new_tokens=2)  # repacks for inference
    with pytest.raises(RuntimeError, match="repacked"):
        M.keep_4bit_trainable_on_cpu(fresh)


def test_generate_bad_input(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    model = M.load_model(tiny_standin, 16, device="cpu")
    with pytest.raises(ValueError, match="prompt"):
        M.generate_text(model, tok, "")
    with pytest.raises(ValueError, match="max_new_tokens"):
        M.generate_text(model, tok, "Hi", max_new_tokens=0)
    with pytest.raises(TypeError, match="max_new_tokens"):
        M.generate_text(model, tok, "Hi", max_new_tokens=2.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The dtype keyword: ``dtype=`` on every supported transformers (4.57 and newer)
# --------------------------------------------------------------------------------------------
def test_the_dtype_keyword_sets_the_dtype_of_a_model_built_from_a_config() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(M.transformers_config(TINY), **M.dtype_kwargs(torch.bfloat16))
    assert next(model.parameters()).dtype == torch.bfloat16
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
    finally:
        type(tok).__call__ = real_call
    assert "token_type_ids" not in seen and "input_ids" in seen


# --------------------------------------------------------------------------------------------
# Nothing global is left behind: warning filters and logger levels are what they were
# --------------------------------------------------------------------------------------------
def test_loading_leaves_warnings_and_loggers_as_they_were(tiny_standin) -> None:
    import logging
    import warnings

    filters = list(warnings.filters)
    levels = {name: logging.getLogger(name).level for name in ("bitsandbytes", "transformers", "peft")}
    model = M.load_model(tiny_standin, 16, device="cpu")
    M.generate_text(model, M.load_tokenizer(tiny_standin), "Hi", max_new_tokens=1)
    assert warnings.filters == filters
    assert {name: logging.getLogger(name).level for name in levels} == levels


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
    from course_utils.footprint import footprint_bytes

    assert M.quantization_config(16) is None
    for bits in (8, 4):
        with pytest.raises(RuntimeError, match=f"loading in {bits} bits needs bitsandbytes.*pip install"):
            M.quantization_config(bits, torch.bfloat16)
        with pytest.raises(RuntimeError, match="needs bitsandbytes"):
            M.load_model(tiny_standin, bits, device="cpu")
    model = M.load_model(tiny_standin, 16, device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert M.keep_4bit_trainable_on_cpu(model) == 0
    assert footprint_bytes(model, 4) < footprint_bytes(model, 16)  # 4-bit sizes can still be computed


# --------------------------------------------------------------------------------------------
# Printable text, quantized layers, and 4-bit models kept trainable from the load on
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, shown",
    [
        ("The capital of France is Paris.", "The capital of France is Paris."),
        ("noise\x12 and \x00", "noise\\x12 and \\x00"),
        ("bad byte \ufffd, new\nline, tab\t", "bad byte \\ufffd, new\\nline, tab\\t"),
        ("zero\u200bwidth, é and 漢", "zero\\u200bwidth, é and 漢"),
        ("\x1b[2Jclear screen", "\\x1b[2Jclear screen"),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text, shown) -> None:
    assert units.printable(text) == shown
    assert all(ch.isprintable() for ch in units.printable(text))
    with pytest.raises(TypeError, match="text"):
        units.printable(b"bytes")  # type: ignore[arg-type]


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_a_4_bit_load_is_kept_trainable_and_its_layers_counted(tiny_standin) -> None:
    bnb = import_bitsandbytes()
    model = M.load_model(tiny_standin, 4, device="cpu")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 2 * 7
    assert all(m.support_avx512bf16_for_cpu is False for m in layers)  # the repack is off from the load on
    untouched = _load_4bit_as_is(tiny_standin)
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in untouched.modules()) == 14
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in M.load_model(tiny_standin, 16, device="cpu").modules())
