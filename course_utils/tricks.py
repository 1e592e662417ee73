"""Three more memory tricks, measured: gradient checkpointing, 8-bit AdamW, torch.compile (and 16-bit autocast,
accumulation). Notebook 05 reads them all from here; each lives in the module of its concern:

* :mod:`course_utils.trick_claims` - :data:`TRICKS`, each trick as one change to a training step next to the
  lesson's claim, and the closing table (:func:`comparison_table`).
* :mod:`course_utils.trick_runs` - :func:`measure_tricks`: one measured step per trick, next to its estimate for the
  same device (:func:`estimate_step_for`, from :mod:`course_utils.step_memory`).
* :mod:`course_utils.trick_verdicts` - :func:`verdict`, :func:`results_text`, :func:`results_table`: what this
  machine measured, and a cause where a measurement shows one.
* :mod:`course_utils.training_arguments` - the lesson's ``TrainingArguments`` for this machine and this
  transformers (:func:`memory_efficient_training_arguments`), and whether the CPU does bfloat16 in hardware.
* :mod:`course_utils.trainer_demo` - the ``Trainer`` demo on random tokens.
* :func:`saved_for_backward` - what a forward pass keeps for backward, eager or compiled
  (:mod:`course_utils.training_step`, which counts a measured step's activations the same way).
"""

# ruff: noqa: F401 - every import below is a re-export: notebook 05, its lesson and the scripts read these names here
from course_utils.step_memory import estimate_step_for
from course_utils.trainer_demo import demo_trainer, run_trainer_steps, trainer_losses
from course_utils.training_arguments import BF16_CPU_FLAGS, checkpointing_enabled, cpu_flags, training_arguments_plan
from course_utils.training_arguments import memory_efficient_training_arguments
from course_utils.training_step import saved_for_backward
from course_utils.trick_claims import TRICKS, comparison_table
from course_utils.trick_runs import COMPILE_TIMEOUT_S, TrickResult, measure_tricks, trick_kwargs
from course_utils.trick_verdicts import results_table, results_text, verdict
