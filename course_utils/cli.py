"""The course's one command line: ``python -m course_utils memory ...`` (installed as ``course-utils``).

``memory`` without options prints the lesson's table (four models x four methods x three budgets). With
``--params N``, ``--config PATH|PRESET`` or ``--model ORG/NAME`` it estimates one model; ``--batch``, ``--seq``,
``--checkpointing``, ``--optimizer`` or ``--measure`` switch to a whole training step (activations included);
``--budgets`` and ``--gpu`` set the memory budgets. ``--method`` also accepts the methods beyond the table
(:data:`course_utils.memory.EXTRA_METHODS`, e.g. ``full-bf16``); the table without ``--method`` keeps its four.
Bad input, absurd sizes included (``--params 1e30``): one line on stderr naming the option and its allowed
range, exit status 2. Table mode imports no torch, so it answers instantly.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, Sequence

from course_utils import memory as mem
from course_utils.architecture import DEFAULT_TARGETS, normalize_targets
from course_utils.configs import config_presets, read_config, resolve_config
from course_utils.step_memory import MAX_BATCH, MAX_SEQ

#: The options that turn the table into a whole-step estimate.
STEP_OPTIONS = ("batch", "seq", "checkpointing", "optimizer", "measure")
DESCRIPTION = (
    "Estimate the memory a training run needs for weights, gradients and AdamW states (activations not "
    "included), and whether it fits a memory budget (at most 70% of it). Without options: the lesson's table. "
    "With --batch/--seq (or --checkpointing, --optimizer, --measure): a whole training step, activations included.")


class ExitError(Exception):
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


def parse_count(text: str) -> int:
    """A parameter count from text: '134515008', '7e9', '1.7B', '135M', '70b', '7_000_000_000'."""
    if not isinstance(text, str):
        raise TypeError(f"count must be text, got {type(text).__name__}")
    if text.strip().startswith("-"):
        raise ValueError(f"{text!r} must be a positive count")
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a count (examples: 134515008, 7e9, 1.7B, 135M)")
    value = float(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{text!r} must be a count of at least 1")
    return int(round(value))


def _count_text(n: float) -> str:
    """A bound as people read it: '1,000,000' up to a billion, '1e14' above."""
    return f"{int(n):,}" if n < 1e9 else f"{n:.0e}".replace("e+", "e")


def param_count(text: str) -> int:
    """:func:`parse_count`, between :data:`course_utils.memory.MIN_PARAMS` and ``MAX_PARAMS`` (1e14: 100 trillion)."""
    value = parse_count(text)
    if not mem.MIN_PARAMS <= value <= mem.MAX_PARAMS:
        raise ValueError(f"must be between {_count_text(mem.MIN_PARAMS)} and {_count_text(mem.MAX_PARAMS)} "
                         f"(100 trillion) parameters, got {text.strip()!r}")
    return value


def _typed(convert):
    """An argparse ``type=`` that turns ValueError/TypeError into argparse's own error."""
    def parse(text: str):
        try:
            return convert(text)
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("targets: ")) from None
    parse.__name__ = convert.__name__
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
    bad = [v for v in values if not (math.isfinite(v) and mem.MIN_BUDGET_GB <= v <= mem.MAX_BUDGET_GB)]
    if bad:
        raise ValueError(f"every budget must be between {mem.MIN_BUDGET_GB:g} and {_count_text(mem.MAX_BUDGET_GB)} "
                         f"GB, got {bad[0]:g}")
    return list(mem.budgets_from_gb(values))


