# Sourced by the entry-point scripts: creates .venv when missing and installs the project with
# its simulate extra (numpy, matplotlib: a checkout runs every command, the serving image need
# not) and its dev extra when MPSCHED_DEV=1. Re-installs only when pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "mpsched needs Python >= 3.11 (found: $("$py" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv ..." >&2
  "$py" -m venv .venv
fi
extras="simulate"
[ "${MPSCHED_DEV:-0}" = "1" ] && extras="simulate,dev"
extra="[$extras]"
# One stamp per set of extras: a .venv that scripts/demo made still gets the dev extra when
# scripts/test first runs in it.
stamp=".venv/.installed-${extras/,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing mpsched${extra} into .venv ..." >&2
  log=".venv/install.log"
  if ! { .venv/bin/python -m pip install --quiet --upgrade pip &&
         .venv/bin/python -m pip install --quiet -e ".${extra}"; } >"$log" 2>&1; then
    grep -v 'is ignored: it is neither' "$log" >&2 || true
    echo "mpsched: installing into .venv failed (full log: $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
