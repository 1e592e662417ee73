"""The stand-in: a real architecture with random weights, for machines that cannot reach the Hub.

Where the real model (SmolLM2-135M-Instruct) cannot be downloaded (see :func:`course_utils.hub.decide_source`),
the course uses the same SmolLM2-135M architecture, rebuilt from the config file shipped in ``data/configs``
(exactly 134,515,008 parameters), with random weights drawn from a fixed random seed and saved once to a cache
folder outside the repository. The stand-in then goes through the very same ``from_pretrained`` call, the same
``BitsAndBytesConfig`` and the same peft calls as the real model, so every footprint and parameter count is
real; only its generated text is noise.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from course_utils import checks, data_path
from course_utils.hub import REAL_MODEL, decide_source
from course_utils.models import dtype_kwargs, printable, transformers_config
from course_utils.quiet import quiet_libraries

#: The stand-in's architecture config, shipped in ``data/configs`` (file name).
STANDIN_CONFIG = "smollm2-135m.json"
#: Exact parameter count of the SmolLM2-135M architecture (tied embeddings), the lesson's number.
STANDIN_PARAMS = 134_515_008
#: The dtype the stand-in's random weights are *stored* in on disk (loading casts per device).
STANDIN_STORAGE_DTYPE = torch.bfloat16
#: Where the stand-in's weights are cached when ``COURSE_UTILS_CACHE`` is not set (never inside the repo).
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "course_utils"


def cache_dir() -> Path:
    """Folder for the stand-in's weights: ``$COURSE_UTILS_CACHE``, else ``~/.cache/course_utils``."""
    return Path(os.environ.get("COURSE_UTILS_CACHE", "") or DEFAULT_CACHE)


def _standin_key(config: Any, seed: int) -> str:
    import transformers

    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(f"{text}|{seed}|{transformers.__version__}|{torch.__version__}".encode()).hexdigest()[:12]


def ensure_standin(config: Any = STANDIN_CONFIG, *, seed: int = 0, folder: str | Path | None = None) -> Path:
    """Build the stand-in once (random weights from ``seed``, bfloat16, with the offline tokenizer); return its folder.

    ``config``: a transformers config, or a preset name, path or dict for
    :func:`course_utils.models.transformers_config`. Saved with ``save_pretrained`` to a folder under
    :func:`cache_dir` (outside the repository) and reused afterwards, so that the stand-in loads through
    ``from_pretrained`` exactly like a Hub model. The build is written to a temporary folder first and renamed
    at the end, so an interrupted build leaves no half-written model behind. The global random state is left
    untouched.
    """
    from transformers import AutoModelForCausalLM

    checks.integer(seed, "seed", 0)
    if isinstance(config, (str, os.PathLike, Mapping)):
        config = transformers_config(config)
    base = Path(folder) if folder is not None else cache_dir()
    target = base / f"standin-{config.model_type}-seed{seed}-{_standin_key(config, seed)}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        if folder is not None:
            raise
        return ensure_standin(config, seed=seed, folder=Path(tempfile.gettempdir()) / "course_utils")
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        with quiet_libraries(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # bfloat16 on disk is a storage choice (half the bytes of float32, float32's range);
            # load_model casts to the dtype of the device that loads it (float16 on a T4).
            model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(STANDIN_STORAGE_DTYPE))
            model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(data_path("standin", name), tmp / name)
        (tmp / "STANDIN.txt").write_text(
            "Course stand-in: a real architecture with RANDOM weights (seed "
            f"{seed}). Its generated text is noise. Built by course_utils.standin.ensure_standin.\n",
            encoding="utf-8")
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same build first: keep theirs
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class ModelChoice:
    """The model the notebook will use: where it loads from, whether it is the stand-in, and why."""

    name: str
    is_standin: bool
    reason: str

    @property
    def label(self) -> str:
        """Prefix for every printed line, so nobody mistakes stand-in numbers or text for the real model's."""
        return "[STAND-IN: SmolLM2-135M architecture, random weights]" if self.is_standin else f"[{self.name}]"

    def show_text(self, text: str) -> str:
        """One line for generated ``text``: labelled, and with control characters escaped (never printed raw).

        The stand-in's random weights write noise, often with control bytes in it: the line says so, and
        :func:`course_utils.models.printable` turns each unprintable character into an escape such as ``\\x12``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a string (what generate_text returned), got {type(text).__name__}")
        if self.is_standin:
            return (f"{self.label} random-weight output (noise, not an answer; unprintable characters escaped): "
                    f"'{printable(text)}'")
        return f"{self.label} answer: '{printable(text)}'"


def choose_model(model_name: str = REAL_MODEL, *, timeout_s: float = 1.5, seed: int = 0) -> ModelChoice:
    """The real model if the Hub is reachable (CPU or GPU), else the stand-in, built on first use.

    Decided by :func:`course_utils.hub.decide_source`; the stand-in is built by :func:`ensure_standin`.
    """
    decision = decide_source(model_name, timeout_s=timeout_s)
    if decision.source == "real":
        return ModelChoice(model_name, False, decision.reason)
    return ModelChoice(str(ensure_standin(seed=seed)), True, decision.reason)


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
    if choice.is_standin:
        return f"it downloads from the Hub, which is not available here ({choice.reason})"
    if no_4bit:
        return no_4bit
    return None
