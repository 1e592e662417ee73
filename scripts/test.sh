#!/usr/bin/env bash
# The whole test suite: unit tests, then every notebook executed and compared by nbval.
# Sets up .venv first if needed. Offline, CPU only, bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${COURSE_VENV:-.venv}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export CUDA_VISIBLE_DEVICES=""   # committed outputs are CPU outputs; compare like with like
export PYTHONHASHSEED=0
export PATH="$PWD/$VENV/bin:$PATH"
exec timeout --kill-after=30 "${COURSE_TEST_TIMEOUT:-1800}" "$VENV/bin/python" -m pytest "$@"
