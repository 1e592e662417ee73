"""Real model or stand-in? The online/offline decision, made up front and fast.

The rule: the Hub reachable -> the real small model, :data:`REAL_MODEL` (SmolLM2-135M-Instruct, which loads and
trains on a CPU as well as on a GPU); offline -> the stand-in (:mod:`course_utils.standin`), the same
architecture with random weights. Left to itself, the Hugging Face Hub client retries for a long while before
failing, a long silence in front of a class: :func:`decide_source` decides in about a second at most.
``HF_HUB_OFFLINE`` set decides at once; otherwise one quick TCP connection to the Hub. Nothing heavy is imported
here (no torch).
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

from course_utils import checks

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


@dataclass(frozen=True)
class Decision:
    """Which model to use, and why: ``source`` is ``"real"`` or ``"standin"``."""

    source: str
    reason: str


def decide_source(model_name: str = REAL_MODEL, *, timeout_s: float = 1.5) -> Decision:
    """Real model or stand-in? Decided in at most ``timeout_s`` seconds, without the Hub client's retries.

    1. ``HF_HUB_OFFLINE`` set -> the real model only if it is already in the local cache, else the stand-in.
    2. Otherwise one quick TCP connection to the Hub decides: reachable -> the real model, on a CPU or a GPU
       alike (the device decides only how it loads, see :func:`course_utils.models.load_settings`).
    """
    if not isinstance(model_name, str) or "/" not in model_name:
        raise ValueError(f"model_name must be a Hub id such as {REAL_MODEL!r}, got {model_name!r}")
    if hub_offline_env():
        if cached_on_disk(model_name):
            return Decision("real", "HF_HUB_OFFLINE is set, and the model is already in the local cache")
        return Decision("standin", "HF_HUB_OFFLINE is set and the model is not in the local cache")
    if not hub_reachable(timeout_s=timeout_s):
        host, port = hub_address()
        return Decision("standin", f"the Hub ({host}:{port}) did not answer within {timeout_s:g} s")
    return Decision("real", "the Hub is reachable: the real model downloads once, then loads from the local cache")
