"""course_utils.standin: the stand-in model, built once from a shipped config into a cache folder, and the choice.

The online branch (the Hub answers: the real SmolLM2-135M-Instruct, on a CPU as on a GPU) cannot reach the Hub
here, so its tests patch the reachability check and the download: ``from_pretrained`` gets the Hub id and
loads the tiny model from disk instead; everything after that is the real code, and notebook 01b's own first
cells run on it.

The tests build a tiny Llama (hidden 64, 2 layers) through the same code path as the 135M stand-in, so they
stay fast; the 135M model itself is exercised by notebook 01b. The tiny config is in
``tiny_models.py``; the ``tiny_standin`` fixture in ``conftest.py``.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
import torch

from course_utils import hub, standin
from course_utils.footprint import count_model_parameters
from course_utils.quiet import import_bitsandbytes
from course_utils.hub import REAL_MODEL
from course_utils.models import generate_text, load_model, load_tokenizer, meta_model
from course_utils.tickets import load_tickets, training_example
from tiny_models import TINY, tiny_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_packaged_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline means the stand-in here: the packaged copy's own choice is tested in test_packaged.py."""
    from course_utils import packaged

    monkeypatch.setattr(packaged, "availability", lambda folder=None: None)


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The Hub answers (the reachability check is patched; its calls are recorded); no offline switch is set."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    calls: list[float] = []
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: calls.append(timeout_s) or True)
    return calls


@pytest.fixture
def fake_download(monkeypatch: pytest.MonkeyPatch, tiny_standin: str) -> list[tuple[str, str]]:
    """Replace the Hub download: from_pretrained(<Hub id>) records the id and loads the tiny model from disk.

    Everything after the download is the real code: transformers' loading, bitsandbytes, peft.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    asked: list[tuple[str, str]] = []
    real_model, real_tokenizer = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def model_from_hub(name, *args, **kwargs):
        asked.append(("model", name))
        return real_model(tiny_standin if name == REAL_MODEL else name, *args, **kwargs)

    def tokenizer_from_hub(name, *args, **kwargs):
        asked.append(("tokenizer", name))
        return real_tokenizer(tiny_standin if name == REAL_MODEL else name, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model_from_hub)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tokenizer_from_hub)
    return asked


def _no_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("the stand-in was built although the Hub answered")

    monkeypatch.setattr(standin, "ensure_standin", forbidden)


def test_choose_model_labels_the_standin(monkeypatch, tmp_path) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket, "create_connection", forbidden)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "cached_on_disk", lambda name: False)
    monkeypatch.setattr(standin, "ensure_standin", lambda seed=0: tmp_path)
    choice = standin.choose_model()
    assert choice.is_standin and "STAND-IN" in choice.label and "random weights" in choice.label
    assert choice.name == str(tmp_path) and "HF_HUB_OFFLINE" in choice.reason
    assert hub.ModelChoice(REAL_MODEL, False, "hub").label == f"[{REAL_MODEL}]"


@pytest.mark.parametrize("gpu", [False, True])
def test_a_reachable_hub_gives_the_real_model_on_a_cpu_too(monkeypatch, online, gpu) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    _no_standin(monkeypatch)
    choice = standin.choose_model()
    assert choice == hub.ModelChoice(REAL_MODEL, False, choice.reason) and online == [1.5]
    assert choice.label == "[HuggingFaceTB/SmolLM2-135M-Instruct]" and "reachable" in choice.reason


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_online_branch_on_a_cpu_down_to_training(monkeypatch, online, fake_download) -> None:
    """Hub reachable, no GPU: the real model's Hub id goes to from_pretrained, and everything after it works."""
    from course_utils import lora

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _no_standin(monkeypatch)
    choice = standin.choose_model()
    model_16 = load_model(choice, 16)
    model_4 = load_model(choice, 4)
    tokenizer = load_tokenizer(choice)
    assert fake_download == [("model", REAL_MODEL), ("model", REAL_MODEL), ("tokenizer", REAL_MODEL)]
    assert model_16.dtype == torch.bfloat16 and next(model_16.parameters()).device.type == "cpu"
    assert model_4.get_memory_footprint() < model_16.get_memory_footprint()
    qlora = lora.add_lora(model_4)
    batch = training_example(tokenizer, load_tickets()[0])
    qlora.train()
    qlora(**batch).loss.backward()
    assert all(p.grad is not None for p in qlora.parameters() if p.requires_grad)
    line = choice.show_text(generate_text(qlora, tokenizer, "The capital of France is", max_new_tokens=2))
    assert line.startswith(f"[{REAL_MODEL}] answer: 'The capital of France is")


