# Sourced by test.sh and test_floor.sh: `bounded CMD...` runs CMD for at most $LIMIT seconds with $VENV's
# Python at hand. GNU timeout where there is one (Linux); else (stock macOS has no `timeout`) a few lines of
# Python. Both stop the whole process group, notebook kernels included; exit status 124 on time-out.
bounded() {
  if command -v timeout >/dev/null 2>&1; then
    timeout --kill-after=30 "$LIMIT" "$@"
  else
    echo "(no timeout command: bounded to ${LIMIT} s by a Python fallback)" >&2
    "$VENV/bin/python" -c '
import os, signal, subprocess, sys
child = subprocess.Popen(sys.argv[2:], start_new_session=True)
try:
    sys.exit(child.wait(timeout=float(sys.argv[1])))
except (subprocess.TimeoutExpired, KeyboardInterrupt):
    os.killpg(child.pid, signal.SIGKILL)
    print(f"stopped after {sys.argv[1]} s", file=sys.stderr)
    sys.exit(124)' "$LIMIT" "$@"
  fi
}
