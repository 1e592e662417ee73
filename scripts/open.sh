#!/usr/bin/env bash
# Set up the course environment (first time only) and open the notebooks in JupyterLab.
# Extra arguments go to JupyterLab, e.g. `bash scripts/open.sh --no-browser --port 8889`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${COURSE_VENV:-.venv}"
export PATH="$PWD/$VENV/bin:$PATH"
extra=()
if [ "$(id -u)" = 0 ]; then extra+=(--allow-root); fi   # containers and cloud VMs often run as root
exec "$VENV/bin/jupyter" lab notebooks/ "${extra[@]}" "$@"
