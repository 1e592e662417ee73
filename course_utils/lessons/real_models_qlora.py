"""Notebook 01b (real models in 4 bits, and QLoRA): its chart, its widget, its two exercises and its ticket report.

The counting is in :mod:`course_utils.footprint`, :mod:`course_utils.architecture` and :mod:`course_utils.tickets`;
this module draws where a model's bytes go at 16 and 4 bits, wires the "how close to a quarter?" sliders, checks
the 4-bit size and the LoRA count, and writes the ticket counts as lines a learner reads.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

from course_utils.footprint import Part, four_bit_ratio_report
from course_utils.tickets import TEAMS, Ticket, chance_tail, team_named, wilson_interval
from course_utils.lessons.kit import COLORS, Feedback, check_number, finish, new_figure, view_panel
from course_utils.units import GB, format_bytes

#: How the parts of :func:`course_utils.footprint.footprint_parts` are grouped in the chart.
_GROUPS: dict[str, tuple[str, ...]] = {
    "embedding table (stays 16-bit)": ("embedding table", "lm_head"),
    "linear layers (quantized)": ("attention linears (q, k, v, o)", "MLP linears (gate, up, down)", "other linears"),
    "norms, biases, buffers (16-bit)": ("linear biases", "norms", "other parameters", "buffers"),
}
_GROUP_OF = {part: group for group, parts in _GROUPS.items() for part in parts}
_GROUP_COLORS = ("#C44E52", COLORS["nf4"], "#8C8C8C")


def group_bytes(parts: Sequence[Part]) -> dict[str, int]:
    """Bytes per chart group (embedding, linears, the rest) from a list of parts."""
    if not parts or not all(isinstance(p, Part) for p in parts):
        raise TypeError("parts must be a non-empty list of course_utils.footprint.Part (from footprint_parts)")
    out = dict.fromkeys(_GROUPS, 0)
    for part in parts:
        if part.name not in _GROUP_OF:
            raise ValueError(f"unknown part name {part.name!r}")
        out[_GROUP_OF[part.name]] += part.bytes
    return out


def footprint_chart(bars: Sequence[tuple[str, Sequence[Part], int]]) -> Any:
    """Stacked horizontal bars, each as a percentage of its model's 16-bit size.

    ``bars``: ``(label, parts, bytes16)`` per bar, top to bottom; ``bytes16`` is the 16-bit total that
    the bar is scaled against. A dashed line marks 25 %, what 4 bits would give if every weight shrank.
    """
    if not bars:
        raise ValueError("bars must hold at least one (label, parts, bytes16) entry")
    fig, ax = new_figure("Where the bytes go: 16-bit vs 4-bit NF4", "share of the same model's 16-bit footprint (%)",
                         "model and width", figsize=(8.0, 0.75 * len(bars) + 2.0))
    for row, (label, parts, bytes16) in enumerate(bars):
        if not isinstance(bytes16, int) or bytes16 <= 0:
            raise ValueError(f"bytes16 for {label!r} must be a positive int, got {bytes16!r}")
        groups = group_bytes(parts)
        left = 0.0
        for (group, value), color in zip(groups.items(), _GROUP_COLORS):
            width = 100 * value / bytes16
            ax.barh(row, width, left=left, color=color, label=group if row == 0 else None, height=0.6)
            left += width
        ax.text(left + 1, row, f"{format_bytes(sum(groups.values()))}  ({left:.0f} %)", va="center", fontsize=9)
    ax.axvline(25, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(bars)), [label for label, _, _ in bars])
    ax.set(xlim=(0, 130), ylim=(len(bars) - 0.5, -0.9))  # top to bottom, room above the first bar for the label:
    ax.text(25.8, -0.62, "25 %: a quarter of the 16-bit size", fontsize=8)
    return finish(fig, ax, loc="upper center", bbox_to_anchor=(0.35, -0.2), ncol=3, fontsize=8)


#: The key/value widths the demo offers, as a fraction of q's: SmolLM2-135M, Llama 3 8B, Llama 3 70B.
_KV_FRACTIONS = {"1/3 (SmolLM2-135M: 3 of 9 heads)": 1 / 3, "1/4 (Llama 3 8B: 8 of 32 heads)": 1 / 4,
                "1/8 (Llama 3 70B: 8 of 64 heads)": 1 / 8}


def four_bit_ratio_panel() -> Any:
    """Sliders for width, depth and vocabulary of a Llama-shaped model (MLP 8/3 x wider), and k, v's width; each
    change prints :func:`course_utils.footprint.four_bit_ratio_report` for the slider values."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return view_panel(
        four_bit_ratio_report,
        hidden_size=w.IntSlider(576, min=256, max=8192, step=64, description="hidden size", style=style),
        num_layers=w.IntSlider(30, min=4, max=80, description="layers", style=style),
        vocab_size=w.IntSlider(49152, min=8192, max=262144, step=1024, description="vocabulary", style=style),
        tied=w.Checkbox(True, description="tied lm_head"),
        kv_fraction=w.Dropdown(options=list(_KV_FRACTIONS.items()), value=1 / 3, description="k, v width / q width",
                               style=style),
    )