def _gpu_budgets(text: str) -> list[mem.Budget]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("name at least one GPU, e.g. T4,L4,A100-40GB,H100")
    return [mem.gpu_budget(name) for name in names]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m course_utils``: one sub-command, ``memory``."""
    prog = "python -m course_utils" if os.path.basename(sys.argv[0]) in ("__main__.py", "-m") else "course-utils"
    parser = _Parser(prog=prog, description="Helpers of the course 'Pack the bag smarter'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    memory = sub.add_parser("memory", help="estimate the memory of training a model (weights, gradients, AdamW)",
                            description=DESCRIPTION)
    what = memory.add_mutually_exclusive_group()
    what.add_argument("--params", type=_typed(param_count), metavar="N",
                      help="parameter count of your model (e.g. 134515008, 7e9, 1.7B; 1,000 to 1e14)")
    what.add_argument("--config", metavar="PATH",
                      help="an architecture config.json, or a shipped preset: "
                           + ", ".join(config_presets()) + " (exact counts)")
    what.add_argument("--model", metavar="ORG/NAME",
                      help="a model on the Hugging Face Hub: reads only its config.json (no weights)")
    memory.add_argument("--method", choices=tuple(mem.ALL_METHODS), default=None,
                        help="show one method only (table); the method of the step (default lora). full-bf16: "
                             "every weight, its gradient and AdamW's states in bfloat16 (8 bytes per parameter)")
    memory.add_argument("--lora-rank", type=_typed(_whole(mem.MAX_LORA_RANK)), default=mem.REFERENCE_RANK,
                        metavar="R", help="LoRA rank (default 8)")
    memory.add_argument("--targets", type=_typed(normalize_targets), default=None, metavar="NAMES",
                        help="LoRA target modules, comma-separated (default q_proj,v_proj; or all-linear); "
                             "needs --config or --model")
    budgets = memory.add_mutually_exclusive_group()
    step = memory.add_argument_group("a whole training step, activations included")
    for group, flag, parse, metavar, text in (
            (budgets, "--budgets", _budget_sizes, "GB,GB",
             "memory budgets in GB, comma-separated (default: laptop 16, GPU 24, GPU 80)"),
            (budgets, "--gpu", _gpu_budgets, "NAME,NAME",
             "budget by GPU name from the datasheet table, e.g. T4,L4,A100-40GB,H100 (a T4: the 15.33 GB a "
             "process can use)"),
            (step, "--batch", _whole(MAX_BATCH), "B", "batch size (default 1)"),
            (step, "--seq", _whole(MAX_SEQ), "S", "sequence length in tokens (default 128)")):
        group.add_argument(flag, type=_typed(parse), default=None, metavar=metavar, help=text)
    step.add_argument("--checkpointing", action="store_true", default=None, help="gradient checkpointing")
    step.add_argument("--optimizer", choices=mem.OPTIMIZERS, default=None, help="optimizer (default adamw)")
    step.add_argument("--measure", action="store_true", default=None,
                      help="also run the step and measure its peak memory")
    memory.set_defaults(run=run_memory)
    return parser


# --------------------------------------------------------------------------------------------
# The memory command
# --------------------------------------------------------------------------------------------
@dataclass
class Request:
    """What ``memory`` was asked, options resolved: the config (a dict) or a parameter count, and the budgets."""

    name: str
    config: dict[str, Any] | None
    params: int | None
    budgets: list[mem.Budget]


def _resolve(args: argparse.Namespace) -> Request:
    budgets = args.budgets or args.gpu or list(mem.BUDGETS)
    if args.model is not None:
        from course_utils.configs import fetch_config

        try:
            cfg = fetch_config(args.model)
        except (ValueError, OSError) as err:
            raise ExitError(f"argument --model: {err}") from None
        return Request(args.model, cfg, None, budgets)
    if args.config is not None:
        try:
            path = resolve_config(args.config)
            return Request(path.stem, read_config(path), None, budgets)
        except (ValueError, TypeError) as err:
            raise ExitError(f"argument --config: {err}") from None
    if args.targets is not None:
        raise ExitError("argument --targets: needs --config or --model (the adapter's size depends on the "
                        "architecture)")
    return Request("", None, args.params, budgets)


def run_memory(args: argparse.Namespace) -> int:
    """The ``memory`` command: the table, one model's rows, or a whole-step estimate."""
    request = _resolve(args)
    if any(getattr(args, k) is not None for k in STEP_OPTIONS):
        return _print_step(args, request)
    return _print_table(args, request)


