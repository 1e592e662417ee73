"""Live demo: how close to "a quarter" does a 4-bit model get? Sliders over a Llama-shaped architecture."""
from __future__ import annotations

from typing import Any

from course_utils.footprint import four_bit_ratio_report

#: The key/value widths the demo offers, as a fraction of q's: SmolLM2-135M, Llama 3 8B, Llama 3 70B.
KV_FRACTIONS = {"1/3 (SmolLM2-135M: 3 of 9 heads)": 1 / 3, "1/4 (Llama 3 8B: 8 of 32 heads)": 1 / 4,
                "1/8 (Llama 3 70B: 8 of 64 heads)": 1 / 8}


def show_ratio(hidden_size: int, num_layers: int, vocab_size: int, tied: bool, kv_fraction: float = 1 / 3) -> None:
    """Callback: print :func:`course_utils.footprint.four_bit_ratio_report` for the slider values."""
    print(four_bit_ratio_report(hidden_size, num_layers, vocab_size, tied, kv_fraction=kv_fraction))


def four_bit_ratio_panel() -> Any:
    """Sliders for width, depth and vocabulary of a Llama-shaped model (MLP 8/3 x wider), and k, v's width."""
    import ipywidgets as w

    from course_utils.widgets import interact_panel

    style = {"description_width": "initial"}
    return interact_panel(
        show_ratio,
        hidden_size=w.IntSlider(576, min=256, max=8192, step=64, description="hidden size", style=style),
        num_layers=w.IntSlider(30, min=4, max=80, description="layers", style=style),
        vocab_size=w.IntSlider(49152, min=8192, max=262144, step=1024, description="vocabulary", style=style),
        tied=w.Checkbox(True, description="tied lm_head"),
        kv_fraction=w.Dropdown(options=list(KV_FRACTIONS.items()), value=1 / 3, description="k, v width / q width",
                               style=style),
    )
