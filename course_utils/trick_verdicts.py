"""What notebook 05's measured tricks show, in words: one table, and one verdict per trick.

A verdict is the measured change against the baseline (``peak -16 %, step time +21 %``), then a cause only where a
measurement shows it: bytes the step counted (the activations saved for backward, the optimizer's states, the
gradients), or the parts of the step estimate where the estimate agrees with what was counted or measured. Where
nothing measured shows a cause, the verdict gives none.
"""

from typing import Sequence

from course_utils.trick_claims import TRICKS
from course_utils.trick_runs import TrickResult
from course_utils.units import GB, format_bytes, format_seconds

#: The first words of each kind of skip reason, and how a table cell says it.
_SKIPS_SHORT = (
    ("skipped on a CPU", "skipped on a CPU: compiling takes minutes"),
    ("skipped on this CPU", "skipped: no fast bfloat16 on this CPU"),
    ("skipped: did not finish", "skipped: ran out of time"),
    ("skipped: the step failed", "skipped: the step failed"),
)
#: How far (a share) an estimate may be from the measured or counted bytes for the verdict to cite its parts.
AGREES = 0.05


def results_table(rows: Sequence[TrickResult]) -> list[dict[str, str]]:
    """Each trick's label, its claim, and what this machine measured (:func:`verdict`), for display."""
    base = next((r for r in rows if r.key == "baseline"), None)
    return [{"trick": r.label, "claim": r.claim, "measured": verdict(r, base)} for r in rows]


def results_text(rows: Sequence[TrickResult]) -> str:
    """One compact table: trick | estimate GB | peak GB | step time | against the baseline (the short verdict)."""
    base = next((r for r in rows if r.key == "baseline"), None)
    width = max(len(r.label) for r in rows)
    lines = [f"{'trick':<{width}}  estimate GB  peak GB  step time  vs baseline"]
    for r in rows:
        est, peak = ("-" if n is None else f"{n / GB:.2f}" for n in (r.estimate_bytes, r.peak_bytes))
        time = "-" if r.step_seconds is None else format_seconds(r.step_seconds)
        lines.append(f"{r.label:<{width}}  {est:>11}  {peak:>7}  {time:>9}  {verdict(r, base, short=True)}")
    return "\n".join(lines)


def verdict(row: TrickResult, baseline: TrickResult | None, short: bool = False) -> str:
    """One sentence: what this machine measured against the baseline, and why, where a measurement shows it (see
    the module doc). With ``short``, a table cell: ``peak -16 %, time +25 %``, ``reference``, or why the trick was
    skipped in a few words."""
    if row.key == "baseline":
        return "reference"
    if row.skipped:
        cell = next((cell for start, cell in _SKIPS_SHORT if row.skipped.startswith(start)), "skipped")
        return cell if short else row.skipped
    if baseline is None or baseline.peak_bytes is None or baseline.step_seconds is None:
        return "no baseline to compare with"
    memory, speed = row.peak_bytes / baseline.peak_bytes, row.step_seconds / baseline.step_seconds
    if short:
        return f"peak {_percent(memory)}, time {_percent(speed)}"
    return f"peak {_percent(memory)}, step time {_percent(speed)}" + _CAUSES[row.key](row, baseline, memory, speed)


def _percent(ratio: float) -> str:
    """A ratio to the baseline as a change: ``-16 %``, ``+25 %``."""
    return f"{round(100 * (ratio - 1)):+d} %"


def _counted(before: int | None, after: int | None, what: str) -> str:
    """``; WHAT 223.0 MB -> 50.2 MB (counted)`` where both steps counted it; else nothing."""
    return f"; {what} {format_bytes(before)} -> {format_bytes(after)} (counted)" if before and after else ""


def _agrees(estimate: float | None, measured: float | None) -> bool:
    """Whether an estimate is within :data:`AGREES` of what was measured (or counted)."""
    return bool(estimate and measured) and abs(estimate / measured - 1) <= AGREES


# Each cause is the rest of a verdict's sentence, after the measured change.
def _checkpointing(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    saved = _counted(baseline.saved_activations_bytes, row.saved_activations_bytes, "saved for backward")
    if memory <= 0.6 or not saved:
        return saved
    share = f"{100 * baseline.saved_activations_bytes / baseline.peak_bytes:.0f} %"
    return (
        f"{saved}; not -50 % here: checkpointing removes saved activations, and they were {share} of the baseline peak"
    )


def _adamw8bit(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    if not all((row.optimizer_bytes, row.trained_params, baseline.optimizer_bytes, baseline.trained_params)):
        return ""
    base_per, per = (r.optimizer_bytes / r.trained_params for r in (baseline, row))
    counted = f"; optimizer states {base_per:.2f} -> {per:.2f} bytes per trained number (counted)"
    on_gpu = str(row.device or "cpu").startswith("cuda")  # measured there (the scratch memory below is a CPU's)
    if on_gpu or row.estimate_moment != "optimizer step" or not _agrees(row.estimate_bytes, row.peak_bytes):
        return counted
    return (
        f"{counted}. The peak comes at the optimizer step (the estimate says so, and matches the measured peak): on a "
        "CPU bitsandbytes unpacks each tensor's states to float32 for its update, scratch memory the size of 5 "
        "float32 copies of the largest tensor"
    )


def _compile(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    once = "" if row.compile_seconds is None else f"; compile {row.compile_seconds:.0f} s once"
    return f" ({1 / speed:.2f}x speed){once}" + ("; no 1.2-1.5x here" if 1 / speed < 1.1 else "")


def _bf16(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    dtype = getattr(row.measurement, "autocast", None) or "bfloat16"
    scaling = " with loss scaling: this GPU has no native bfloat16" if dtype == "float16" else ""
    saved = _counted(baseline.saved_activations_bytes, row.saved_activations_bytes, "saved for backward")
    text = f" ({dtype} autocast{scaling}){saved}"
    parts = row.estimate_saved or {}
    if memory <= 0.9 or not _agrees(sum(parts.values()), row.saved_activations_bytes):
        return text
    copies = format_bytes(parts.get("bf16 weight copies (autocast)", 0))
    logits = format_bytes(parts.get("logits path (log-softmax, float32)", 0))
    return (
        f"{text}. The peak did not halve: of the bytes saved, {copies} are {dtype} copies of the weights on the "
        f"gradient's path, kept until backward, and {logits} the loss's float32 log-softmax over the vocabulary (the "
        "estimate's parts, whose sum matches the count)"
    )


def _accumulation(row: TrickResult, baseline: TrickResult, memory: float, speed: float) -> str:
    k = TRICKS["accumulation"].change["accumulation"]
    saved = _counted(baseline.saved_activations_bytes, row.saved_activations_bytes, "saved per micro-batch")
    text = f" for the same examples per optimizer step, as {k} micro-batches{saved}"
    grads = getattr(row.measurement, "grads_bytes", 0)
    if memory < 0.97 or not grads:
        return text
    kept = format_bytes(grads)
    return f"{text}. The peak did not fall: the gradients ({kept}, counted) stay from one micro-batch to the next"


#: The causes a verdict can give, by trick (every trick but the baseline).
_CAUSES = {
    "checkpointing": _checkpointing,
    "adamw8bit": _adamw8bit,
    "compile": _compile,
    "bf16": _bf16,
    "accumulation": _accumulation,
}
