# Sourced by scripts/test: makes sure Debian's chromium is there for the browser tests
# (tests/ui/). Installs it when it is missing and this is root with apt-get (CI: a fresh
# Debian machine); `apt-get update` only when the install fails without it. Where it cannot be
# installed the browser tests skip, saying why. Never fails the run itself.
mpsched_browser() {
  local log=".venv/chromium-install.log"
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: chromium is not installed and this is not root with apt-get: the browser tests will be skipped" >&2
    return 0
  fi
  echo "installing chromium for the browser tests (log: $log) ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get install -y chromium >"$log" 2>&1; then
    return 0
  fi
  if apt-get update >>"$log" 2>&1 && apt-get install -y chromium >>"$log" 2>&1; then
    return 0
  fi
  echo "note: could not install chromium (see $log): the browser tests will be skipped" >&2
  return 0
}
mpsched_browser
