"""Memory budgets: will a training run fit before you start it?

The lesson's estimator counts what a training step must keep in memory *besides* activations:

* **full fine-tuning in float32**: every weight is trained, so each parameter carries 4 bytes of
  weight, 4 bytes of gradient and 8 bytes of AdamW state (two running averages): **16 bytes**;
* **full fine-tuning in pure bfloat16** (``full-bf16``, outside the lesson's table): every weight trained and
  stored in bfloat16 with no float32 master copy, as torchtune and many Trainer scripts do on Ampere-or-newer
  GPUs: 2 bytes of weight, 2 of gradient, 2 + 2 of AdamW state (torch keeps the states in the weight's dtype):
  **8 bytes**;
* **LoRA**: the base model is frozen and stored at 4 bytes (float32), 2 bytes (bfloat16) or half a
  byte (4 bits, QLoRA) per weight; gradients and AdamW states exist only for the adapter's numbers:
  **12 bytes** each (4 gradient + 8 AdamW). As in the lesson, the adapter's own float32 copy (4 bytes
  per number) is left out: it is 0.0018 GB for SmolLM2-135M at rank 8.

GB here means 10^9 bytes. Two verdicts, one meaning each:

* **the table** (this estimate, activations left out): a run "fits" a memory size when the estimate is at most
  its **70 % line** (:func:`line_gb`, 70 % of the memory: a GPU's is the card's memory,
  :attr:`course_utils.datasheets.Datasheet.total_gb`); the rest is for activations (which grow with batch and
  text length), the framework and the system;
* **a whole step** (:mod:`course_utils.step_memory`, activations included) is judged against the GPU's
  **usable** memory, the card's memory less the 0.5 GB CUDA context (:func:`course_utils.datasheets.usable_gb`):
  :func:`step_verdict` says "fits" up to 90 % of it (:data:`TIGHT_SHARE`), "tight" from 90 % to 100 % (the
  caching allocator's reserve and fragmentation can still run out of memory), "does not fit" above.

The lesson's table has four methods (:data:`METHODS`); :data:`EXTRA_METHODS` are selectable by key (the
command line's ``--method``, the planners) but never shown in the table. :data:`ALL_METHODS` holds both.

Without an architecture config the adapter's size is an **assumption**: LoRA rank 8 on ``q_proj`` and
``v_proj`` trains 460,800 of SmolLM2-135M's 134,515,008 numbers (0.34 %), and the table assumes the same
share for every model (scaled linearly with the rank). With a ``config.json`` the counts are exact:
:mod:`course_utils.architecture` counts them (:func:`model_from_config`).

A whole training step (activations, transient buffers, the framework) is :mod:`course_utils.step_memory`;
the command line is :mod:`course_utils.cli`. This module is pure arithmetic: no torch, no measuring.
"""

from dataclasses import dataclass
from typing import Any, Sequence

from course_utils import checks, datasheets
from course_utils.architecture import DEFAULT_TARGETS, MAX_LORA_RANK, Config, Targets
from course_utils.architecture import count_parameters, lora_adapter_params
from course_utils.configs import config_name, read_config
from course_utils.units import GB

#: The table's 70 % line: the share of a memory size the weights-only estimate may use; the rest is for
#: activations, the framework, the system.
LINE_SHARE = 0.70
#: A whole-step estimate "fits" up to this share of usable memory and is "tight" above it, up to 100 %.
TIGHT_SHARE = 0.90
#: The verdicts of :func:`step_verdict`, from best to worst.
STEP_VERDICTS: tuple[str, ...] = ("fits", "tight", "does not fit")
#: SmolLM2-135M's parameter count (its architecture config, counted on the meta device).
SMOLLM2_PARAMS = 134_515_008
#: Numbers trained by LoRA rank 8 on q_proj and v_proj of SmolLM2-135M.
SMOLLM2_ADAPTER = 460_800
#: The rank behind :data:`SMOLLM2_ADAPTER`.
REFERENCE_RANK = 8
#: The lesson's assumption for models without a config: LoRA trains this share of the model (0.34 %).
ADAPTER_SHARE = SMOLLM2_ADAPTER / SMOLLM2_PARAMS
#: The parameter counts the estimator accepts: 1,000 (a toy) to 10^14 (100 trillion, ~50x today's largest models).
MIN_PARAMS = 1_000
MAX_PARAMS = 10**14
#: The memory budgets the estimator accepts, in GB: 10 MB to 10 TB (a rack of GPUs).
MIN_BUDGET_GB = 0.01
MAX_BUDGET_GB = 10_000.0
#: The optimizers a step can use: torch's AdamW (8 bytes of state per trained number) or bitsandbytes' 8-bit AdamW.
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw8bit")


