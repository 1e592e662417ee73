"""course_utils.hub: the online/offline decision, made without touching the network (and without torch on import)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
import torch

from course_utils import hub


@pytest.fixture(autouse=True)
def no_packaged_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline means the stand-in here: the packaged copy's own choice is tested in test_packaged.py."""
    from course_utils import packaged

    monkeypatch.setattr(packaged, "availability", lambda folder=None: None)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a socket fails the test: the decision must not touch the network."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket, "create_connection", forbidden)


def _cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


@pytest.mark.parametrize(
    "value, offline",
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("", False), ("false", False)],
)
def test_offline_env_parsing(monkeypatch, value: str, offline: bool) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert hub.hub_offline_env() is False
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, value)
        assert hub.hub_offline_env() is offline
        monkeypatch.delenv(name)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("reachable, source", [(True, "real"), (False, "offline")])
def test_the_hub_decides_with_or_without_a_gpu(monkeypatch, gpu: bool, reachable: bool, source: str) -> None:
    """A CPU machine that reaches the Hub gets the real small model too: the GPU plays no part in the choice."""
    _cuda(monkeypatch, gpu)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: reachable)
    decision = hub.decide_source()
    assert decision.source == source
    assert ("reachable" in decision.reason) if reachable else ("did not answer" in decision.reason)


def test_the_lesson_model_is_the_one_its_sizes_are_computed_from() -> None:
    """Notebook 01b computes LESSON_MODEL's sizes on the meta device from a shipped config, then loads LESSON_MODEL
    itself on a GPU: the config must be that model's."""
    from course_utils.configs import resolve_config
    from course_utils.models import QWEN25_CONFIG

    note = json.loads(resolve_config(QWEN25_CONFIG).read_text(encoding="utf-8"))["_source"]
    assert f"config of {hub.LESSON_MODEL} (config.json)" in note


def test_deciding_imports_no_torch() -> None:
    code = (
        "import os, sys; os.environ['HF_HUB_OFFLINE'] = '1'; import course_utils.hub as h; "
        "d = h.decide_source(); sys.exit(2 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_offline_env_decides_at_once(monkeypatch, no_network) -> None:
    _cuda(monkeypatch, True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "cached_on_disk", lambda name: False)
    start = time.perf_counter()
    decision = hub.decide_source()
    assert decision.source == "offline" and "HF_HUB_OFFLINE" in decision.reason
    assert time.perf_counter() - start < 0.5


def test_offline_but_cached_uses_the_real_model(monkeypatch, no_network) -> None:
    from course_utils import standin

    _cuda(monkeypatch, True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = []
    monkeypatch.setattr(hub, "cached_on_disk", lambda name: asked.append(name) or True)
    assert hub.decide_source().source == "real"
    assert standin.choose_model().name == asked[0] == asked[-1]  # the model found in the cache is the one loaded


@pytest.mark.parametrize("reachable, source", [(False, "offline"), (True, "real")])
def test_online_decision_follows_one_reachability_check(monkeypatch, reachable: bool, source: str) -> None:
    _cuda(monkeypatch, True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout_s=1.5: calls.append(timeout_s) or reachable)
    decision = hub.decide_source(timeout_s=1.0)
    assert decision.source == source and calls == [1.0]
    if not reachable:
        assert "did not answer within 1 s" in decision.reason


def test_reachability_true_false_and_never_longer_than_the_timeout(monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://example.invalid")
    addresses = []

    class Conn:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(socket, "create_connection", lambda address, timeout: addresses.append(address) or Conn())
    assert hub.hub_reachable(timeout_s=0.5) is True and addresses == [("example.invalid", 443)]

    def refused(address, timeout):
        raise ConnectionRefusedError("no")

    monkeypatch.setattr(socket, "create_connection", refused)
    assert hub.hub_reachable(timeout_s=0.5) is False

    def hangs(address, timeout):  # a DNS lookup that hangs far beyond the timeout
        time.sleep(3)
        raise OSError("too late")

    monkeypatch.setattr(socket, "create_connection", hangs)
    start = time.perf_counter()
    assert hub.hub_reachable(timeout_s=0.2) is False
    assert time.perf_counter() - start < 1.0


def test_hub_address_follows_hf_endpoint(monkeypatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub.hub_address() == ("huggingface.co", 443)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.local:8080")
    assert hub.hub_address() == ("mirror.local", 8080)
    monkeypatch.setenv("HF_ENDPOINT", "not a url")
    with pytest.raises(ValueError, match="HF_ENDPOINT"):
        hub.hub_address()


@pytest.mark.parametrize(
    "timeout, error", [(0, ValueError), (-1, ValueError), (11, ValueError), ("1", TypeError), (True, TypeError)]
)
def test_reachability_rejects_bad_timeouts(timeout, error) -> None:
    with pytest.raises(error, match="timeout_s"):
        hub.hub_reachable(timeout_s=timeout)