#: Exercise 1's model: the Unsloth example's Qwen3-4B-Instruct-2507 (a config shipped in data/configs).
SIZE_MODEL = "qwen3-4b-instruct-2507.json"
#: Exercise 2's adapter: rank 8 on the query and value projections of the notebook's SmolLM2-135M.
LORA_MODEL, _LORA_RANK, _LORA_TARGETS = "smollm2-135m.json", 8, ("q_proj", "v_proj")


@lru_cache(maxsize=None)
def size_facts() -> dict[str, int]:
    """Exercise 1's givens and answer, counted on the meta device: parameters, parts, 4-bit bytes, NF4 scales."""
    from course_utils.footprint import computed_sizes, footprint_parts
    from course_utils.models import meta_model

    parts = {p.name: p.params for p in footprint_parts(meta_model(SIZE_MODEL), 16) if p.name != "buffers"}
    sizes = computed_sizes(SIZE_MODEL)
    linears = sum(n for name, n in parts.items() if "linears" in name)
    return {"params": sizes.params, "embedding": parts["embedding table"], "linears": linears,
            "other_16bit": sizes.params - parts["embedding table"] - linears, "bytes4": sizes.bytes4,
            "bytes16": sizes.bytes16, "scales4": sizes.scales4}


def check_four_bit_size(answer_gb: Any) -> Feedback:
    """Exercise 1: Qwen3-4B-Instruct-2507's 4-bit size in GB, as ``get_memory_footprint()`` would count it."""
    f = size_facts()
    mistakes = [
        (f["params"] * 0.5 / GB, "That is every parameter at 4 bits. The embedding table and the norms are not "
                                 "linear layers: they stay 16-bit, 2 bytes each."),
        (f["bytes16"] / GB, "That is the 16-bit size: 2 bytes for every parameter. In 4 bits the linear layers "
                            "take half a byte each."),
        ((f["bytes4"] + 2 * f["embedding"]) / GB, "You counted the embedding table twice. The lm_head is tied: it "
                                                  "shares the table's matrix, so it adds nothing."),
        (f["params"] * 4 / GB, "4 bits is half a byte, not 4 bytes."),
        ((f["bytes4"] + f["scales4"]) / GB, "That includes the NF4 scales (one float32 per 64 weights); "
                                            "get_memory_footprint() leaves them out, and so does this question."),
    ]
    return check_number(answer_gb, f["bytes4"] / GB, name="answer_gb", what="the 4-bit size in GB (e.g. 3.1)",
                        rel_tol=0.01, mistakes=mistakes, unit="GB",
                        hint="Linear weights: 0.5 byte each. Embedding table and norms: 2 bytes each. "
                             "Add them up and divide by 1e9.")


