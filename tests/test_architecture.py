"""course_utils.architecture: one reader of a decoder's architecture and one parameter counter."""

from __future__ import annotations

import json

import pytest

from course_utils import architecture as A
from course_utils.configs import config_presets, read_config, resolve_config


# --------------------------------------------------------------------------------------------
# Exact counts from configs
# --------------------------------------------------------------------------------------------
def test_smollm2_counts_by_arithmetic() -> None:
    assert A.count_parameters("smollm2-135m") == 134_515_008
    assert A.lora_adapter_params("smollm2-135m", 8, ("q_proj", "v_proj")) == 460_800
    arch = A.Architecture.from_config("smollm2-135m")
    assert (arch.name, arch.params, arch.adapter_params(8)) == ("smollm2-135m", 134_515_008, 460_800)


def test_preset_resolution_and_the_source_key(tmp_path) -> None:
    presets = config_presets()
    assert {"smollm2-135m", "qwen2.5-1.5b-instruct", "qwen3-4b-instruct-2507"} <= set(presets)
    assert resolve_config("SmolLM2-135M.json") == presets["smollm2-135m"]
    assert "_source" in json.loads(presets["smollm2-135m"].read_text())
    assert "_source" not in read_config("smollm2-135m")
    own = tmp_path / "config.json"
    own.write_text(presets["smollm2-135m"].read_text())
    assert resolve_config(own) == own and A.count_parameters(own) == 134_515_008


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-1.5b-instruct", "qwen3-4b-instruct-2507"])
@pytest.mark.parametrize("rank,targets", [(8, ("q_proj", "v_proj")), (4, ("all-linear",))])
def test_arithmetic_matches_transformers_and_peft_on_the_meta_device(preset: str, rank: int, targets) -> None:
    total, trained = A.count_on_meta(preset, rank, targets)
    assert A.count_parameters(preset) == total
    assert A.lora_adapter_params(preset, rank, targets) == trained


def test_meta_count_of_smollm2_is_the_lessons_number() -> None:
    assert A.count_on_meta("smollm2-135m", 8) == (134_515_008, 460_800)
    assert A.count_on_meta("smollm2-135m") == (134_515_008, None)


def test_untied_head_and_other_architectures_fall_back_to_meta() -> None:
    cfg = read_config("smollm2-135m")
    untied = dict(cfg, tie_word_embeddings=False)
    assert A.count_parameters(untied) == 134_515_008 + 49152 * 576
    other = dict(cfg, model_type="gemma", head_dim=64)
    assert A.count_parameters(other) == A.count_on_meta(other)[0]


def test_targets_normalisation() -> None:
    assert A.normalize_targets("q_proj, v_proj,q_proj") == ("q_proj", "v_proj")
    assert A.normalize_targets(["all-linear"]) == A.PROJECTIONS


def test_bad_targets() -> None:
    with pytest.raises(ValueError, match="unknown module name"):
        A.normalize_targets("q_proj,lm_head")
    with pytest.raises(ValueError, match="no module named"):
        A.normalize_targets(" , ")
    with pytest.raises(TypeError, match="targets"):
        A.normalize_targets(7)


def test_unsupported_architecture_and_bad_rank() -> None:
    with pytest.raises(ValueError, match="model_type must be one of llama, mistral, qwen2, qwen3; got 'gemma'"):
        A.Architecture.from_config(dict(read_config("smollm2-135m"), model_type="gemma"))
    with pytest.raises(ValueError, match="lora_rank"):
        A.Architecture.from_config("smollm2-135m").adapter_params(0)