def _print_table(args: argparse.Namespace, request: Request) -> int:
    methods = [args.method] if args.method else list(mem.METHODS)
    targets = args.targets or DEFAULT_TARGETS
    assumed_note = False
    if request.config is not None:
        try:
            model = mem.model_from_config(request.config, args.lora_rank, targets, name=request.name)
        except (ValueError, TypeError) as err:
            raise ExitError(f"argument --{'model' if args.model else 'config'}: {err}") from None
        except ImportError as err:  # an architecture outside the arithmetic needs transformers
            raise ExitError(f"argument --config: counting a {request.config.get('model_type')!r} model needs "
                            f"transformers ({err})") from None
        print(f"{request.name}: {model.params:,} parameters; LoRA rank {args.lora_rank} on {', '.join(targets)} "
              f"trains {model.adapter:,} numbers ({100 * model.adapter / model.params:.2f}%), counted from the config.")
        models: tuple[mem.ModelSize, ...] = (model,)
    elif request.params is not None:
        models = (mem.ModelSize(mem.size_name(request.params), request.params),)
        assumed_note = True
    else:  # the lesson's table: its assumption is explained in the lesson, and noted here for another rank
        models = mem.MODELS
        assumed_note = args.lora_rank != mem.REFERENCE_RANK
    rows = mem.estimate_table(models, methods, args.lora_rank)
    notes = [mem.FOOTNOTE_QLORA] if any(r.method == "qlora" for r in rows) else []
    if assumed_note and any(r.adapter_assumed for r in rows):
        share = 100 * mem.ADAPTER_SHARE * args.lora_rank / mem.REFERENCE_RANK
        notes.append(f"LoRA rank {args.lora_rank} is assumed to train {share:.2f}% of the model (SmolLM2-135M's "
                     "share, linear in the rank); pass --config for an exact count.")
    print(mem.format_table(rows, request.budgets, notes=notes))
    return 0


def _print_step(args: argparse.Namespace, request: Request) -> int:
    from course_utils import step_memory as sm

    if request.config is None:
        raise ExitError("argument --config: a whole-step estimate needs the architecture (activations depend on "
                        "hidden size, layers, vocabulary); give --config or --model, --params alone is not enough")
    step = dict(method=args.method or "lora", batch=args.batch or 1, seq=args.seq or 128,
                lora_rank=args.lora_rank, targets=args.targets or DEFAULT_TARGETS,
                checkpointing=bool(args.checkpointing), optimizer=args.optimizer or "adamw")
    config = {**request.config, "_name_or_path": request.name}
    device = "cuda" if args.gpu else "cpu"  # a GPU's budget is its allocator's counter: no CPU process baseline
    try:
        est = sm.estimate_step(config, **step, device=device)
        if args.measure:  # a measured step has tighter bounds (batch, rank): say so before printing anything
            from course_utils.measure import step_spec

            step_spec(config, **step)
    except (ValueError, TypeError) as err:
        raise ExitError(_naming_option(err)) from None
    print(est.format())
    for budget in request.budgets:
        verdict = "fits" if est.peak_gb <= budget.gb else "does not fit"
        print(f"  {budget.label} budget: {verdict} (the predicted peak is {100 * est.peak_gb / budget.gb:.0f} % of it)")
    if args.measure:
        _print_measurement(config, step, est)
    return 0


def _print_measurement(config: dict[str, Any], step: dict[str, Any], est: Any) -> None:
    from course_utils import step_memory as sm
    from course_utils.hardware import pick_device
    from course_utils.measure import measure_training_step

    device = pick_device()  # one decision: the estimate compared below is for the device measured
    try:
        m = measure_training_step(config, **step, timeout_s=600.0, device=device)
    except (TimeoutError, RuntimeError) as err:
        raise ExitError(f"argument --measure: {err}") from None
    if sm.estimate_device_for(device) != est.device:  # compare like with like (a GPU's counter has no baseline)
        est = sm.estimate_step(config, **step, device=sm.estimate_device_for(device))
    print(f"measured: {m.what}")
    print(sm.comparison_line(est.peak_bytes, m.peak_bytes))


#: The option of each argument name an error of the Python API starts with ("seq must be between ...").
_OPTIONS = {"batch": "--batch", "seq": "--seq", "lora_rank": "--lora-rank", "targets": "--targets",
            "method": "--method", "optimizer": "--optimizer"}


def _naming_option(err: Exception) -> str:
    """An API error as the command line says it: 'argument --seq: seq must be ...' (unchanged if no option fits)."""
    option = _OPTIONS.get(str(err).split(" ", 1)[0].rstrip(":"))
    return f"argument {option}: {err}" if option else str(err)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``course-utils`` and ``python -m course_utils``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ExitError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return 2
