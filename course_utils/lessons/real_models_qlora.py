"""Notebook 01b (real models in 4 bits, and QLoRA): its chart, its widget, its two exercises and its ticket report.

The counting is in :mod:`course_utils.footprint`, :mod:`course_utils.architecture` and :mod:`course_utils.tickets`;
this module draws where a model's bytes go at 16 and 4 bits, wires the "how close to a quarter?" sliders, checks
the 4-bit size and a learner's QLoRA recipe (on a two-layer model of SmolLM2's shapes), and writes the ticket
counts as lines a learner reads.
"""

from collections import Counter
from dataclasses import asdict
from functools import lru_cache
from typing import Any, Sequence

import torch

from course_utils import checks
from course_utils.architecture import PROJECTIONS, count_parameters, lora_adapter_params
from course_utils.configs import read_config
from course_utils.footprint import Part, computed_sizes, footprint_parts, four_bit_ratio_report
from course_utils.models import dtype_kwargs, meta_model, transformers_config
from course_utils.quiet import quiet_libraries
from course_utils.standin import STANDIN_CONFIG
from course_utils.tickets import TEAMS, Ticket, chance_tail, team_named, wilson_interval
from course_utils.lessons import kit
from course_utils.lessons.kit import COLORS, Feedback
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
        out[_GROUP_OF[part.name]] += part.bytes
    return out


def footprint_chart(bars: Sequence[tuple[str, Sequence[Part], int]]) -> Any:
    """Stacked horizontal bars, each as a percentage of its model's 16-bit size.

    ``bars``: ``(label, parts, bytes16)`` per bar, top to bottom; ``bytes16`` is the 16-bit total that
    the bar is scaled against. A dashed line marks 25 %, what 4 bits would give if every weight shrank.
    """
    if not bars:
        raise ValueError("bars must hold at least one (label, parts, bytes16) entry")
    fig, ax = kit.new_figure(
        "Where the bytes go: 16-bit vs 4-bit NF4",
        "share of the same model's 16-bit footprint (%)",
        "model and width",
        figsize=(8.0, 0.75 * len(bars) + 2.0),
    )
    for row, (label, parts, bytes16) in enumerate(bars):
        checks.integer(bytes16, f"bytes16 for {label!r}")
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
    return kit.finish(fig, ax, loc="upper center", bbox_to_anchor=(0.35, -0.2), ncol=3, fontsize=8)


#: The key/value widths the demo offers (label, fraction of q's width): SmolLM2-135M, Llama 3 8B, Llama 3 70B.
_KV_FRACTIONS = [
    ("1/3 (SmolLM2-135M: 3 of 9 heads)", 1 / 3),
    ("1/4 (Llama 3 8B: 8 of 32 heads)", 1 / 4),
    ("1/8 (Llama 3 70B: 8 of 64 heads)", 1 / 8),
]


def four_bit_ratio_panel() -> Any:
    """Sliders for width, depth and vocabulary of a Llama-shaped model (MLP 8/3 x wider), and k, v's width; each
    change prints :func:`course_utils.footprint.four_bit_ratio_report` for the slider values."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    return kit.view_panel(
        four_bit_ratio_report,
        hidden_size=w.IntSlider(576, min=256, max=8192, step=64, description="hidden size", style=style),
        num_layers=w.IntSlider(30, min=4, max=80, description="layers", style=style),
        vocab_size=w.IntSlider(49152, min=8192, max=262144, step=1024, description="vocabulary", style=style),
        tied=w.Checkbox(True, description="tied lm_head"),
        kv_fraction=w.Dropdown(options=_KV_FRACTIONS, value=1 / 3, description="k, v width / q width", style=style),
    )


#: Exercise 1's model: the Unsloth example's Qwen3-4B-Instruct-2507 (a config shipped in data/configs).
SIZE_MODEL = "qwen3-4b-instruct-2507.json"


@lru_cache(maxsize=None)
def size_facts() -> dict[str, Any]:
    """Exercise 1's givens and answer, counted on the meta device: :class:`~course_utils.footprint.ComputedSizes`'
    fields (parameters, bytes at 16 and 4 bits, NF4 scales) and the parameters in each kind of part."""
    sizes = computed_sizes(SIZE_MODEL)
    parts = {p.name: p.params for p in footprint_parts(meta_model(SIZE_MODEL), 16)}
    embedding, linears = parts["embedding table"], sum(n for name, n in parts.items() if "linears" in name)
    other = sizes.params - embedding - linears
    return {**asdict(sizes), "embedding": embedding, "linears": linears, "other_16bit": other}


def check_four_bit_size(answer_gb: Any) -> Feedback:
    """Exercise 1: Qwen3-4B-Instruct-2507's 4-bit size in GB, as ``get_memory_footprint()`` would count it."""
    f = size_facts()
    mistakes = [
        (
            f["params"] * 0.5 / GB,
            "That is every parameter at 4 bits. The embedding table and norms are not linear layers: they stay 16-bit.",
        ),
        (
            f["bytes16"] / GB,
            "That is the 16-bit size: 2 bytes for every parameter. In 4 bits the linear layers take half a byte each.",
        ),
        (
            (f["bytes4"] + 2 * f["embedding"]) / GB,
            "You counted the embedding table twice: the tied lm_head shares the table's matrix, so it adds nothing.",
        ),
        (f["params"] * 4 / GB, "4 bits is half a byte, not 4 bytes."),
        (
            (f["bytes4"] + f["scales4"]) / GB,
            "That adds the NF4 scales (a float32 per 64 weights); get_memory_footprint() and this question omit them.",
        ),
    ]
    return kit.check_number(
        answer_gb,
        f["bytes4"] / GB,
        name="answer_gb",
        what="the 4-bit size in GB (e.g. 3.1)",
        rel_tol=0.01,
        mistakes=mistakes,
        unit="GB",
        hint="Linear weights: 0.5 byte each. Embedding table and norms: 2 bytes each. Add them up and divide by 1e9.",
    )


