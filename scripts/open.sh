#!/usr/bin/env bash
# Set up the course environment (first time only) and open the notebooks in JupyterLab.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${COURSE_VENV:-.venv}"
export PATH="$PWD/$VENV/bin:$PATH"
exec "$VENV/bin/jupyter" lab notebooks/ "$@"
