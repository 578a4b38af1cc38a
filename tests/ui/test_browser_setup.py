"""`scripts/_browser.sh`, which `scripts/test` sources: it installs Debian's chromium with
apt-get only where it is missing and this is root, runs `apt-get update` only when the install
fails without it, and never fails the run (the browser tests then skip, saying why). Run with
stand-ins for `id`, `apt-get` and `chromium` on PATH, so the script's own logic is tested."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(
    tmp_path: Path, *, uid: int, chromium: bool, install_ok: bool, update_ok: bool
) -> tuple[int, list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / ".venv").mkdir()
    calls = tmp_path / "apt-calls.txt"
    updated = tmp_path / "updated"
    tools = {
        "id": f"#!/bin/sh\necho {uid}\n",
        # Records its arguments; install works once the package lists are fresh (or always).
        "apt-get": (
            "#!/bin/sh\n"
            f'echo "$*" >> "{calls}"\n'
            'if [ "$1" = update ]; then\n'
            f'  {"" if update_ok else "exit 100; "}: > "{updated}"; exit 0\n'
            "fi\n"
            f'[ "{int(install_ok)}" = 1 ] || [ -f "{updated}" ]\n'
        ),
    }
    if chromium:
        tools["chromium"] = "#!/bin/sh\nexit 0\n"
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    proc = subprocess.run(
        [bash, "-c", f"set -euo pipefail; source {ROOT / 'scripts' / '_browser.sh'}; echo end"],
        cwd=tmp_path,
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.stdout == "end\n"
    ran = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, ran, proc.stderr


def test_nothing_is_installed_where_chromium_is(tmp_path: Path) -> None:
    assert _run(tmp_path, uid=0, chromium=True, install_ok=True, update_ok=True) == (0, [], "")


def test_root_installs_it_without_updating_first(tmp_path: Path) -> None:
    code, ran, _ = _run(tmp_path, uid=0, chromium=False, install_ok=True, update_ok=True)
    assert (code, ran) == (0, ["install -y chromium"])


def test_the_package_lists_are_updated_only_when_the_install_fails(tmp_path: Path) -> None:
    code, ran, _ = _run(tmp_path, uid=0, chromium=False, install_ok=False, update_ok=True)
    assert (code, ran) == (0, ["install -y chromium", "update", "install -y chromium"])


@pytest.mark.parametrize(("uid", "calls"), [(1000, []), (0, ["install -y chromium", "update"])])
def test_where_it_cannot_be_installed_the_run_goes_on(
    tmp_path: Path, uid: int, calls: list[str]
) -> None:
    code, ran, err = _run(tmp_path, uid=uid, chromium=False, install_ok=False, update_ok=False)
    assert (code, ran) == (0, calls)
    assert err.splitlines()[-1].endswith("the browser tests will be skipped")