# --------------------------------------------------------------------------------------------
# Methods, models and budgets of the lesson's table
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """A way to train (keyed in :data:`ALL_METHODS`): its label, bytes per frozen base weight (None: all trained),
    bytes per trained number.

    A trained number costs ``trained_bytes`` of gradient and twice that of AdamW state (torch keeps both states
    in the trained tensor's dtype), plus the same again of weight when the method trains every weight.
    For :mod:`course_utils.step_memory`: ``model_bytes`` per number of the hidden states and the weights that are
    not quantized (2 for a 16-bit base), and ``weights``, what the weights are in its breakdown (``{rest}``: the
    dtype of QLoRA's embedding and norms).
    """

    label: str
    base_bytes: float | None
    trained_bytes: int = 4
    model_bytes: int = 4
    weights: str = "float32"

    @property
    def trains_all(self) -> bool:
        """True for full fine-tuning: every weight gets a gradient and optimizer states."""
        return self.base_bytes is None


#: The four methods of the lesson, in the table's order.
METHODS: dict[str, Method] = {
    "full": Method("full fine-tuning (float32)", None),
    "lora": Method("LoRA, base in float32", 4.0, weights="float32 base + adapters"),
    "lora-bf16": Method("LoRA, base in bfloat16", 2.0, model_bytes=2, weights="bfloat16 base + float32 adapters"),
    "qlora": Method(
        "QLoRA, base in 4 bits", 0.5, model_bytes=2, weights="NF4 base, {rest} embedding/norms + float32 adapters"
    ),
}
#: Methods beyond the lesson's table: selectable by key, never in the table (its four rows per model stay four).
EXTRA_METHODS: dict[str, Method] = {"full-bf16": Method("full fine-tuning (bfloat16)", None, 2, 2, "bfloat16")}
#: Every method the estimator accepts: the table's four, then the extras.
ALL_METHODS: dict[str, Method] = {**METHODS, **EXTRA_METHODS}


@dataclass(frozen=True)
class ModelSize:
    """A model by its name and parameter count; ``adapter`` is its exact LoRA count, or None (assume the share)."""

    name: str
    params: int
    adapter: int | None = None


#: The lesson's four models. The sizes other than SmolLM2 are round sizes of common families (an assumption).
MODELS: tuple[ModelSize, ...] = (
    ModelSize("SmolLM2-135M", SMOLLM2_PARAMS),
    ModelSize("a 1.7B model", 1_700_000_000),
    ModelSize("a 7B model", 7_000_000_000),
    ModelSize("a 70B model", 70_000_000_000),
)


@dataclass(frozen=True)
class Budget:
    """A memory budget: a label for the table and its memory in GB (a GPU's: the card's memory)."""

    label: str
    gb: float
    capability: tuple[int, int] | None = None  # a named GPU's CUDA compute capability (its attention kernels)

    @property
    def line_gb(self) -> float:
        """The table's 70 % line of this memory (:func:`line_gb`)."""
        return line_gb(self.gb)


#: The lesson's three budgets: the course laptop and two rentable GPUs.
BUDGETS: tuple[Budget, ...] = (Budget("laptop 16 GB", 16.0), Budget("GPU 24 GB", 24.0), Budget("GPU 80 GB", 80.0))


def gpu_budget(gpu: str) -> Budget:
    """A GPU by name ('T4', 'A100-40GB') as a budget of its card's memory, e.g. 'T4 15.83 GB' (the exposed memory).

    See :attr:`course_utils.datasheets.Datasheet.total_gb`; its usable memory (less the CUDA context) is
    :func:`course_utils.datasheets.usable_gb` of ``gb``.
    """
    sheet = datasheets.lookup(gpu)
    return Budget(f"{gpu} {sheet.total_gb:.4g} GB", sheet.total_gb, sheet.capability)


def line_gb(budget_gb: float) -> float:
    """The table's 70 % line of a memory of ``budget_gb`` GB (a GPU's: the card's memory): 70 % of it."""
    budget_gb = checks.number(budget_gb, "budget_gb", MIN_BUDGET_GB, MAX_BUDGET_GB)
    return round(budget_gb * LINE_SHARE, 10)  # 16 * 0.7 is 11.2, not 11.200000000000001


def step_limit_gb(memory_gb: float, device: str = "cuda") -> float:
    """What a whole training step may be handed on a machine of ``memory_gb`` GB: on ``"cuda"`` the GPU's usable
    memory (the card's memory less the CUDA context, :func:`course_utils.datasheets.usable_gb`); on ``"cpu"`` the
    memory itself (no CUDA context there; the CPU step estimate already counts the process's own baseline).

    ValueError naming ``budget_gb`` for a memory outside :data:`MIN_BUDGET_GB` .. :data:`MAX_BUDGET_GB` or, on a GPU,
    not above the context.
    """
    memory_gb = checks.number(memory_gb, "budget_gb", MIN_BUDGET_GB, MAX_BUDGET_GB)
    on_gpu = checks.choice(device, "device", ("cpu", "cuda")) == "cuda"
    return datasheets.usable_gb(memory_gb, "budget_gb") if on_gpu else memory_gb


