#!/usr/bin/env bash
# The whole test suite: ruff, unit tests and every notebook under nbval, on this CPU; then the notebooks whose
# figures come from 16-bit kernels once more with other CPU kernels, against the same committed outputs
# (they must hold on any CPU). Sets up .venv first if needed. Offline, CPU only, bounded in time.
# Extra arguments go to pytest and skip the second run: `bash scripts/test.sh tests/test_quant.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${COURSE_VENV:-.venv}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export CUDA_VISIBLE_DEVICES=""   # committed outputs are CPU outputs; compare like with like
export PYTHONHASHSEED=0
export PATH="$PWD/$VENV/bin:$PATH"
LIMIT="${COURSE_TEST_TIMEOUT:-2700}"

source scripts/bounded.sh   # bounded CMD...: GNU timeout, or a fallback where there is none (macOS)

if [ $# -eq 0 ]; then
  echo "== ruff check and ruff format --check (configured in pyproject.toml)"
  "$VENV/bin/ruff" check --quiet && echo "ruff: clean"
  "$VENV/bin/ruff" format --check --quiet && echo "ruff format: every file formatted"
fi
if [ $# -gt 0 ]; then
  bounded "$VENV/bin/python" -m pytest "$@"
else
  # The unit tests in parallel (one worker per core, one thread each: most of their time is child processes
  # starting torch), then the notebooks one at a time, with the threads they set themselves.
  echo "== unit tests (tests/), in parallel"
  OMP_NUM_THREADS=1 bounded "$VENV/bin/python" -m pytest -n auto tests
  echo "== every notebook under nbval"
  bounded "$VENV/bin/python" -m pytest notebooks
fi
if [ $# -eq 0 ]; then
  # Another CPU sums 16-bit products in another order. ATEN_CPU_CAPABILITY=default makes PyTorch use its plain
  # (non-vectorised) kernels, which sum differently from this CPU's AVX-512/AMX ones: the two notebooks that
  # train and count in 16 bits, and 01b, which generates and fine-tunes a real model, must print the same
  # compared outputs. (ONEDNN_MAX_CPU_ISA=AVX2 would emulate a
  # plain AVX2 laptop more fully, but makes bf16 matmuls up to 50x slower: CONTRIBUTING.md says when to use it.)
  PORTABLE=(notebooks/01_quantization.ipynb notebooks/01b_real_models_qlora.ipynb notebooks/02_mixed_precision.ipynb)
  echo "== again with PyTorch's plain CPU kernels (ATEN_CPU_CAPABILITY=default): ${PORTABLE[*]}"
  ATEN_CPU_CAPABILITY=default bounded "$VENV/bin/python" -m pytest "${PORTABLE[@]}"
fi
