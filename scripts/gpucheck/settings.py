"""The check's settings: its budget, the sizes of its cases, its exit statuses and the environment of every part."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NO_CUDA_MESSAGE = "gpu_check: needs an NVIDIA GPU with CUDA ({why}); nothing was run."
DEFAULT_BUDGET_S = 300.0
#: Seconds kept back from the budget for writing the results (sections stop planning work past it).
RESERVE_S = 8.0
MATMUL_SIZES = (4096, 8192)
MATMUL_DTYPES = ("float32", "float16", "bfloat16")
#: ``blocked_autorange(min_run_time=...)`` per matmul case, seconds.
MATMUL_MIN_RUN_S = 0.3
#: Measured training steps per case and per trick (``steps=`` of measure_training_step), after the warm-up step.
MEASURED_STEPS = 3
STEP_SEQ = 128
#: --strict fails when |estimate - measured| / measured is above this, in percent.
ESTIMATE_LIMIT_PCT = 10.0
#: A section or case skipped for one of these missing is "not checked", and does not fail --strict.
OPTIONAL_LIBRARIES = ("transformers", "peft", "accelerate", "bitsandbytes")
#: What TrainingArguments get on a T4 (``precision.training_arguments_kwargs`` there), forced on newer GPUs.
FP16_TRAINING_KWARGS = {"bf16": False, "fp16": True}
QLORA_STEPS = 8
STANDIN_CONFIG = "smollm2-135m"
PROMPT = "The capital of France is"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_CUDA = 2
EXIT_STRICT = 3
#: Kinds of a skipped part of a section: "time" and "other" fail --strict, "library" is "not checked",
#: "n/a" is a path this GPU does not have (bfloat16 on a T4).
SKIP_KINDS = ("time", "library", "n/a", "other")
#: Environment every part of the run (and every child process) gets: offline, quiet, no experiment trackers.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
}
