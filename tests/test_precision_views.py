"""Charts and widgets of the mixed-precision notebook: callbacks print the right text, charts are labelled."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from course_utils import precision
from course_utils.plots import precision as plots
from course_utils.widgets import precision as widgets


def _labelled(fig) -> None:
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_gradient_histogram_is_labelled() -> None:
    _labelled(plots.gradient_histogram(precision.synthetic_gradients(2000)))


@pytest.mark.parametrize("kwargs", [{"grads": torch.tensor([])}, {"scale": 0.0}, {"scale": -1.0},
                                    {"bins": 2}, {"bins": 10_000}])
def test_gradient_histogram_bad_input(kwargs) -> None:
    kwargs = {"grads": precision.synthetic_gradients(100), **kwargs}
    with pytest.raises(ValueError):
        plots.gradient_histogram(**kwargs)


def test_loss_curves_is_labelled_and_checks_input() -> None:
    _labelled(plots.loss_curves({"float32": [2.0, 1.0, 0.5], "bfloat16": [2.0, 1.1, 0.4]}, smooth=2))
    with pytest.raises(ValueError, match="curves"):
        plots.loss_curves({})
    with pytest.raises(ValueError, match="smooth"):
        plots.loss_curves({"a": [1.0]}, smooth=0)
    with pytest.raises(ValueError, match="no losses"):
        plots.loss_curves({"a": []})


def test_tiny_update_view_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    widgets.tiny_update_view("bfloat16", 1e-4)
    out = capsys.readouterr().out
    assert "LOST" in out and "master copy" in out


def test_matmul_view_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    widgets.matmul_view("float16", 512, "cpu")
    assert "float16 is timed on a CPU only up to 256x256" in capsys.readouterr().out
    widgets.matmul_view("float16", 256, "cpu")
    out = capsys.readouterr().out
    assert "float32 on cpu" in out and "float16 on cpu" in out and "TFLOP/s" in out
    widgets.matmul_view("bfloat16", 256, "cpu")
    out = capsys.readouterr().out
    assert "float32 on cpu" in out and "bfloat16 on cpu" in out and "TFLOP/s" in out


def test_matmul_sizes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert widgets.matmul_sizes("cpu") == (256, 512, 1024, 2048, 4096)
    assert widgets.matmul_sizes("cuda")[-1] == 8192


def test_widgets_build(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ipywidgets")
    assert widgets.tiny_update_widget(1e-3).children
    assert widgets.matmul_widget(size=256, device="cpu").children
    assert "bfloat16 on cpu" in capsys.readouterr().out  # it starts with the lesson's type, bfloat16 on a CPU
    assert widgets.matmul_widget(device="cpu").children      # at all_formats_size: 256 on a CPU
    with pytest.raises(ValueError, match="update"):
        widgets.tiny_update_widget(1.0)
    with pytest.raises(ValueError, match="size"):
        widgets.matmul_widget(size=300, device="cpu")
