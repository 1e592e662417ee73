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

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

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
#: What the stand-in's tokenizer returns. A Llama takes no ``token_type_ids``: transformers 4.57's
#: ``PreTrainedTokenizerFast`` lists them by default, and ``generate(**inputs)`` then raises ValueError.
MODEL_INPUTS = ("input_ids", "attention_mask")
#: The layout of a built stand-in folder, part of its cache key: raise it whenever the build writes something
#: else, so that no folder built the old way is reused (2: the tokenizer names its ``model_input_names``).
_FORMAT = 2


def _standin_key(config: Any, seed: int) -> str:
    import transformers

    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    versions = f"{transformers.__version__}|{torch.__version__}"
    return hashlib.sha256(f"{text}|{seed}|{versions}|format {_FORMAT}".encode()).hexdigest()[:12]


def _write_tokenizer(folder: Path) -> None:
    """The shipped offline tokenizer, its settings naming the inputs a Llama takes (:data:`MODEL_INPUTS`)."""
    shutil.copy(data_path("standin", "tokenizer.json"), folder / "tokenizer.json")
    settings = json.loads(data_path("standin", "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["model_input_names"] = list(MODEL_INPUTS)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


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
        _write_tokenizer(tmp)
        note = f"Course stand-in: a real architecture with RANDOM weights (seed {seed}). Its generated text is noise."
        (tmp / "STANDIN.txt").write_text(f"{note} Built by course_utils.standin.ensure_standin.\n", encoding="utf-8")

    return build_once(target, build, lambda done: (done / "config.json").exists())


def choose_model() -> ModelChoice:
    """SmolLM2-135M-Instruct from the Hub if it is reachable (CPU or GPU), else the packaged copy, else the stand-in.

    Decided by :func:`course_utils.hub.decide_source` (or named by ``COURSE_MODEL_SOURCE``). The packaged copy is
    converted once by :func:`course_utils.packaged.convert`; the stand-in is built once by :func:`ensure_standin`.
    A packaged copy that fails to convert falls back to the stand-in, and the reason says why; one named by
    ``COURSE_MODEL_SOURCE=packaged`` raises instead.
    """
    decision = decide_source()
    if decision.source == "real":
        return ModelChoice(REAL_MODEL, False, decision.reason)
    if decision.source == "standin":
        return ModelChoice(str(ensure_standin()), True, decision.reason)
    found = packaged.availability()
    if found is None:
        why = f"{decision.reason}, and the packaged copy is not installed ({packaged.PIP_INSTALL})"
        if decision.source == "packaged":  # asked for by name: no quiet fallback
            raise RuntimeError(why)
        return ModelChoice(str(ensure_standin()), True, why)
    now = " and converted" if found == "converted" else ": converted once now, then reused"
    reason = f"{decision.reason}; the packaged copy is installed{now}"
    try:
        return ModelChoice(str(packaged.convert()), False, reason, "packaged")
    except Exception as error:  # any failure to convert: the stand-in, saying why (unless asked for by name)
        if decision.source == "packaged":
            raise
        reason = f"{reason}, but its conversion failed ({type(error).__name__}: {error})"
        return ModelChoice(str(ensure_standin()), True, reason)


def lesson_model_skip_reason(choice: ModelChoice, no_4bit: str | None = None) -> str | None:
    """Why the lesson's own Qwen2.5-1.5B-Instruct is not loaded here, or None when it is (a GPU, the Hub, 4 bits).

    It is the GPU path: on a CPU its 4-bit load alone takes minutes. ``choice`` tells whether the Hub answered;
    ``no_4bit`` is :func:`course_utils.models.bitsandbytes_missing`'s answer.
    """
    checks.instance(choice, "choice", ModelChoice, "the ModelChoice from choose_model")
    checks.instance(no_4bit, "no_4bit", (str, type(None)), "None or the reason string of bitsandbytes_missing")
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU (on a CPU its 4-bit load alone takes minutes), and there is none here"
    if not choice.from_hub:
        return f"it downloads from the Hub, which is not available here ({choice.reason})"
    return no_4bit or None  # bitsandbytes is missing, or nothing stops it
