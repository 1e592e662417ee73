"""Architecture configs: the real models' ``config.json`` files shipped in ``data/configs``.

One reader for the whole course, so that every module treats a preset name, a path and a dict the
same way. The shipped files carry a ``_source`` note (where the config comes from); keys starting
with ``_`` are notes and are dropped on reading.
"""

import json
import re
import urllib.error
import urllib.request
import os
from pathlib import Path
from typing import Any, Mapping

from course_utils import checks

#: Sizes every decoder config must give as positive integers for the course's counts to work.
_REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def config_presets() -> dict[str, Path]:
    """The architecture configs shipped in ``data/configs``, by name (e.g. 'smollm2-135m')."""
    from course_utils import data_path

    return {p.stem: p for p in sorted(data_path("configs").glob("*.json"))}


def resolve_config(config: str | os.PathLike) -> Path:
    """The path of a config file: an existing path, or the name of a shipped preset (see :func:`config_presets`)."""
    checks.instance(config, "config", (str, os.PathLike), "a path or a preset name")
    path = Path(config).expanduser()
    if path.is_file():
        return path
    presets = config_presets()
    key = str(config).strip().lower().removesuffix(".json")
    if key in presets:
        return presets[key]
    raise ValueError(f"config {str(config)!r} is neither a readable file nor a preset ({', '.join(presets)})")


def config_name(config: str | os.PathLike | Mapping[str, Any]) -> str:
    """A short name for a config: the preset's or file's stem, or a dict's ``_name_or_path`` / ``model_type``."""
    if isinstance(config, Mapping):
        return str(config.get("_name_or_path") or config.get("model_type") or "custom")
    checks.instance(config, "config", (str, os.PathLike), "a preset name, a path or a dict")
    return Path(config).name.removesuffix(".json")


def read_config(config: str | os.PathLike | Mapping[str, Any], sizes: tuple[str, ...] = ()) -> dict[str, Any]:
    """An architecture config as a plain dict: from a mapping, a ``config.json`` path or a preset name.

    Keys starting with ``_`` are dropped. Raises ValueError naming ``config`` when the file cannot be read
    or does not give the decoder sizes (hidden size, layers, attention heads, vocabulary, and the further
    keys ``sizes`` names) as positive integers.
    """
    if isinstance(config, Mapping):
        raw: Any = dict(config)
    else:
        path = resolve_config(config)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"config {str(path)!r} is not a readable JSON file: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError("config must be a JSON object (a model's config.json)")
    cfg = {k: v for k, v in raw.items() if not str(k).startswith("_")}
    for key in (*_REQUIRED_SIZES, *sizes):
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config must give {key} as a positive integer (got {value!r})")
    return cfg


#: A Hub model id: ``ORG/NAME`` (letters, digits, ``-``, ``_``, ``.``).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def fetch_config(repo_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """A model's ``config.json`` from the Hugging Face Hub (that file only, never weights), read as above.

    Honours ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` (for gated models). Raises ValueError with one
    line that names the shipped presets and ``--config`` when the Hub cannot be asked (offline, unreachable),
    the model is gated or unknown, or the file is not a decoder config.
    """
    from course_utils.hub import hub_address, hub_offline_env, hub_reachable

    if not isinstance(repo_id, str) or not _HUB_ID.match(repo_id.strip()):
        raise ValueError(f"{repo_id!r} is not a Hub model id of the form ORG/NAME (e.g. HuggingFaceTB/SmolLM2-135M)")
    repo_id = repo_id.strip()
    instead = f"use a shipped preset ({', '.join(config_presets())}) or --config PATH to a config.json you have"
    if hub_offline_env():
        raise ValueError(f"HF_HUB_OFFLINE is set, so {repo_id}'s config.json cannot be read from the Hub; {instead}")
    if not hub_reachable(timeout_s=3.0):  # one quick try, so a missing network never hangs on DNS
        host, port = hub_address()
        raise ValueError(f"the Hub ({host}:{port}) did not answer within 3 s (offline?); {instead}")
    endpoint = (os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co").rstrip("/")
    token = os.environ.get("HF_TOKEN", "").strip()
    headers = {"User-Agent": "course-utils", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"{endpoint}/{repo_id}/resolve/main/config.json", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            cfg = json.loads(answer.read(5_000_000).decode("utf-8"))
    except urllib.error.HTTPError as err:  # before URLError and OSError: it is both
        gated = "is gated or private (accept its licence on the Hub and set HF_TOKEN)"
        missing = "is not on the Hub, or has no config.json"
        why = {401: gated, 403: gated, 404: missing}.get(err.code, f"could not be read (HTTP {err.code})")
        raise ValueError(f"{repo_id} {why}; {instead}") from None
    except (urllib.error.URLError, OSError) as err:  # a URLError says why in its reason
        raise ValueError(f"the Hub ({endpoint}) is not reachable ({getattr(err, 'reason', err)}); {instead}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{repo_id}'s config.json is not JSON; {instead}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):  # a multimodal model: its language part
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    return read_config(cfg)
