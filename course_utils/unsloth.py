"""Unsloth: run the lesson's Unsloth cell only where it can run, and never install it into a running kernel.

Unsloth needs a CUDA GPU, downloads its model from the Hub, and patches torch, transformers and peft when it
is imported. So it must be installed in a *fresh* runtime, before anything else runs: :func:`unsloth_plan`
decides, and where it cannot run says what to do instead.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from course_utils.hub import ModelChoice
from course_utils.packaged import find_spec


def on_colab() -> bool:
    """True inside Google Colab (its environment variables, or the google.colab module)."""
    return any(k.startswith("COLAB_") for k in os.environ) or find_spec("google.colab") is not None


@dataclass(frozen=True)
class _UnslothPlan:
    """Whether the lesson's Unsloth cell runs here, why (or why not), and how to run it in a fresh runtime.

    Unsloth is never installed into a running kernel: it patches torch, transformers and peft when it is
    imported, and this kernel has already imported them. ``command`` says what to do instead (None when
    the cell runs, or when no install would help here).
    """

    run: bool
    reason: str
    command: str | None = None

    def message(self) -> str:
        """The lines the notebook prints: the decision, the fresh-runtime command if any, what peft showed."""
        same_job = "The peft cells above did the same job: a frozen 4-bit base, a LoRA adapter, real training."
        return "\n".join(line for line in (self.reason, self.command, None if self.run else same_job) if line)


def _install_command(gpu_here: bool = True) -> str:
    """How to get Unsloth: in a *fresh* runtime, install first, restart, then run the notebook.

    The Colab wording inside Colab (:func:`on_colab`). ``gpu_here`` False adds that a CUDA GPU is needed.
    """
    if on_colab():
        runtime = "a fresh Colab runtime" + ("" if gpu_here else " with a GPU (Runtime > Change runtime type > T4 GPU)")
        return (f"To run it: in {runtime}, run `!pip install unsloth` in the first cell, restart the session "
                "(Runtime > Restart session), then run this notebook.")
    where = "" if gpu_here else " with a CUDA GPU and internet"
    return f"To run it{where}: `pip install unsloth` in a fresh environment, then this notebook in a new kernel."


def unsloth_importable() -> bool:
    """True when the ``unsloth`` package is installed (found without importing it)."""
    return find_spec("unsloth") is not None


def unsloth_plan(choice: ModelChoice) -> _UnslothPlan:
    """Run the lesson's Unsloth cell only when Unsloth is installed, a CUDA GPU is here and the Hub is reachable.

    Unsloth downloads ``unsloth/Qwen3-4B-Instruct-2507`` and runs CUDA kernels. It is never pip-installed
    from here (see :class:`_UnslothPlan`); when it is missing, the plan carries the command for a fresh runtime.
    """
    if not isinstance(choice, ModelChoice):
        raise TypeError(f"choice must be the ModelChoice from choose_model, got {type(choice).__name__}")
    import torch

    if not torch.cuda.is_available():
        return _UnslothPlan(False, "Unsloth skipped: it needs a CUDA GPU and there is none here.",
                            _install_command(gpu_here=False))
    if not choice.from_hub:
        return _UnslothPlan(False, f"Unsloth skipped: it downloads its model from the Hub, which is not available "
                                   f"here ({choice.reason}).")
    if not unsloth_importable():
        return _UnslothPlan(False, "Unsloth skipped: it is not installed in this runtime, and installing it into a "
                                   "kernel that has already imported torch, transformers and peft is unsafe.",
                            _install_command())
    return _UnslothPlan(True, "Unsloth is installed, a CUDA GPU is here and the Hub is reachable: running the "
                              "Unsloth cell.")
