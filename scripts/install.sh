#!/usr/bin/env bash
# Create the course environment in .venv (or $COURSE_VENV) from the repo's own files.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${COURSE_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
echo "course environment ready: $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
