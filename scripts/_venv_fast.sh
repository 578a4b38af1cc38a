# Sourced by scripts/bench-extender after _venv.sh: creates or refreshes .venv-fast, mpsched as
# the image ships it (the decision core compiled with mypyc and its C extension, MPSCHED_COMPILE=1, and the `fast`
# extra: uvloop), installed from this checkout, not editable. Rebuilt only when a source file,
# pyproject.toml, setup.py or the build backend changed (a hash of them is the stamp); a build
# takes about a minute and needs a C compiler and PyPI (mypy, for the build environment).
fast="$root/.venv-fast"
sources_hash="$(cd "$root" && { cat pyproject.toml setup.py; find extender tools \( -name '*.py' -o -name '*.c' -o -name '*.h' \) -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -d' ' -f1)"
if [ ! -x "$fast/bin/python" ] || [ "$(cat "$fast/.built-from" 2>/dev/null)" != "$sources_hash" ]; then
  if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
    echo "bench-extender: the compiled build needs a C compiler (cc); install one, or run the pure build with --serve-python .venv/bin/python" >&2
    exit 1
  fi
  echo "building the compiled mpsched into .venv-fast (about a minute) ..." >&2
  [ -x "$fast/bin/python" ] || "$py" -m venv "$fast"
  log="$fast/install.log"
  if ! MPSCHED_COMPILE=1 "$fast/bin/python" -m pip install --quiet --disable-pip-version-check \
        --force-reinstall ".[fast]" >"$log" 2>&1; then
    grep -v 'is ignored: it is neither' "$log" >&2 || true
    echo "bench-extender: building the compiled mpsched failed (full log: $log)" >&2
    exit 1
  fi
  echo "$sources_hash" > "$fast/.built-from"
fi
