"""The course's one command line: ``python -m course_utils memory ...`` (installed as ``course-utils``).

``memory`` without options prints the lesson's table (four models x four methods x three budgets). With
``--params N``, ``--config PATH|PRESET`` or ``--model ORG/NAME`` it estimates one model; ``--batch``, ``--seq``,
``--checkpointing``, ``--optimizer`` or ``--measure`` switch to a whole training step (activations included);
``--budgets`` and ``--gpu`` set the memory budgets: the table marks a row "fits" at most at the 70 % line of the
memory; a whole step is judged by :func:`course_utils.memory.step_verdict` ("fits" up to 90 % of usable, "tight"
up to 100 %, else "does not fit"; on a GPU usable = the card's memory less the 0.5 GB CUDA context; a CPU
estimate, without ``--gpu``, against the whole memory). ``--method`` also accepts the methods beyond the table
(:data:`course_utils.memory.EXTRA_METHODS`, e.g. ``full-bf16``); the table without ``--method`` keeps its four.
Bad input, absurd sizes included (``--params 1e30``): one line on stderr naming the option and its allowed
range, exit status 2. Table mode imports no torch, so it answers instantly.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, NoReturn, Sequence

from course_utils import memory as mem
from course_utils import step_memory as sm
from course_utils.architecture import DEFAULT_TARGETS, normalize_targets
from course_utils.configs import config_presets, fetch_config, read_config, resolve_config
from course_utils.datasheets import CUDA_CONTEXT_GB

#: The options that turn the table into a whole-step estimate.
_STEP_OPTIONS = ("batch", "seq", "checkpointing", "optimizer", "measure", "no_kbit_preparation", "timeline")
_DESCRIPTION = (
    "Estimate the memory a training run needs for weights, gradients and AdamW states (activations not "
    "included), and whether it fits a memory budget (at most its 70% line). Without options: the lesson's table. "
    "With --batch/--seq (or --checkpointing, --optimizer, --measure): a whole training step, activations included: "
    "it fits up to 90% of usable memory (with --gpu: the card's memory less the 0.5 GB CUDA context; without, a CPU "
    "process against the whole memory), is tight from 90% to 100%, and does not fit above.")


class _ExitError(Exception):
    """Input the command cannot use: the message names the option; the command exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


# --------------------------------------------------------------------------------------------
# Parsing option values
# --------------------------------------------------------------------------------------------
_SIZE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def _count_text(n: float) -> str:
    """A bound as people read it: '1,000,000' up to a billion, '1e14' above."""
    return f"{int(n):,}" if n < 1e9 else f"{n:.0e}".replace("e+", "e")


def param_count(text: str) -> int:
    """A parameter count from text ('134515008', '7e9', '1.7B', '135M', '70b', '7_000_000_000'), between
    :data:`course_utils.memory.MIN_PARAMS` and ``MAX_PARAMS`` (1e14: 100 trillion)."""
    m = _SIZE.match(text)
    if not m:  # a sign is not a count either: '-5'
        raise ValueError(f"{text!r} is not a count (examples: 134515008, 7e9, 1.7B, 135M)")
    value = float(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2).lower()]
    if not mem.MIN_PARAMS <= value <= mem.MAX_PARAMS:  # 1e400 reads as inf: outside too
        raise ValueError(f"must be between {_count_text(mem.MIN_PARAMS)} and {_count_text(mem.MAX_PARAMS)} "
                         f"(100 trillion) parameters, got {text.strip()!r}")
    return int(round(value))


def _typed(convert):
    """An argparse ``type=`` that turns ValueError/TypeError into argparse's own error."""
    def parse(text: str):
        try:
            return convert(text)
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("targets: ")) from None
    return parse


def _whole(high: int):
    """A parser of whole numbers from 1 to ``high``."""
    def whole(text: str) -> int:
        if not text.strip().lstrip("+-").isdigit():
            raise ValueError(f"{text!r} is not a whole number")
        if not 1 <= int(text) <= high:
            raise ValueError(f"must be a whole number between 1 and {_count_text(high)}, got {int(text)}")
        return int(text)
    return whole


