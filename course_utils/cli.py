"""The course's one command line: ``python -m course_utils memory ...`` (installed as ``course-utils``).

``memory`` without options prints the lesson's table (four models x four methods x three budgets). With
``--params N``, ``--config PATH|PRESET`` or ``--model ORG/NAME`` it estimates one model; ``--batch``, ``--seq``,
``--checkpointing``, ``--optimizer``, ``--timeline`` or ``--measure`` switch to a whole training step (activations
included); ``--budgets`` and ``--gpu`` set the memory budgets: the table marks a row "fits" at most at the 70 % line
of the memory; a whole step is judged by :func:`course_utils.memory.step_verdict` ("fits" up to 90 % of usable,
"tight" up to 100 %, else "does not fit"; on a GPU usable = the card's memory less the 0.5 GB CUDA context; a CPU
estimate, without ``--gpu``, against the whole memory). ``--method`` also accepts the methods beyond the table
(:data:`course_utils.memory.EXTRA_METHODS`, e.g. ``full-bf16``); the table without ``--method`` keeps its four.
Bad input, absurd sizes included (``--params 1e30``), and a library that is not installed (torch for ``--measure``):
one line on stderr naming the option (and what to install), exit status 2. Table mode imports no torch.
"""

import argparse
import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NoReturn, Sequence

from course_utils import memory as mem
from course_utils import step_memory as sm
from course_utils.architecture import DEFAULT_TARGETS, normalize_targets
from course_utils.configs import config_presets, fetch_config, read_config, resolve_config
from course_utils.datasheets import CUDA_CONTEXT_GB

#: What "tight" means, under the verdicts of a whole step.
_TIGHT_MEANS = "the allocator's reserve and fragmentation (or the system) can still run out of memory."
#: The options that turn the table into a whole-step estimate.
_STEP_OPTIONS = ("batch", "seq", "checkpointing", "optimizer", "measure", "no_kbit_preparation", "timeline")
#: A whole step's values for the options not given (the table without --method shows every method; a step is LoRA).
_STEP_OPTION_DEFAULTS = {"method": "lora", "batch": 1, "seq": 128, "targets": DEFAULT_TARGETS, "optimizer": "adamw"}
_DESCRIPTION = (
    "The memory of training a model: weights, gradients, optimizer states (a row fits at most at 70% of a budget). "
    "With a step option (--batch, --seq, ...): a whole step, activations included (fits up to 90% of usable memory)."
)


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
        low, high = _count_text(mem.MIN_PARAMS), _count_text(mem.MAX_PARAMS)
        raise ValueError(f"must be between {low} and {high} (100 trillion) parameters, got {text.strip()!r}")
    return int(round(value))