def test_notebook_01b_online_down_to_its_first_loads(monkeypatch, online, fake_download, capsys) -> None:
    """Notebook 01b's own cells, Hub reachable, no GPU: it picks the real model and loads it by its Hub id."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import build_notebooks

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _no_standin(monkeypatch)
    cells = build_notebooks.parse_source((ROOT / "notebooks" / "src" / "01b_real_models_qlora.py").read_text())
    code = [c.source for c in cells if c.cell_type == "code" and "setup_report()" not in c.source]
    last = next(i for i, source in enumerate(code) if "course_config = BitsAndBytesConfig(" in source)
    namespace: dict = {}
    for source in code[: last + 1]:
        exec(compile(source, "01b", "exec"), namespace)  # the notebook's own cells, in order
    out = capsys.readouterr().out
    assert namespace["choice"].name == REAL_MODEL and not namespace["choice"].is_standin
    assert f"[{REAL_MODEL}]\nwhy: the Hub is reachable" in out and "STAND-IN" not in out
    assert fake_download[:2] == [("tokenizer", REAL_MODEL), ("model", REAL_MODEL)]
    assert "16-bit:" in out and "weights in torch.bfloat16" in out


def test_show_text_never_prints_control_characters() -> None:
    noise = "The capital of France isqu bes\x12 no\ufffdasd\x1b[2J\n"
    line = hub.ModelChoice("/standin", True, "offline").show_text(noise)
    assert "random-weight output" in line and "noise" in line and line.startswith("[STAND-IN")
    assert not any(not ch.isprintable() for ch in line)
    assert "\\x12" in line and "\\ufffd" in line and "\\x1b[2J" in line and "\\n" in line
    real = hub.ModelChoice(REAL_MODEL, False, "hub").show_text("The capital of France is Paris.")
    assert real == f"[{REAL_MODEL}] answer: 'The capital of France is Paris.'"
    with pytest.raises(TypeError, match="text"):
        hub.ModelChoice(REAL_MODEL, False, "hub").show_text(None)  # type: ignore[arg-type]


def test_the_standin_architecture_has_the_lessons_count() -> None:
    smol = meta_model(standin.STANDIN_CONFIG)
    assert count_model_parameters(smol) == 134_515_008


def test_standin_is_reproducible(tiny_standin, tmp_path) -> None:
    other = standin.ensure_standin(tiny_config(), seed=0, folder=tmp_path)
    a, b = load_model(tiny_standin, 16, device="cpu"), load_model(other, 16, device="cpu")
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert "ensure_standin" in (other / "STANDIN.txt").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="seed"):
        standin.ensure_standin(tiny_config(), seed=-1, folder=tmp_path)


def test_standin_from_a_dict_config(tmp_path) -> None:
    path = standin.ensure_standin(dict(TINY), folder=tmp_path)  # read by configs.read_config
    assert (path / "config.json").exists() and path.name.startswith("standin-llama-")


def test_standin_cache_falls_back_to_the_temp_dir(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(blocker / "cache"))  # cannot be created
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))  # the cache's fallback folder
    path = standin.ensure_standin(tiny_config(), seed=0)
    assert path.parent == tmp_path / "tmp" / "course_utils" and (path / "config.json").exists()
    with pytest.raises(OSError):
        standin.ensure_standin(tiny_config(), seed=0, folder=blocker / "cache")  # an explicit folder is not replaced


def test_standin_tokenizer_gives_only_what_a_llama_takes(tiny_standin, monkeypatch) -> None:
    """transformers 4.57's tokenizer class lists token_type_ids by default; generate(**inputs) then raised."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    settings = json.loads((Path(tiny_standin) / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["model_input_names"] == ["input_ids", "attention_mask"] == list(standin.MODEL_INPUTS)
    old_default = ["input_ids", "token_type_ids", "attention_mask"]  # PreTrainedTokenizerFast's, transformers 4.57
    monkeypatch.setattr(PreTrainedTokenizerFast, "model_input_names", old_default)
    tokenizer = AutoTokenizer.from_pretrained(tiny_standin)
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    assert sorted(inputs) == ["attention_mask", "input_ids"]
    model = load_model(tiny_standin, 16, device="cpu")
    out = model.generate(**inputs, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 2)


def test_a_standin_built_the_old_way_is_not_reused(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(standin, "_FORMAT", 1)
    old = standin.ensure_standin(tiny_config(), seed=0, folder=tmp_path)
    monkeypatch.setattr(standin, "_FORMAT", 2)
    new = standin.ensure_standin(tiny_config(), seed=0, folder=tmp_path)
    assert new != old and (new / "config.json").exists()


@pytest.mark.parametrize("value, source", [("standin", "standin"), (" Packaged ", "packaged"), ("real", "real")])
def test_course_model_source_names_the_weights(monkeypatch, value, source) -> None:
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: pytest.fail("the Hub was asked"))
    monkeypatch.setenv(hub.MODEL_SOURCE_ENV, value)
    decision = hub.decide_source()
    assert decision.source == source and f"{hub.MODEL_SOURCE_ENV}={source}" in decision.reason


def test_course_model_source_rejects_other_values(monkeypatch) -> None:
    monkeypatch.setenv(hub.MODEL_SOURCE_ENV, "hub")
    with pytest.raises(ValueError, match="COURSE_MODEL_SOURCE must be one of real, packaged, standin"):
        hub.decide_source()


def test_forced_standin_skips_an_installed_packaged_copy(monkeypatch, tmp_path) -> None:
    from course_utils import packaged

    monkeypatch.setenv(hub.MODEL_SOURCE_ENV, "standin")
    monkeypatch.setattr(packaged, "availability", lambda folder=None: "converted")
    monkeypatch.setattr(packaged, "convert", lambda folder=None: pytest.fail("the packaged copy was loaded"))
    monkeypatch.setattr(standin, "ensure_standin", lambda seed=0: tmp_path)
    choice = standin.choose_model()
    assert choice.is_standin and choice.name == str(tmp_path) and "COURSE_MODEL_SOURCE=standin" in choice.reason


def test_forced_packaged_copy_never_falls_back_to_the_standin(monkeypatch) -> None:
    monkeypatch.setenv(hub.MODEL_SOURCE_ENV, "packaged")
    monkeypatch.setattr(standin, "ensure_standin", lambda seed=0: pytest.fail("the stand-in was built"))
    with pytest.raises(RuntimeError, match="COURSE_MODEL_SOURCE=packaged .*the packaged copy is not installed"):
        standin.choose_model()  # the autouse fixture: no packaged copy here