def step_verdict(peak_gb: float, usable_gb: float) -> str:
    """The verdict on a whole-step estimate of ``peak_gb`` against ``usable_gb`` (a GPU's usable memory):
    "fits" up to :data:`TIGHT_SHARE` (90 %) of it, "tight" above that up to 100 %, "does not fit" above 100 %.

    "Tight" is not "fits": PyTorch's caching allocator reserves blocks in chunks and fragments, so a step whose
    estimate is within a few percent of usable can still run out of memory on a real card.
    """
    share = checks.number(peak_gb, "peak_gb", 0) / checks.positive(usable_gb, "usable_gb")
    if share <= TIGHT_SHARE + 1e-12:
        return "fits"
    return "tight" if share <= 1 + 1e-12 else "does not fit"


# --------------------------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """What a training step keeps in memory besides activations, split in three parts (bytes).

    ``trained`` is the number of trained numbers (all parameters for full tuning, the adapter for LoRA;
    a float when it comes from the 0.34 % assumption).
    """

    model: str
    method: str
    params: int
    trained: float
    weights_bytes: float
    gradient_bytes: float
    optimizer_bytes: float
    adapter_assumed: bool = False

    @property
    def gb(self) -> float:
        """Weights + gradients + optimizer states, in GB (10^9 bytes)."""
        return (self.weights_bytes + self.gradient_bytes + self.optimizer_bytes) / GB

    @property
    def label(self) -> str:
        """The method's label, e.g. 'LoRA, base in float32'."""
        return ALL_METHODS[self.method].label

    def parts_gb(self) -> dict[str, float]:
        """The three parts in GB, in the order a stacked bar draws them."""
        parts = {"weights": self.weights_bytes, "gradients": self.gradient_bytes, "AdamW states": self.optimizer_bytes}
        return {part: nbytes / GB for part, nbytes in parts.items()}

    def fits(self, budget_gb: float) -> bool:
        """True when this estimate is at most the 70 % line of ``budget_gb`` (in GB; a GPU's: the card's memory)."""
        return self.gb <= line_gb(budget_gb) + 1e-12


def assumed_adapter_params(params: float, lora_rank: int = REFERENCE_RANK) -> float:
    """The lesson's assumption: LoRA trains 460,800 / 134,515,008 of a model at rank 8, linear in the rank."""
    params = checks.number(params, "params", MIN_PARAMS, MAX_PARAMS)
    return params * ADAPTER_SHARE * checks.integer(lora_rank, "lora_rank", 1, MAX_LORA_RANK) / REFERENCE_RANK


def estimate(
    params: float, method: str = "lora", *, adapter: int | None = None, lora_rank: int = REFERENCE_RANK, name: str = ""
) -> MemoryEstimate:
    """Estimate weights + gradients + AdamW states for training a model of ``params`` parameters.

    ``method`` is one of :data:`ALL_METHODS` (``full``, ``lora``, ``lora-bf16``, ``qlora``, ``full-bf16``);
    ``params`` is between :data:`MIN_PARAMS` and :data:`MAX_PARAMS` (ValueError otherwise). ``adapter`` is the
    exact number of LoRA numbers if you know it (see :func:`lora_adapter_params`); without it the lesson's
    0.34 % share is assumed, scaled by ``lora_rank`` / 8. Activations are not included.
    """
    params_n = checks.number(params, "params", MIN_PARAMS, MAX_PARAMS)
    meth = ALL_METHODS[checks.choice(method, "method", ALL_METHODS)]
    assumed = adapter is None and not meth.trains_all
    if meth.trains_all:
        trained, weights = params_n, meth.trained_bytes * params_n
    else:
        trained = assumed_adapter_params(params_n, lora_rank) if assumed else checks.positive(adapter, "adapter")
        weights = meth.base_bytes * params_n
    grads = meth.trained_bytes * trained  # AdamW keeps two states of the gradient's size
    return MemoryEstimate(name, method, int(params_n), trained, weights, grads, 2 * grads, adapter_assumed=assumed)


def estimate_table(
    models: Sequence[ModelSize] = MODELS, methods: Sequence[str] = tuple(METHODS), lora_rank: int = REFERENCE_RANK
) -> list[MemoryEstimate]:
    """One estimate per model and method, models outermost: the rows of the lesson's table.

    A model's exact adapter count is used when it has one (:attr:`ModelSize.adapter`).
    """
    return [estimate(m.params, k, adapter=m.adapter, lora_rank=lora_rank, name=m.name) for m in models for k in methods]


