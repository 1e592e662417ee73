"""course_utils.peak: the peak memory of a piece of work, on a CPU, on a (simulated) GPU, and where no reset exists."""

from __future__ import annotations

import resource

import pytest
import torch

from course_utils import peak
from course_utils.peak import measure_peak, track_peak


def test_track_peak_on_cpu_sees_a_big_allocation() -> None:
    def work() -> int:
        big = torch.ones(20_000_000)  # 80 MB
        return int(big.numel())

    result, reading = measure_peak(work, device="cpu")
    assert result == 20_000_000
    assert reading.bytes - reading.start_bytes > 60_000_000, reading
    assert reading.what.startswith("CPU") and "reset at its start" in reading.what
    assert reading.reserved_bytes is None


def test_track_peak_uses_cuda_counters_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 5_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 8_000)
    with track_peak("cuda") as reading:
        calls.append("work")
    assert calls == ["sync", "reset", "work", "sync"]
    assert (reading.bytes, reading.start_bytes, reading.reserved_bytes) == (5_000, 100, 8_000)
    assert reading.what.startswith("CUDA")


def test_track_peak_rejects_a_bad_device() -> None:
    with pytest.raises(ValueError, match="device"):
        with track_peak("tpu9"):
            pass
    with pytest.raises(TypeError, match="fn"):
        measure_peak(42)  # type: ignore[arg-type]


def test_where_the_peak_cannot_be_reset_the_tracker_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """macOS, simulated: no /proc, and ru_maxrss in bytes. A reset is refused with a warning, and every reading is
    the process's peak since it started, named as such."""
    monkeypatch.setattr(peak.sys, "platform", "darwin")
    monkeypatch.setattr(peak, "PROC", tmp_path / "no-proc")
    with pytest.warns(RuntimeWarning, match="since this process started"):
        assert peak.reset_rss_high_water_mark() is False
    since_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes, as macOS reports it
    assert peak.rss_high_water_mark_bytes() == since_start
    with pytest.warns(RuntimeWarning, match="was not reset"), track_peak("cpu") as reading:
        pass
    assert reading.what == f"CPU: {peak.NO_RESET}" and reading.bytes >= since_start


def test_on_linux_the_reset_forgets_an_earlier_peak(recwarn: pytest.WarningsRecorder) -> None:
    if not peak.PROC.joinpath("clear_refs").exists():
        pytest.skip("this system has no /proc/self/clear_refs")
    big = torch.ones(50_000_000)  # 200 MB, then freed (handed back: a block this large has its own mapping)
    del big
    earlier = peak.rss_high_water_mark_bytes()
    assert peak.reset_rss_high_water_mark() is True
    assert peak.rss_high_water_mark_bytes() < earlier - 150_000_000
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