#: Exercise 2's recipe, the notebook's adapter (:func:`course_utils.lora.add_lora`'s defaults): rank, alpha.
RECIPE_RANK, RECIPE_ALPHA = 16, 16
#: Exercise 2's model: SmolLM2-135M's shapes with this many decoder layers and a vocabulary this small.
TRYOUT_LAYERS, TRYOUT_VOCAB = 2, 256


def tryout_fields() -> dict[str, Any]:
    """The config of exercise 2's model: SmolLM2-135M cut to :data:`TRYOUT_LAYERS` layers and a small vocabulary."""
    return {**read_config(STANDIN_CONFIG), "num_hidden_layers": TRYOUT_LAYERS, "vocab_size": TRYOUT_VOCAB}


def _tryout_model() -> Any:
    """Exercise 2's model: :func:`tryout_fields`, random bfloat16 weights from seed 0 (the global RNG untouched)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(transformers_config(tryout_fields()), **dtype_kwargs(torch.bfloat16))


#: The hint for each way a learner's ``qlora_adapter`` can miss the recipe, by the name :func:`_adapter_slip` gives it.
ADAPTER_HINTS = {
    "not a model": "Return what get_peft_model(model, config) returns.",
    "no adapter": "Wrap it: return get_peft_model(model, LoraConfig(...)).",
    "the model given": "get_peft_model changes the model in place but returns a new wrapper: return that.",
    "no task": 'Give LoraConfig task_type="CAUSAL_LM": peft then wraps a causal language model (labels, generate).',
    "prepared after": "prepare_model_for_kbit_training freezes every parameter: call it first, then get_peft_model.",
    "not prepared": (
        "Call prepare_model_for_kbit_training(model) first: it freezes the model and upcasts its 16-bit "
        "parts (embedding, norms) to float32."
    ),
    "extra targets": "The recipe adapts the seven projections only (target_modules), not the embedding or lm_head.",
    "missing targets": f"The recipe targets all seven projections: {', '.join(PROJECTIONS)}.",
    "some layers": "The recipe adapts every decoder layer: leave layers_to_transform out.",
    "rank": f"The recipe's rank is r={RECIPE_RANK}.",
    "alpha": (
        f"lora_alpha / r should be {RECIPE_ALPHA} / {RECIPE_RANK} = {RECIPE_ALPHA / RECIPE_RANK:g}: give "
        f"lora_alpha={RECIPE_ALPHA} (peft's default is 8)."
    ),
    "modules_to_save": "Leave modules_to_save out: it trains a full module copy; the recipe trains the adapters only.",
    "other numbers": (
        f"The recipe: LoraConfig(r={RECIPE_RANK}, lora_alpha={RECIPE_ALPHA}, target_modules=projections, "
        'task_type="CAUSAL_LM") and nothing else (no use_dora, no modules_to_save).'
    ),
}


def _adapter_slip(got: Any, expected: int) -> tuple[str, str] | None:
    """How ``got``, the model a learner's function returned, misses the recipe (which trains ``expected`` numbers):
    the slip's name in :data:`ADAPTER_HINTS` and what is wrong; None if nothing."""
    from peft import PeftModel, PeftModelForCausalLM
    from peft.tuners.lora import LoraLayer

    if not isinstance(got, torch.nn.Module):
        return "not a model", f"it returned a {type(got).__name__}, not a model."
    adapters = {name: m for name, m in got.named_modules() if isinstance(m, LoraLayer)}
    if not adapters:
        return "no adapter", "the model has no LoRA adapter."
    if not isinstance(got, PeftModel):
        return "the model given", "it returned the model it was given, not the peft model."
    if not isinstance(got, PeftModelForCausalLM):
        return "no task", "it is a plain PeftModel."
    trainable = [name for name, p in got.named_parameters() if p.requires_grad]
    if not trainable:
        return "prepared after", "nothing trains, not even the adapters."
    sixteen = [(name, p.dtype) for name, p in got.named_parameters() if p.dtype in (torch.bfloat16, torch.float16)]
    if sixteen:
        return "not prepared", f"{sixteen[0][0]} is still {sixteen[0][1]}."
    targeted = {name.rsplit(".", 1)[-1] for name in adapters}
    if not targeted <= set(PROJECTIONS):
        return "extra targets", f"it puts adapters on {', '.join(sorted(targeted - set(PROJECTIONS)))}."
    if targeted != set(PROJECTIONS):
        return "missing targets", f"it adapts {', '.join(t for t in PROJECTIONS if t in targeted)} only."
    if len(adapters) != 7 * TRYOUT_LAYERS:
        return "some layers", f"it adds {len(adapters)} adapters, not 7 in each of its {TRYOUT_LAYERS} layers."
    ranks = sorted({r for m in adapters.values() for r in m.r.values()})
    if ranks != [RECIPE_RANK]:
        return "rank", f"its rank is {', '.join(map(str, ranks))}."
    scalings = sorted({s for m in adapters.values() for s in m.scaling.values()})
    if scalings != [RECIPE_ALPHA / RECIPE_RANK]:
        return "alpha", f"its adapters are scaled by {', '.join(f'{s:g}' for s in scalings)}."
    outside = [name for name in trainable if "lora_" not in name]
    if outside:
        return "modules_to_save", f"{outside[0]} trains too."
    count = sum(p.numel() for p in got.parameters() if p.requires_grad)
    if count != expected:
        return "other numbers", f"it trains {count:,} numbers; the recipe trains {expected:,}."
    return None


