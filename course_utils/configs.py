"""Architecture configs: the real models' ``config.json`` files shipped in ``data/configs``.

One reader for the whole course, so that every module treats a preset name, a path and a dict the
same way. The shipped files carry a ``_source`` note (where the config comes from); keys starting
with ``_`` are notes and are dropped on reading.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

#: Sizes every decoder config must give as positive integers for the course's counts to work.
REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def config_presets() -> dict[str, Path]:
    """The architecture configs shipped in ``data/configs``, by name (e.g. 'smollm2-135m')."""
    from course_utils import data_path  # noqa: PLC0415

    try:
        folder = data_path("configs")
    except FileNotFoundError:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.json"))}


def resolve_config(config: str | os.PathLike) -> Path:
    """The path of a config file: an existing path, or the name of a shipped preset (see :func:`config_presets`)."""
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"config must be a path or a preset name, got {type(config).__name__}")
    path = Path(config).expanduser()
    if path.is_file():
        return path
    presets = config_presets()
    key = str(config).strip().lower()
    key = key[:-5] if key.endswith(".json") else key
    if key in presets:
        return presets[key]
    raise ValueError(f"config {str(config)!r} is neither a readable file nor a preset "
                     f"({', '.join(presets) or 'none shipped'})")


def read_config(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """An architecture config as a plain dict: from a mapping, a ``config.json`` path or a preset name.

    Keys starting with ``_`` are dropped. Raises ValueError naming ``config`` when the file cannot be read
    or does not give the decoder sizes in :data:`REQUIRED_SIZES`.
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
    for key in REQUIRED_SIZES:
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config must give {key} as a positive integer (got {value!r})")
    return cfg