def what_fits(budget_gb: float) -> list[MemoryEstimate]:
    """The rows of the lesson's table that fit ``budget_gb`` (at most its 70 % line)."""
    return [e for e in estimate_table() if e.fits(budget_gb)]


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------
_FOOTNOTE_FITS = "fits = the estimate uses at most 70% of the memory (the rest: activations, the system)."
#: "QLoRA needs a GPU library" is out of date: bitsandbytes 0.50 runs its 4-bit layers on x86 CPUs too. What stays
#: true is that a CPU trains a 7B model (the reason to use QLoRA) far too slowly for a first experiment.
FOOTNOTE_QLORA = "QLoRA: bitsandbytes 0.50 runs on x86 CPUs too, but slowly for the large models QLoRA is for."


def format_table(
    rows: Sequence[MemoryEstimate], budgets: Sequence[Budget] = BUDGETS, *, notes: Sequence[str] = ()
) -> str:
    """The estimator's table: a header line, one row per estimate with fits/no per budget, the footnotes.

    The footnotes are the 'fits =' line, the QLoRA note when a QLoRA row is shown, then ``notes``. ``rows`` holds at
    least one estimate.
    """
    name_w = max(15, max(len(r.model) for r in rows) + 3)
    col_ws = [max(14, len(b.label) + 2) for b in budgets]
    header = f"{'model':<{name_w}}{'method':<28}{'GB':>9}" + "".join(f"{b.label:>{w}}" for b, w in zip(budgets, col_ws))
    lines = ["ESTIMATE: weights + gradients + AdamW states. Activations are not included (measure them).", header]
    for r in rows:
        cells = "".join(f"{('fits' if r.fits(b.gb) else 'no'):>{w}}" for b, w in zip(budgets, col_ws))
        lines.append(f"{r.model:<{name_w}}{r.label:<28}{r.gb:>9.2f}{cells}")
    qlora = [FOOTNOTE_QLORA] if any(r.method == "qlora" for r in rows) else []
    return "\n".join([*lines, _FOOTNOTE_FITS, *qlora, *notes])


def model_from_config(
    config: Config, lora_rank: int = REFERENCE_RANK, targets: Targets = DEFAULT_TARGETS, name: str | None = None
) -> ModelSize:
    """A :class:`ModelSize` with exact counts from an architecture config (see :mod:`course_utils.architecture`),
    named ``name`` or :func:`course_utils.configs.config_name`'s name of the config."""
    cfg = read_config(config)
    return ModelSize(name or config_name(config), count_parameters(cfg), lora_adapter_params(cfg, lora_rank, targets))


def size_name(params: int) -> str:
    """'a 7B model', 'a 1.7B model', 'a 135M model' for a parameter count."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"a {params / scale:.3g}{unit} model"
    return f"a {params}-parameter model"


# --------------------------------------------------------------------------------------------
# Measured peak vs estimate: where the memory went
# --------------------------------------------------------------------------------------------
#: The counted parts of a measured step, in the order :func:`account_for_peak` lists them.
_PEAK_PARTS = (
    ("baseline_bytes", "framework baseline (Python and libraries)"),
    ("weights_bytes", "weights (frozen base + adapter)"),
    ("grads_bytes", "gradients"),
    ("optimizer_bytes", "AdamW states"),
    ("saved_activations_bytes", "activations saved for backward"),
)


def account_for_peak(measured: Any, digits: int = 3) -> list[tuple[str, float]]:
    """Split a measured training-step peak into named parts, in GB rounded to ``digits`` decimals.

    ``measured`` is a ``course_utils.measure.StepMeasurement`` (or anything with ``peak_bytes``,
    ``baseline_bytes``, ``weights_bytes``, ``grads_bytes``, ``optimizer_bytes`` and ``saved_activations_bytes``).
    The last part, 'other (temporaries, allocator)', is what the counted parts do not explain: the rounded peak
    minus their sum, so the printed parts add up to the printed peak exactly. It can be negative when the counted
    parts were not all alive at the peak.
    """
    digits = checks.integer(digits, "digits", 0, 9)

    def read_gb(attr: str) -> float:
        """``measured.<attr>``, a byte count, in GB rounded to ``digits``."""
        return round(checks.number(getattr(measured, attr, None), f"measured.{attr}", 0) / GB, digits)

    peak = read_gb("peak_bytes")
    parts = [(label, read_gb(attr)) for attr, label in _PEAK_PARTS]
    parts.append(("other (temporaries, allocator)", round(peak - sum(v for _, v in parts), digits)))
    return parts
