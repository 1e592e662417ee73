"""course_utils.configs: one reader for the shipped architecture configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_utils import configs


def test_presets_are_the_three_shipped_configs() -> None:
    assert set(configs.config_presets()) == {"smollm2-135m", "qwen2.5-1.5b-instruct", "qwen3-4b-instruct-2507"}


@pytest.mark.parametrize("name", ["smollm2-135m", "SmolLM2-135M.json", "smollm2-135m.json"])
def test_preset_names_resolve(name: str) -> None:
    assert configs.resolve_config(name).name == "smollm2-135m.json"


def test_read_drops_notes_and_keeps_sizes() -> None:
    cfg = configs.read_config("smollm2-135m")
    assert "_source" not in cfg
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (576, 30, 49152)


def test_path_and_dict_read_the_same(tmp_path: Path) -> None:
    own = tmp_path / "config.json"
    own.write_text(json.dumps(configs.read_config("smollm2-135m")))
    assert configs.read_config(own) == configs.read_config(configs.read_config("smollm2-135m"))


def test_bad_configs_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a readable file nor a preset"):
        configs.read_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        configs.read_config(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        configs.read_config(listed)
    with pytest.raises(ValueError, match="hidden_size"):
        configs.read_config({"model_type": "llama"})
    with pytest.raises(TypeError, match="config"):
        configs.resolve_config(3)  # type: ignore[arg-type]