def check_qlora_adapter(fn: Any) -> Feedback:
    """Exercise 2: ``fn(model)`` prepares the model and adds the notebook's adapter, compared with the recipe's."""
    name, where = "qlora_adapter", f"on SmolLM2-135M's shapes with {TRYOUT_LAYERS} decoder layers"
    expected = lora_adapter_params(tryout_fields(), RECIPE_RANK, PROJECTIONS)
    hint = "Call prepare_model_for_kbit_training, then get_peft_model with a LoraConfig, and return the peft model."
    with quiet_libraries(), torch.random.fork_rng(devices=[]):  # peft's notices; the adapters' random start
        got, feedback = kit.call_answer(fn, (_tryout_model(),), name=name, call=f"{name}(model)", hint=hint)
        slip = _adapter_slip(got, expected) if feedback is None else None
    if feedback is not None:
        return feedback
    if slip is not None:
        return kit.wrong(f"{name}(model) {where}: {slip[1]}", ADAPTER_HINTS[slip[0]])
    full = lora_adapter_params(STANDIN_CONFIG, RECIPE_RANK, PROJECTIONS)
    share = 100 * full / (count_parameters(STANDIN_CONFIG) + full)
    return kit.right(
        f"{name}(model) gives the recipe's adapter {where}: rank {RECIPE_RANK} on all seven projections, "
        f"{expected:,} trainable numbers, the embedding and norms in float32. On all of SmolLM2-135M: {full:,} "
        f"trainable numbers, {share:.2f} % of all parameters, the share printed above."
    )


def embedding_text(model: Any) -> str:
    """The input embedding table's size and type, as the model holds it now: ``"56.6 MB of torch.bfloat16"``."""
    table = model.get_input_embeddings().weight
    return f"{format_bytes(table.numel() * table.element_size())} of {table.dtype}"


def count_line(label: str, right: int, total: int) -> str:
    """``"<label>  right team 26/48 = 54 % (95 % interval 40-68 %)"``, the interval by Wilson's formula."""
    low, high = wilson_interval(right, total)
    count = f"{right:>2}/{total} = {100 * right / total:3.0f} %"
    return f"{label:<18} right team {count} (95 % interval {100 * low:.0f}-{100 * high:.0f} %)"


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
    counts = Counter((t.team, team_named(a)) for t, a in zip(tickets, answers))
    columns = (*TEAMS, None)
    lines = ["right team  answered: " + " ".join(f"{team or 'none':>9}" for team in columns)]
    for gold in TEAMS:
        lines.append(f"{gold:<21}" + " ".join(f"{counts[gold, team]:>9}" for team in columns))
    return "\n".join(lines)