def _typed(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` whose ValueError/TypeError becomes argparse's own one-line error."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("targets: ")) from None

    return parse


def _whole(high: int) -> Callable[[str], int]:
    """A parser of whole numbers from 1 to ``high``."""

    def whole(text: str) -> int:
        if not text.strip().lstrip("+-").isdigit():
            raise ValueError(f"{text!r} is not a whole number")
        if not 1 <= int(text) <= high:
            raise ValueError(f"must be a whole number between 1 and {_count_text(high)}, got {int(text)}")
        return int(text)

    return _typed(whole)


def _budget_sizes(text: str) -> list[mem.Budget]:
    """Budgets in GB from '12,24' (a 'GB' suffix allowed), each between MIN_BUDGET_GB and MAX_BUDGET_GB."""
    try:
        values = [float(item.strip().upper().removesuffix("GB")) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r}: budgets are sizes in GB separated by commas, e.g. 12,24") from None
    bad = [v for v in values if not mem.MIN_BUDGET_GB <= v <= mem.MAX_BUDGET_GB]  # nan and inf are outside too
    if bad:
        high = _count_text(mem.MAX_BUDGET_GB)
        raise ValueError(f"every budget must be between {mem.MIN_BUDGET_GB:g} and {high} GB, got {bad[0]:g}")
    return [mem.Budget(f"{v:g} GB", v) for v in values]


def _gpu_budgets(text: str) -> list[mem.Budget]:
    """One budget per GPU name of the datasheet table ('T4,H100'); an empty name is not in the table either."""
    return [mem.gpu_budget(name.strip()) for name in text.split(",")]


def _figure_path(text: str) -> str:
    """A file name for the timeline chart: .png, .svg or .pdf."""
    if os.path.splitext(text)[1].lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"{text!r} must end in .png, .svg or .pdf")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m course_utils``: one sub-command, ``memory``."""
    prog = "python -m course_utils" if os.path.basename(sys.argv[0]) in ("__main__.py", "-m") else "course-utils"
    parser = _Parser(prog=prog, description="Helpers of the course 'Pack the bag smarter'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    memory = sub.add_parser("memory", help="estimate the memory of training a model", description=_DESCRIPTION)
    presets = ", ".join(config_presets())
    model = memory.add_mutually_exclusive_group()
    model.add_argument("--params", type=_typed(param_count), metavar="N", help="parameter count, e.g. 7e9, 1.7B, 135M")
    model.add_argument("--config", metavar="PATH", help=f"an architecture config.json, or a shipped preset: {presets}")
    model.add_argument("--model", metavar="ORG/NAME", help="a Hugging Face Hub model (reads its config.json only)")
    memory.add_argument("--method", choices=mem.ALL_METHODS, help="one method only (table); the step's (default lora)")
    memory.add_argument(
        "--lora-rank", type=_whole(mem.MAX_LORA_RANK), default=mem.REFERENCE_RANK, help="rank (default %(default)s)"
    )
    memory.add_argument("--targets", type=_typed(normalize_targets), help="LoRA targets (default q_proj,v_proj)")
    budgets = memory.add_mutually_exclusive_group()
    budgets.add_argument("--budgets", type=_typed(_budget_sizes), metavar="GB,GB", help="budgets (default 16,24,80)")
    budgets.add_argument("--gpu", type=_typed(_gpu_budgets), metavar="NAME,NAME", help="GPUs, e.g. T4,A100-40GB,H100")
    step = memory.add_argument_group("a whole training step, activations included")
    step.add_argument("--batch", type=_whole(sm.MAX_BATCH), metavar="B", help="batch size (default 1)")
    step.add_argument("--seq", type=_whole(sm.MAX_SEQ), metavar="S", help="sequence length in tokens (default 128)")
    step.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    step.add_argument("--optimizer", choices=mem.OPTIMIZERS, help="optimizer (default adamw)")
    step.add_argument("--measure", action="store_true", help="also run the step and measure its peak (needs torch)")
    step.add_argument("--timeline", type=_typed(_figure_path), metavar="FILE", help="memory over time: .png/.svg/.pdf")
    step.add_argument("--no-kbit-preparation", action="store_true", help="qlora without peft's k-bit preparation")
    return parser


# --------------------------------------------------------------------------------------------
# The memory command
# --------------------------------------------------------------------------------------------
@contextmanager
def _blame(option: str) -> Iterator[None]:
    """Inside: what fails on the user's input (ValueError, TypeError, OSError, RuntimeError) is one line naming
    ``option``; so is a library that is not installed (torch to measure, transformers to count), with its name."""
    try:
        yield
    except ModuleNotFoundError as err:
        name = (err.name or "a library").split(".")[0]
        raise _ExitError(f"argument {option}: needs {name}, which is not installed here (pip install {name})") from None
    except (ValueError, TypeError, OSError, RuntimeError) as err:
        raise _ExitError(f"argument {option}: {err}") from None


def _config_option(args: argparse.Namespace) -> str:
    """The option the architecture came from: ``--model`` or ``--config``."""
    return "--model" if args.model is not None else "--config"


def _resolve(args: argparse.Namespace) -> dict[str, Any] | None:
    """The config from ``--model`` or ``--config`` (None for --params or the table), named by its
    ``_name_or_path`` (the Hub id, or the file's or preset's name): see :func:`course_utils.configs.config_name`."""
    if args.model is None and args.config is None:
        if args.targets is not None:
            raise _ExitError("argument --targets: needs --config or --model (the adapter's size depends on the model)")
        return None
    with _blame(_config_option(args)):
        if args.model is not None:
            return {**fetch_config(args.model), "_name_or_path": args.model}
        return {**read_config(args.config), "_name_or_path": resolve_config(args.config).stem}


def _print_table(args: argparse.Namespace, config: dict[str, Any] | None, budgets: list[mem.Budget]) -> None:
    """The rows of one model (``--config``, ``--model`` or ``--params``), or the lesson's table."""
    targets = args.targets or DEFAULT_TARGETS
    models = mem.MODELS
    if config is not None:
        with _blame(_config_option(args)):  # an architecture outside the arithmetic is counted with transformers
            model = mem.model_from_config(config, args.lora_rank, targets)
        share = 100 * model.adapter / model.params
        trains = f"trains {model.adapter:,} numbers ({share:.2f}%), counted from the config."
        print(f"{model.name}: {model.params:,} parameters; LoRA rank {args.lora_rank} on {', '.join(targets)} {trains}")
        models = (model,)
    elif args.params is not None:
        models = (mem.ModelSize(mem.size_name(args.params), args.params),)
    rows = mem.estimate_table(models, [args.method] if args.method else list(mem.METHODS), args.lora_rank)
    notes = []
    # the lesson's table explains its assumption in the lesson: noted here for --params or another rank
    if (args.params is not None or args.lora_rank != mem.REFERENCE_RANK) and any(r.adapter_assumed for r in rows):
        share = 100 * mem.ADAPTER_SHARE * args.lora_rank / mem.REFERENCE_RANK
        notes.append(
            f"LoRA rank {args.lora_rank} is assumed to train {share:.2f}% of the model (SmolLM2-135M's share, "
            "linear in the rank); pass --config for an exact count."
        )
    print(mem.format_table(rows, budgets, notes=notes))


def _print_step(args: argparse.Namespace, config: dict[str, Any] | None, budgets: list[mem.Budget]) -> None:
    """A whole step: its estimate against each budget; then the timeline and the measurement, if asked for."""
    if config is None:  # blame the option given: --params, or the first step option
        given = next(name for name in ("params", *_STEP_OPTIONS) if getattr(args, name)).replace("_", "-")
        needs = "a whole-step estimate needs the architecture (activations depend on hidden size, layers, vocabulary)"
        raise _ExitError(f"argument --{given}: {needs}: give --config or --model")
    if args.no_kbit_preparation and args.method != "qlora":
        raise _ExitError("argument --no-kbit-preparation: only for --method qlora (the preparation is QLoRA's step)")
    step = {name: getattr(args, name) or default for name, default in _STEP_OPTION_DEFAULTS.items()}
    step.update(lora_rank=args.lora_rank, checkpointing=args.checkpointing)
    step["kbit_preparation"] = not args.no_kbit_preparation
    device = "cuda" if args.gpu else "cpu"  # a GPU's budget is its allocator's counter: no CPU process baseline
    try:  # one estimate per GPU generation: the attention kernel a card gets can change the activations
        estimates = {
            b.capability: sm.estimate_step(config, **step, device=device, capability=b.capability) for b in budgets
        }
        if args.measure:  # a measured step has tighter bounds (batch, rank): said before anything is printed
            with _blame("--measure"):
                from course_utils.hardware import pick_device
                from course_utils.measure import measure_training_step, step_spec
            step_spec(config, **step)
    except (ValueError, TypeError) as err:
        raise _ExitError(_naming_option(err)) from None
    _print_verdicts(estimates, budgets, device)
    est, measuring = estimates[budgets[0].capability], None
    if args.measure:
        measuring = pick_device()  # one decision: the timeline and the step are measured there
        est = sm.estimate_step(config, **step, device=sm.estimate_device_for(measuring))  # like with like
    if args.timeline:
        _write_timeline(args.timeline, config, step, est, measuring)
    if args.measure:
        with _blame("--measure"):
            m = measure_training_step(config, **step, timeout_s=600.0, device=measuring)
        print(f"measured: {m.what}")
        print(sm.comparison_line(est.peak_bytes, m.peak_bytes))  # against the estimate for the measured device


def _print_verdicts(estimates: dict[Any, sm.StepEstimate], budgets: list[mem.Budget], device: str) -> None:
    """Each estimate (once per GPU generation that changes it), each budget's verdict, and what the verdicts mean."""
    on_gpu, tight = device == "cuda", round(100 * mem.TIGHT_SHARE)
    printed = None
    for budget in budgets:
        est = estimates[budget.capability]
        if est.format() != printed:
            printed = est.format()
            print(printed)
        usable = mem.step_limit_gb(budget.gb, device)  # a GPU: the card's memory less the CUDA context
        where = f"{budget.label} budget, usable {usable:.4g} GB" if on_gpu else f"{budget.label} budget"
        share = f"{100 * est.peak_gb / usable:.0f} % of {'usable' if on_gpu else 'it'}"
        print(f"  {where}: {mem.step_verdict(est.peak_gb, usable)} (the predicted peak is {share})")
    of = f"usable (the card's memory less the {CUDA_CONTEXT_GB:g} GB CUDA context)" if on_gpu else "the memory"
    print(f"fits = the predicted peak is at most {tight} % of {of};")
    print(f"tight = {tight}-100 %: {_TIGHT_MEANS}")


def _write_timeline(path: str, config: dict[str, Any], step: dict[str, Any], est: sm.StepEstimate, device: Any) -> None:
    """Draw the predicted timeline of ``est`` (and, with a ``device`` to measure on, the measured one) into ``path``;
    print each peak and its phase. The chart is the lessons' (04 and 05): matplotlib is imported only here."""
    from course_utils.lessons.memory_budget import timeline_chart
    from course_utils.timeline import predicted_timeline, tensor_total

    measured = None
    if device is not None:
        from course_utils.timeline_measure import measure_timeline

        try:
            measured = measure_timeline(config, **step, device=device, timeout_s=600.0)
        except (TimeoutError, RuntimeError) as err:
            print(f"measured timeline: none ({err}); the prediction alone is drawn")
    predicted = predicted_timeline(est)
    for who, tl in (("predicted", predicted), ("measured", measured)):
        if tl is not None:
            gb = tensor_total(tl.peak) / 1e9
            print(f"{who} timeline: peak {gb:.2f} GB of tensors in the {tl.peak.phase} phase ({tl.peak.label})")
    with _blame("--timeline"):
        timeline_chart(predicted, measured, title=est.describe()).savefig(path, dpi=120)
    print(f"timeline written to {path}")


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
        if any(getattr(args, name) for name in _STEP_OPTIONS):
            _print_step(args, config, budgets)
        else:
            _print_table(args, config, budgets)
    except _ExitError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0