def check_lora_count(answer: Any) -> Feedback:
    """Exercise 2: the trainable numbers of LoRA rank 8 on q_proj and v_proj of SmolLM2-135M."""
    from course_utils.architecture import Architecture, lora_adapter_params

    expected = lora_adapter_params(LORA_MODEL, _LORA_RANK, _LORA_TARGETS)  # the course's adapter counter
    arch = Architecture.from_config(LORA_MODEL)
    (q_in, q_out), (v_in, v_out) = (arch.projection_shapes()[t] for t in _LORA_TARGETS)
    r, layers = _LORA_RANK, arch.layers
    mistakes = [
        (r * 2 * (v_in + v_in) * layers, f"v_proj is not square: it maps {v_in} numbers to {v_out} "
                                         f"({arch.kv_heads} key/value heads of {arch.head_dim}). Read its shape in "
                                         "the printed decoder layer."),
        (r * (q_in + q_out + v_in + v_out), "That is one decoder layer. The adapter sits in every one of the "
                                            f"{layers} layers."),
        (2 * expected, "That is rank 16. This adapter has rank 8."),
        (r * (q_in * q_out + v_in * v_out) * layers, "A is r x d_in and B is d_out x r: r x (d_in + d_out) "
                                                     "numbers, not r x d_in x d_out."),
        (r * (q_in + v_in) * layers, "You counted only A (r x d_in). B adds d_out x r."),
        (r * sum(i + o for i, o in arch.projection_shapes().values()) * layers,
         "That is all seven projections. Here the adapter goes on q_proj and v_proj only."),
    ]
    return check_number(answer, expected, name="answer", what="a whole number of trainable parameters",
                        rel_tol=0.0, abs_tol=0.5, mistakes=mistakes,
                        hint="Per targeted layer: r x (d_in + d_out). Add q_proj and v_proj, then multiply "
                             "by the number of decoder layers.")


def embedding_text(model: Any) -> str:
    """The input embedding table's size and type, as the model holds it now: ``"56.6 MB of torch.bfloat16"``."""
    table = model.get_input_embeddings().weight
    return f"{format_bytes(table.numel() * table.element_size())} of {table.dtype}"


def count_line(label: str, right: int, total: int) -> str:
    """``"<label>  right team 26/48 = 54 % (95 % interval 40-68 %)"``, the interval by Wilson's formula."""
    low, high = wilson_interval(right, total)
    return f"{label:<18} right team {right:>2}/{total} = {100 * right / total:3.0f} % " \
           f"(95 % interval {100 * low:.0f}-{100 * high:.0f} %)"


def verdict(right: int, best_baseline: int, k: int, total: int) -> str:
    """What the trained count says, in words: at least ``k`` tickets above the best baseline, or a weak result."""
    gap, tail = right - best_baseline, chance_tail(total, right)
    luck = "under 0.1 %" if tail < 0.001 else f"{100 * tail:.1f} %"
    said = "better than guessing" if gap >= k else f"not the +{k} the check asks: a weak result"
    return f"{gap:+d} tickets against the best baseline, {said} (a guesser gets {right} or more: {luck})"


def confusion_table(answers: Sequence[str], tickets: Sequence[Ticket]) -> str:
    """Right team (rows) against the team each answer names (columns; "none": no team, or several)."""
    if len(answers) != len(tickets):
        raise ValueError(f"need one answer per ticket, got {len(answers)} answers for {len(tickets)} tickets")
    named = [team_named(a) for a in answers]
    lines = ["right team  answered: " + " ".join(f"{team or 'none':>9}" for team in (*TEAMS, None))]
    for gold in TEAMS:
        counts = [sum(t.team == gold and n == team for t, n in zip(tickets, named)) for team in (*TEAMS, None)]
        lines.append(f"{gold:<21}" + " ".join(f"{c:>9}" for c in counts))
    return "\n".join(lines)
