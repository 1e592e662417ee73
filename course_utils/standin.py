"""The model a notebook uses (:func:`choose_model`), and the stand-in: a real architecture with random weights.

:func:`choose_model` follows :func:`course_utils.hub.decide_source`: the Hub original of SmolLM2-135M-Instruct,
else the packaged copy (:mod:`course_utils.packaged`, converted once), else the stand-in. Its
:class:`ModelChoice` says in every printed line which weights ran.

Where neither the Hub nor the packaged copy is available, the course uses the same SmolLM2-135M architecture,
rebuilt from the config file shipped in ``data/configs`` (exactly 134,515,008 parameters), with random weights
drawn from a fixed random seed and saved once to a cache folder outside the repository. The stand-in then goes
through the very same ``from_pretrained`` call, the same ``BitsAndBytesConfig`` and the same peft calls as the
real model, so every footprint and parameter count is real; only its generated text is noise.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from course_utils import checks, data_path, packaged
from course_utils.cache import build_once, writable_cache_dir
from course_utils.hub import REAL_MODEL, ModelChoice, decide_source
from course_utils.models import dtype_kwargs, transformers_config
from course_utils.quiet import quiet_libraries

#: The stand-in's architecture config, shipped in ``data/configs`` (file name).
STANDIN_CONFIG = "smollm2-135m.json"
#: The dtype the stand-in's random weights are *stored* in on disk (loading casts per device).
_STORAGE_DTYPE = torch.bfloat16


def _standin_key(config: Any, seed: int) -> str:
    import transformers

    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(f"{text}|{seed}|{transformers.__version__}|{torch.__version__}".encode()).hexdigest()[:12]


def ensure_standin(config: Any = STANDIN_CONFIG, *, seed: int = 0, folder: str | Path | None = None) -> Path:
    """Build the stand-in once (random weights from ``seed``, bfloat16, with the offline tokenizer); return its folder.

    ``config``: a transformers config, or a preset name, path or dict for
    :func:`course_utils.models.transformers_config`. Saved with ``save_pretrained`` to a folder under ``folder``,
    else under :func:`course_utils.cache.writable_cache_dir` (outside the repository), and reused afterwards, so
    that the stand-in loads through ``from_pretrained`` exactly like a Hub model. The build is written to a
    temporary folder first and renamed at the end, so an interrupted build leaves no half-written model behind.
    The global random state is left untouched.
    """
    from transformers import AutoModelForCausalLM

    checks.integer(seed, "seed", 0)
    if isinstance(config, (str, os.PathLike, Mapping)):
        config = transformers_config(config)
    target = writable_cache_dir(folder) / f"standin-{config.model_type}-seed{seed}-{_standin_key(config, seed)}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target

    def build(tmp: Path) -> None:
        with quiet_libraries(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # bfloat16 on disk is a storage choice (half the bytes of float32, float32's range);
            # load_model casts to the dtype of the device that loads it (float16 on a T4).
            model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(_STORAGE_DTYPE))
            model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(data_path("standin", name), tmp / name)
        (tmp / "STANDIN.txt").write_text(
            "Course stand-in: a real architecture with RANDOM weights (seed "
            f"{seed}). Its generated text is noise. Built by course_utils.standin.ensure_standin.\n",
            encoding="utf-8")

    return build_once(target, build, lambda done: (done / "config.json").exists())


def choose_model() -> ModelChoice:
    """SmolLM2-135M-Instruct from the Hub if it is reachable (CPU or GPU), else the packaged copy, else the stand-in.

    Decided by :func:`course_utils.hub.decide_source`. The packaged copy is converted once by
    :func:`course_utils.packaged.convert`; the stand-in is built once by :func:`ensure_standin`. A packaged copy
    that fails to convert falls back to the stand-in, and the reason says why.
    """
    decision = decide_source()
    if decision.source == "real":
        return ModelChoice(REAL_MODEL, False, decision.reason)
    found = packaged.availability()
    if found is None:
        why = f"{decision.reason}, and the packaged copy is not installed ({packaged.PIP_INSTALL})"
        return ModelChoice(str(ensure_standin()), True, why)
    reason = decision.reason + ("; the packaged copy is installed and converted" if found == "converted"
                                else "; the packaged copy is installed: converted once now, then reused")
    try:
        return ModelChoice(str(packaged.convert()), False, reason, "packaged")
    except Exception as error:  # noqa: BLE001 - any failure to convert means: use the stand-in, and say why
        reason = f"{reason}, but its conversion failed ({type(error).__name__}: {error})"
        return ModelChoice(str(ensure_standin()), True, reason)


def lesson_model_skip_reason(choice: ModelChoice, no_4bit: str | None = None) -> str | None:
    """Why the lesson's own Qwen2.5-1.5B-Instruct is not loaded here, or None when it is (a GPU, the Hub, 4 bits).

    It is the GPU path: on a CPU its 4-bit load alone takes minutes. ``choice`` tells whether the Hub answered;
    ``no_4bit`` is :func:`course_utils.models.bitsandbytes_missing`'s answer.
    """
    if not isinstance(choice, ModelChoice):
        raise TypeError(f"choice must be the ModelChoice from choose_model, got {type(choice).__name__}")
    if no_4bit is not None and not isinstance(no_4bit, str):
        raise TypeError(f"no_4bit must be None or the reason string of bitsandbytes_missing, got {no_4bit!r}")
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU (on a CPU its 4-bit load alone takes minutes), and there is none here"
    if not choice.from_hub:
        return f"it downloads from the Hub, which is not available here ({choice.reason})"
    if no_4bit:
        return no_4bit
    return None
