"""LoRA adapters: set up with peft, and counted by peft on the meta device.

LoRA leaves a weight matrix W (d_out x d_in) frozen and trains a low-rank change beside it, B·A with A of
size r x d_in and B of size d_out x r: r x (d_in + d_out) numbers per targeted matrix. With QLoRA, W is the
4-bit weight. The lesson's adapter: rank 16, alpha 16, on the seven projections of every decoder layer
(:data:`course_utils.architecture.PROJECTIONS`). The same count by arithmetic, without torch:
:meth:`course_utils.architecture.Architecture.adapter_params`.
"""

from typing import Any, NamedTuple, Sequence

import torch

from course_utils import checks
from course_utils.architecture import PROJECTIONS, normalize_targets
from course_utils.configs import config_name
from course_utils.footprint import count_model_parameters, true_numel
from course_utils.models import keep_4bit_trainable_on_cpu, meta_model
from course_utils.quiet import quiet_libraries


def _lora_config(r: Any, alpha: Any, targets: Any) -> Any:
    """The peft ``LoraConfig`` of the lesson's QLoRA cell: rank r, lora_alpha, no dropout, the given modules.

    The one place that checks the adapter's arguments, for :func:`add_lora` and :func:`lora_count`.
    """
    checks.integer(r, "r", 1, 1024)
    checks.positive(alpha, "alpha")
    targets = normalize_targets(targets)  # the seven projections' names, as everywhere in the course
    with quiet_libraries():  # peft imports bitsandbytes, whose import may log a notice
        from peft import LoraConfig

        return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), task_type="CAUSAL_LM")


def add_lora(
    model: torch.nn.Module,
    r: int = 16,
    alpha: float = 16,
    targets: Sequence[str] = PROJECTIONS,
    *,
    checkpointing: bool | None = None,
    kbit_preparation: bool = True,
) -> Any:
    """Freeze ``model`` and wrap it with LoRA adapters (peft). Returns the peft model.

    The adapters' A matrices start random (B starts at zero), from seed 0: the same start on every run,
    without touching the global random state.

    A 4- or 8-bit model first goes through peft's ``prepare_model_for_kbit_training``, the standard QLoRA step:
    the non-quantized parts (embedding, norms, an untied output layer) go to float32 for stable training, and with
    them the hidden states and the logits. ``kbit_preparation=False`` skips it (as Unsloth and some trainers do):
    the 16-bit parts stay 16-bit, and only the adapters train.
    ``checkpointing``: gradient checkpointing (non-reentrant), which trades compute for activation memory; None
    (the lesson's choice) turns it on for a quantized model on a GPU, off otherwise.
    A quantized model also gets :func:`course_utils.models.keep_4bit_trainable_on_cpu`, so evaluating or
    generating between training steps on an AVX-512-bf16 CPU cannot break the next step.
    """
    cfg = _lora_config(r, alpha, targets)
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    where = next(model.parameters()).device
    on_gpu = where.type == "cuda"
    checkpointing = quantized and on_gpu if checkpointing is None else checkpointing
    with quiet_libraries():
        from peft import get_peft_model, prepare_model_for_kbit_training

        if quantized:
            keep_4bit_trainable_on_cpu(model)  # the CPU repack pitfall: see keep_4bit_trainable_on_cpu
        # Non-reentrant checkpointing, which torch recommends and which works with frozen inputs; without it, torch
        # warns on every run that the default will change.
        if quantized and kbit_preparation:
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        elif checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if checkpointing:
            model.config.use_cache = False  # the generation cache is useless (and warned about) with checkpointing
        # The seed also fixes the GPU's random state where the model is (fork_rng restores both afterwards).
        devices = [where.index if where.index is not None else torch.cuda.current_device()] if on_gpu else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            return get_peft_model(model, cfg)


class LoraCount(NamedTuple):
    """Trainable adapter parameters against the base model (peft's "all params" includes the adapter)."""

    name: str
    trainable: int
    base: int

    def summary(self) -> str:
        """peft's line (trainable% = trainable / all params, base + adapter), plus the share of the base alone."""
        total = self.base + self.trainable
        share, of_base = 100 * self.trainable / total, 100 * self.trainable / self.base
        return (
            f"{self.name}: trainable params: {self.trainable:,} || all params: {total:,} || trainable%: {share:.2f}  "
            f"(of the base alone, {self.base:,}: {of_base:.2f} %)"
        )


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameters of a model, as peft counts them (4-bit weights at their true count)."""
    trainable = sum(true_numel(p) for p in model.parameters() if p.requires_grad)
    return trainable, count_model_parameters(model)


def lora_count(
    config: Any, r: int = 16, alpha: float = 16, targets: Sequence[str] = PROJECTIONS, name: str | None = None
) -> LoraCount:
    """Count the lesson's LoRA adapter on the architecture ``config``, on the meta device (no memory, no download).

    ``config``: a preset in ``data/configs``, a path or a dict; ``name``: by default
    :func:`course_utils.configs.config_name`'s.
    """
    model = meta_model(config)
    base = count_model_parameters(model)
    with torch.device("meta"):
        peft_model = add_lora(model, r, alpha, targets)  # a meta model is not quantized: no kbit preparation
    trainable, total = trainable_counts(peft_model)
    if total != base + trainable:  # peft's "all params" includes the adapter: anything else is a counting bug
        raise RuntimeError(f"peft counted {total:,} parameters; expected the base {base:,} + the adapter {trainable:,}")
    return LoraCount(config_name(config) if name is None else name, trainable, base)
