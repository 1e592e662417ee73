"""Notebook 05's Trainer demo: a Hugging Face ``Trainer`` on a randomly initialised model and random tokens.

:func:`demo_trainer` builds it (the model is :func:`course_utils.step_model.build_model`'s, full fine-tuning);
:func:`run_trainer_steps` trains it and reads the run's peak memory with :func:`course_utils.peak.measure_peak`.
"""

from typing import Any

import torch

from course_utils.configs import read_config
from course_utils.peak import measure_peak
from course_utils.quiet import quiet_libraries
from course_utils.step_model import build_model


def run_trainer_steps(config: Any, args: Any, *, batch_examples: int = 32, seq: int = 64) -> dict[str, Any]:
    """Train a randomly initialised model of ``config`` with ``args`` on random tokens, in this process: the losses,
    the steps done, the wall time and the peak memory of the run."""
    trainer = demo_trainer(config, args, batch_examples=batch_examples, seq=seq)
    with quiet_libraries():  # silences bitsandbytes and transformers while they work; restored afterwards
        result, peak = measure_peak(trainer.train, args.device)
    return {"losses": trainer_losses(trainer), "steps": result.global_step, "seconds": peak.seconds, "peak": peak}


def demo_trainer(config: Any, args: Any, *, batch_examples: int = 32, seq: int = 64) -> Any:
    """A Hugging Face ``Trainer`` for a randomly initialised model of ``config`` (seed 0) on ``batch_examples``
    random sequences of ``seq`` tokens (seed 1), ready to ``train()``. Built with the libraries' chatter silenced,
    and without the callback that prints every log line (the losses stay in ``trainer.state.log_history``)."""
    with quiet_libraries():
        from transformers import Trainer
        from transformers.trainer_callback import PrinterCallback

        cfg = read_config(config)
        model = build_model({"config": cfg, "method": "full", "checkpointing": False, "seed": 0})
        ids = torch.randint(0, cfg["vocab_size"], (batch_examples, seq), generator=torch.Generator().manual_seed(1))
        trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": row, "labels": row} for row in ids])
        trainer.remove_callback(PrinterCallback)
    return trainer


def trainer_losses(trainer: Any) -> list[float]:
    """The training losses a ``Trainer`` logged, one per logging step, rounded to 4 digits."""
    return [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]