def _budget_sizes(text: str) -> list[mem.Budget]:
    items = [item.strip().upper().removesuffix("GB").strip() for item in text.split(",")]
    try:
        values = [float(item) for item in items]
    except ValueError:
        raise ValueError(f"{text!r}: budgets are sizes in GB separated by commas, e.g. 12,24") from None
    bad = [v for v in values if not mem.MIN_BUDGET_GB <= v <= mem.MAX_BUDGET_GB]  # nan and inf are outside too
    if bad:
        raise ValueError(f"every budget must be between {mem.MIN_BUDGET_GB:g} and {_count_text(mem.MAX_BUDGET_GB)} "
                         f"GB, got {bad[0]:g}")
    return [mem.Budget(f"{v:g} GB", v) for v in values]


def _gpu_budgets(text: str) -> list[mem.Budget]:
    return [mem.gpu_budget(name.strip()) for name in text.split(",")]  # an empty name is not in the table either


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m course_utils``: one sub-command, ``memory``."""
    prog = "python -m course_utils" if os.path.basename(sys.argv[0]) in ("__main__.py", "-m") else "course-utils"
    parser = _Parser(prog=prog, description="Helpers of the course 'Pack the bag smarter'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    memory = sub.add_parser("memory", help="estimate the memory of training a model (weights, gradients, AdamW)",
                            description=_DESCRIPTION)
    memory.add_argument("--method", choices=tuple(mem.ALL_METHODS), default=None,
                        help="show one method only (table); the method of the step (default lora). full-bf16: "
                             "every weight, its gradient and AdamW's states in bfloat16 (8 bytes per parameter)")
    what, budgets = memory.add_mutually_exclusive_group(), memory.add_mutually_exclusive_group()
    step = memory.add_argument_group("a whole training step, activations included")
    for group, flag, parse, default, metavar, text in (
            (what, "--params", param_count, None, "N",
             "parameter count of your model (e.g. 134515008, 7e9, 1.7B; 1,000 to 1e14)"),
            (what, "--config", str, None, "PATH",
             f"an architecture config.json, or a shipped preset: {', '.join(config_presets())} (exact counts)"),
            (what, "--model", str, None, "ORG/NAME",
             "a model on the Hugging Face Hub: reads only its config.json (no weights)"),
            (memory, "--lora-rank", _whole(mem.MAX_LORA_RANK), mem.REFERENCE_RANK, "R", "LoRA rank (default 8)"),
            (memory, "--targets", normalize_targets, None, "NAMES", "LoRA target modules, comma-separated (default "
             "q_proj,v_proj; or all-linear); needs --config or --model"),
            (budgets, "--budgets", _budget_sizes, None, "GB,GB",
             "memory budgets in GB, comma-separated (default: laptop 16, GPU 24, GPU 80)"),
            (budgets, "--gpu", _gpu_budgets, None, "NAME,NAME",
             "budget by GPU name from the datasheet table, e.g. T4,L4,A100-40GB,H100: the card's memory (a T4 "
             "exposes 15.83 GB); a whole step is judged against usable memory, that less the 0.5 GB CUDA context"),
            (step, "--batch", _whole(sm.MAX_BATCH), None, "B", "batch size (default 1)"),
            (step, "--seq", _whole(sm.MAX_SEQ), None, "S", "sequence length in tokens (default 128)")):
        group.add_argument(flag, type=_typed(parse), default=default, metavar=metavar, help=text)
    step.add_argument("--checkpointing", action="store_true", default=None, help="gradient checkpointing")
    step.add_argument("--optimizer", choices=mem.OPTIMIZERS, default=None, help="optimizer (default adamw)")
    step.add_argument("--measure", action="store_true", default=None,
                      help="also run the step and measure its peak memory")
    step.add_argument("--timeline", metavar="FILE", default=None,
                      help="draw the step's memory over time, by kind, into FILE (.png, .svg or .pdf): predicted; "
                           "with --measure, measured on the same axes (both peaks and their phases are printed)")
    step.add_argument("--no-kbit-preparation", action="store_true", default=None,
                      help="qlora without peft's prepare_model_for_kbit_training (as Unsloth and some trainers): "
                           "embedding and norms stay 16-bit, and so do the hidden states (default: prepared)")
    return parser


# --------------------------------------------------------------------------------------------
# The memory command
# --------------------------------------------------------------------------------------------
def _resolve(args: argparse.Namespace) -> dict[str, Any] | None:
    """The config from ``--model`` or ``--config`` (None for --params or the table), named by its
    ``_name_or_path`` (the Hub id, or the file's or preset's name): see :func:`course_utils.configs.config_name`."""
    if args.model is not None:
        try:
            return {**fetch_config(args.model), "_name_or_path": args.model}
        except (ValueError, OSError) as err:
            raise _ExitError(f"argument --model: {err}") from None
    if args.config is not None:
        try:
            return {**read_config(args.config), "_name_or_path": resolve_config(args.config).stem}
        except (ValueError, TypeError) as err:
            raise _ExitError(f"argument --config: {err}") from None
    if args.targets is not None:
        raise _ExitError("argument --targets: needs --config or --model (the adapter's size depends on the "
                         "architecture)")
    return None


def _print_table(args: argparse.Namespace, config: dict[str, Any] | None, budgets: list[mem.Budget]) -> None:
    methods = [args.method] if args.method else list(mem.METHODS)
    targets = args.targets or DEFAULT_TARGETS
    if config is not None:
        try:
            model = mem.model_from_config(config, args.lora_rank, targets)
        except (ValueError, TypeError) as err:
            raise _ExitError(f"argument --{'model' if args.model else 'config'}: {err}") from None
        except ImportError as err:  # an architecture outside the arithmetic needs transformers
            raise _ExitError(f"argument --config: counting a {config.get('model_type')!r} model needs "
                             f"transformers ({err})") from None
        print(f"{model.name}: {model.params:,} parameters; LoRA rank {args.lora_rank} on {', '.join(targets)} "
              f"trains {model.adapter:,} numbers ({100 * model.adapter / model.params:.2f}%), counted from the config.")
        models: tuple[mem.ModelSize, ...] = (model,)
    elif args.params is not None:
        models = (mem.ModelSize(mem.size_name(args.params), args.params),)
    else:
        models = mem.MODELS
    rows = mem.estimate_table(models, methods, args.lora_rank)
    # the lesson's table explains its assumption in the lesson: noted here for --params or another rank
    assumed_note = args.params is not None or args.lora_rank != mem.REFERENCE_RANK
    notes = []
    if assumed_note and any(r.adapter_assumed for r in rows):
        share = 100 * mem.ADAPTER_SHARE * args.lora_rank / mem.REFERENCE_RANK
        notes.append(f"LoRA rank {args.lora_rank} is assumed to train {share:.2f}% of the model (SmolLM2-135M's "
                     "share, linear in the rank); pass --config for an exact count.")
    print(mem.format_table(rows, budgets, notes=notes))


def _print_step(args: argparse.Namespace, config: dict[str, Any] | None, budgets: list[mem.Budget]) -> None:
    if config is None:
        raise _ExitError("argument --config: a whole-step estimate needs the architecture (activations depend on "
                         "hidden size, layers, vocabulary); give --config or --model, --params alone is not enough")
    step = dict(method=args.method or "lora", batch=args.batch or 1, seq=args.seq or 128,
                lora_rank=args.lora_rank, targets=args.targets or DEFAULT_TARGETS,
                checkpointing=bool(args.checkpointing), optimizer=args.optimizer or "adamw",
                kbit_preparation=not args.no_kbit_preparation)
    if args.no_kbit_preparation and step["method"] != "qlora":
        raise _ExitError("argument --no-kbit-preparation: only for --method qlora (the preparation is QLoRA's step)")
    device = "cuda" if args.gpu else "cpu"  # a GPU's budget is its allocator's counter: no CPU process baseline
    try:  # one estimate per GPU generation: the attention kernel a card gets can change the activations
        estimates = {b.capability: sm.estimate_step(config, **step, device=device, capability=b.capability)
                     for b in budgets}
        if args.measure:  # a measured step has tighter bounds (batch, rank): say so before printing anything
            from course_utils.measure import step_spec

            step_spec(config, **step)
    except (ValueError, TypeError) as err:
        raise _ExitError(_naming_option(err)) from None
    on_gpu, tight = device == "cuda", round(100 * mem.TIGHT_SHARE)
    printed = None
    for budget in budgets:  # the sizes were checked when parsed: no error here
        est = estimates[budget.capability]
        if printed is None or est.format() != printed:
            printed = est.format()
            print(printed)
        usable = mem.step_limit_gb(budget.gb, device)  # a GPU: the card's memory less the CUDA context
        print(f"  {budget.label} budget" + (f", usable {usable:.4g} GB" if on_gpu else "")
              + f": {mem.step_verdict(est.peak_gb, usable)} (the predicted peak is {100 * est.peak_gb / usable:.0f} % "
              f"of {'usable' if on_gpu else 'it'})")
    of = f"usable (the card's memory less the {CUDA_CONTEXT_GB:g} GB CUDA context)" if on_gpu else "the memory"
    print(f"fits = the predicted peak is at most {tight} % of {of};\ntight = {tight}-100 %: the allocator's reserve "
          "and fragmentation (or the system) can still run out of memory.")
    if args.timeline:
        _write_timeline(args.timeline, config, step, estimates[budgets[0].capability], measure=bool(args.measure))
    if args.measure:
        _print_measurement(config, step)


def _write_timeline(path: str, config: dict[str, Any], step: dict[str, Any], est: sm.StepEstimate,
                    measure: bool) -> None:
    """Draw the step's predicted timeline (and with ``measure`` the measured one, on the device a measurement
    uses) into ``path``; print each peak and its phase. The chart is the lessons' (04 and 05): matplotlib is imported
    only here, when a timeline is asked for."""
    if os.path.splitext(path)[1].lower() not in (".png", ".svg", ".pdf"):
        raise _ExitError(f"argument --timeline: {path!r} must end in .png, .svg or .pdf")
    from course_utils.lessons.memory_budget import timeline_chart
    from course_utils.timeline import predicted_timeline, tensor_total

    measured = None
    if measure:
        from course_utils.hardware import pick_device
        from course_utils.timeline_measure import measure_timeline

        device = pick_device()
        est = sm.estimate_step(config, **step, device=sm.estimate_device_for(device))
        try:
            measured = measure_timeline(config, **step, device=device, timeout_s=600.0)
        except (TimeoutError, RuntimeError) as err:
            print(f"measured timeline: none ({err}); the prediction alone is drawn")
    predicted = predicted_timeline(est)
    for who, tl in (("predicted", predicted), ("measured", measured)):
        if tl is not None:
            print(f"{who} timeline: peak {tensor_total(tl.peak) / 1e9:.2f} GB of tensors in the {tl.peak.phase} phase "
                  f"({tl.peak.label})")
    try:
        timeline_chart(predicted, measured, title=est.describe()).savefig(path, dpi=120)
    except OSError as err:
        raise _ExitError(f"argument --timeline: cannot write {path!r} ({err.strerror})") from None
    print(f"timeline written to {path}")


def _print_measurement(config: dict[str, Any], step: dict[str, Any]) -> None:
    from course_utils.hardware import pick_device
    from course_utils.measure import measure_training_step

    device = pick_device()  # one decision: the estimate compared below is for the device measured
    try:
        m = measure_training_step(config, **step, timeout_s=600.0, device=device)
    except (TimeoutError, RuntimeError) as err:
        raise _ExitError(f"argument --measure: {err}") from None
    # the estimate for the device measured: like with like (a GPU's allocator counter has no process baseline)
    est = sm.estimate_step(config, **step, device=sm.estimate_device_for(device))
    print(f"measured: {m.what}")
    print(sm.comparison_line(est.peak_bytes, m.peak_bytes))


#: The arguments of the Python API whose errors ("seq must be between ...") an option of the same name reports.
_OPTION_ARGS = ("batch", "seq", "lora_rank", "targets", "method", "optimizer")


def _naming_option(err: Exception) -> str:
    """An API error as the command line says it: 'argument --seq: seq must be ...' (unchanged if no option fits)."""
    name = str(err).split(" ", 1)[0].rstrip(":")
    return f"argument --{name.replace('_', '-')}: {err}" if name in _OPTION_ARGS else str(err)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``course-utils`` and ``python -m course_utils``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # the memory command: the table, one model's rows, or a whole-step estimate
        config = _resolve(args)
        budgets = args.budgets or args.gpu or list(mem.BUDGETS)
        if any(getattr(args, k) is not None for k in _STEP_OPTIONS):
            _print_step(args, config, budgets)
        else:
            _print_table(args, config, budgets)
    except _ExitError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0
