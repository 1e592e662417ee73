"""Section 9: one training step's memory over time on the GPU, measured against predicted.

The step is notebook 05's baseline (full fine-tuning of SmolLM2's miniature: 4 of its 30 layers, a vocabulary of
8,192, batch 4 x 256). It is measured with ``course_utils.timeline_measure.measure_timeline`` (the profiler's
memory timeline, and the CUDA allocator's history saved as ``step_snapshot.pickle`` under ``--out``, for
https://pytorch.org/memory_viz) and compared with ``course_utils.timeline.predicted_timeline``: the tensor peaks
within 5 %, in the same phase, and each kind's most bytes alive side by side.
"""

from __future__ import annotations

from typing import Any

from ..runner import Context, Outcome, Skip

#: Notebook 05's baseline step.
TIMELINE_CASE = {"method": "full", "batch": 4, "seq": 256}
#: The largest gap, in percent, between the predicted and the measured tensor peak.
TIMELINE_LIMIT_PCT = 5.0


def miniature() -> dict[str, Any]:
    """SmolLM2-135M's config with 4 layers and a vocabulary of 8,192 (notebook 05's miniature)."""
    from course_utils.configs import read_config

    return {**read_config("smollm2-135m"), "num_hidden_layers": 4, "vocab_size": 8192}


def section_timeline(ctx: Context, out: Outcome) -> None:
    """measure_timeline on this GPU against predicted_timeline: peaks, phases, each kind's most bytes alive."""
    from course_utils import step_memory, timeline, timeline_measure

    config = miniature()
    try:
        measured = timeline_measure.measure_timeline(
            config,
            **TIMELINE_CASE,
            device=ctx.device,
            timeout_s=max(5.0, ctx.left() - 5.0),
            out_dir=ctx.out_dir / "timeline",
        )
    except RuntimeError as err:  # no memory export in this torch: said, never passed
        raise Skip(f"no measured timeline: {err}") from None
    predicted = timeline.predicted_timeline(step_memory.estimate_step(config, **TIMELINE_CASE, device="cuda"))
    peak_m, peak_p = timeline.tensor_total(measured.peak), timeline.tensor_total(predicted.peak)
    gap = 100.0 * (peak_p - peak_m) / peak_m
    out.data.update(timeline_gap_pct=round(gap, 2), timeline_files=dict(measured.files))
    out.check(
        f"predicted tensor peak within {TIMELINE_LIMIT_PCT:g} % of the measured one",
        abs(gap) <= TIMELINE_LIMIT_PCT,
        f"measured {peak_m / 1e9:.3f} GB, predicted {peak_p / 1e9:.3f} GB, {gap:+.1f} %",
    )
    out.check(
        "the two peaks fall in the same phase",
        measured.peak.phase == predicted.peak.phase,
        f"measured: {measured.peak.phase} ({measured.peak.label}); predicted: {predicted.peak.phase} "
        f"({predicted.peak.label})",
    )
    rows = [
        [kind, round(measured.kind_max(kind) / 1e9, 4), round(predicted.kind_max(kind) / 1e9, 4)]
        for kind in timeline.KINDS[1:]
    ]
    out.table("Most bytes alive per kind, GB (notebook 05's baseline step)", ["kind", "measured", "predicted"], rows)
    for name, path in measured.files.items():
        out.note(f"{name}: {path} (open it at https://pytorch.org/memory_viz: the page runs in the browser)")
