"""Repo-wide pytest setup: the suite runs offline and on the CPU, even when pytest is called directly.

Notebook kernels started by nbval inherit this environment. scripts/test.sh sets the same variables.
"""

import os

for _name, _value in {
    "HF_HUB_OFFLINE": "1",  # never wait for the Hugging Face Hub
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # progress bars go to stderr, which nbval compares
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
}.items():
    os.environ.setdefault(_name, _value)
# The committed outputs are CPU outputs: hide GPUs unless the caller explicitly chose otherwise.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
