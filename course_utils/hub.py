"""Which weights run: the Hub original, the packaged copy or the stand-in; and Hub access, decided fast.

:class:`ModelChoice` is what a notebook loads and how every printed line names it. :func:`decide_source` says
whether the Hub original can be used: left to itself, the Hugging Face Hub client retries for a long while
before failing, a long silence in front of a class, so this decides in about a second at most.
``HF_HUB_OFFLINE`` set decides at once; otherwise one quick TCP connection to the Hub. Without the Hub,
:func:`course_utils.standin.choose_model` takes the packaged copy where it is installed, else the stand-in.
``COURSE_MODEL_SOURCE`` (:data:`MODEL_SOURCE_ENV`) names the source instead, so that a test can run each one.
Nothing heavy is imported here (no torch), and of the course only the leaf modules ``checks`` and ``units``.
"""

import os
import socket
import threading
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlparse

from course_utils import checks
from course_utils.units import printable

#: The real model the notebook loads wherever the Hub is reachable, on a CPU or a GPU: the stand-in's architecture.
REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The lesson's own example model: its sizes are computed on the meta device; loaded only on a CUDA GPU.
LESSON_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"

_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline_env() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) asks for offline mode."""
    return any(os.environ.get(k, "").strip().upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_address() -> tuple[str, int]:
    """(host, port) of the Hub this process would use: ``HF_ENDPOINT`` if set, else huggingface.co:443."""
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    url = urlparse(endpoint or "https://huggingface.co")
    if not url.hostname:
        raise ValueError(f"HF_ENDPOINT must be a URL such as https://huggingface.co, got {endpoint!r}")
    return url.hostname, url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout_s: float = 1.5) -> bool:
    """Can a TCP connection to the Hub (:func:`hub_address`) be opened within ``timeout_s`` seconds (DNS included)?

    One connection attempt, no retries. The lookup runs in a worker thread so that even a hanging DNS
    resolver cannot hold the caller longer than the timeout.
    """
    timeout_s = checks.number(timeout_s, "timeout_s", 0, 10, low_open=True)
    address = hub_address()

    answer: list[bool] = []

    def attempt() -> None:
        # Refused, unreachable, unknown host, timeout: any failure leaves the answer empty, a "no".
        with suppress(Exception), socket.create_connection(address, timeout=timeout_s):
            answer.append(True)

    worker = threading.Thread(target=attempt, name="hub-reachable", daemon=True)  # daemon: never delays exit
    worker.start()
    worker.join(timeout_s + 0.25)
    return bool(answer)


def cached_on_disk(model_name: str) -> bool:
    """True when ``model_name``'s config is already in the local Hugging Face cache (usable offline)."""
    from huggingface_hub import try_to_load_from_cache  # comes with transformers

    return isinstance(try_to_load_from_cache(model_name, "config.json"), str)


#: Where a model can come from: the Hub original, the packaged copy (:mod:`course_utils.packaged`), the stand-in.
_SOURCES = ("real", "packaged", "standin")
#: The label of every printed line, per source (the Hub original's is its name).
_LABELS = {
    "standin": "[STAND-IN: SmolLM2-135M architecture, random weights]",
    "packaged": "[SmolLM2-135M-Instruct, packaged Q4_1 copy]",
}
#: Environment variable that names the source instead of deciding it ("real", "packaged" or "standin"): the test
#: scripts run notebook 01b once with the packaged copy and once with the stand-in.
MODEL_SOURCE_ENV = "COURSE_MODEL_SOURCE"
#: What the stand-in's generated text is called in the line that shows it.
_NOISE = "random-weight output (noise, not an answer; unprintable characters escaped):"


@dataclass(frozen=True)
class Decision:
    """Can the Hub original be used, and why: ``source`` is ``"real"`` or ``"offline"``, or the source named by
    :data:`MODEL_SOURCE_ENV` (``"packaged"``, ``"standin"``)."""

    source: str
    reason: str


def decide_source(timeout_s: float = 1.5) -> Decision:
    """The Hub original of :data:`REAL_MODEL`, or offline? Decided in at most ``timeout_s`` seconds, no retries.

    0. :data:`MODEL_SOURCE_ENV` set -> the source it names, without looking.
    1. ``HF_HUB_OFFLINE`` set -> the Hub original only if it is already in the local cache.
    2. Otherwise one quick TCP connection to the Hub decides: reachable -> the Hub original, on a CPU or a GPU
       alike (the device decides only how it loads, see :func:`course_utils.models.load_settings`).
    """
    forced = os.environ.get(MODEL_SOURCE_ENV, "").strip().lower()
    if forced:
        checks.choice(forced, MODEL_SOURCE_ENV, _SOURCES)
        return Decision(forced, f"{MODEL_SOURCE_ENV}={forced} chooses these weights")
    if hub_offline_env():
        if cached_on_disk(REAL_MODEL):
            return Decision("real", "HF_HUB_OFFLINE is set, and the model is already in the local cache")
        return Decision("offline", "HF_HUB_OFFLINE is set, and the Hub original is not cached here")
    if not hub_reachable(timeout_s=timeout_s):
        host, port = hub_address()
        return Decision("offline", f"the Hub ({host}:{port}) did not answer within {timeout_s:g} s")
    return Decision("real", "the Hub is reachable: the real model downloads once, then loads from the local cache")


@dataclass(frozen=True)
class ModelChoice:
    """The model the notebook will use: where it loads from, which weights those are, and why.

    ``source``: ``"real"`` (the Hub original), ``"packaged"`` (:mod:`course_utils.packaged`) or ``"standin"``;
    by default ``"standin"`` when ``is_standin``, else ``"real"``.
    """

    name: str
    is_standin: bool
    reason: str
    source: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", "standin" if self.is_standin else "real")
        checks.choice(self.source, "source", _SOURCES)
        if self.is_standin != (self.source == "standin"):
            raise ValueError(f"is_standin={self.is_standin} contradicts source={self.source!r}")

    @property
    def from_hub(self) -> bool:
        """True for the Hub original: the one choice that can also download other models."""
        return self.source == "real"

    @property
    def label(self) -> str:
        """Prefix for every printed line, so nobody mistakes stand-in numbers or text for the real model's."""
        return _LABELS.get(self.source, f"[{self.name}]")

    def show_text(self, text: str) -> str:
        """One line for generated ``text``: labelled, and with control characters escaped (never printed raw).

        The stand-in's random weights write noise, often with control bytes in it: the line says so, and
        :func:`course_utils.units.printable` turns each unprintable character into an escape such as ``\\x12`` (and
        raises TypeError when ``text`` is not a string).
        """
        what = _NOISE if self.is_standin else "answer:"
        return f"{self.label} {what} '{printable(text)}'"
