"""`scripts/test`, the command CI runs, stops with an error when any one of its checks fails, and
runs the next check only after the one before it passed. Run here with stand-ins for the tools
(on PATH) and for the environment set-up, so the script's own control flow is what is tested."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The commands scripts/test runs, in order, as the stand-ins record them.
CHECKS = [
    "ruff check",
    "ruff format",
    "mypy",
    "lint-imports",
    "pytest",
    "pytest --accelerators=off",
    "pytest --accelerators=fast_path-alone",
    "pytest --accelerators=forecast-alone",
]
#: What the stand-in for the project's python prints: the accelerators that have an effect in
#: this build (in the pure build, all but the C ones).
SWITCHES = "fast_path forecast"


def _run(tmp_path: Path, failing: str | None) -> tuple[int, list[str]]:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(ROOT / "scripts" / "test", scripts / "test")
    (scripts / "_venv.sh").write_text("# the environment is set up by the test\n")
    (scripts / "_browser.sh").write_text("# the browser is set up by the test\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ran.txt"
    for tool in ("ruff", "mypy", "lint-imports", "pytest"):
        stand_in = bin_dir / tool
        # Records "tool first-argument" and fails when that is the check asked to fail.
        stand_in.write_text(
            "#!/bin/sh\n"
            f'name="{tool}"\n'
            'if [ "$name" = ruff ]; then name="ruff $1"; fi\n'
            'case "$2" in --accelerators=*) name="$name $2";; esac\n'
            f'echo "$name" >> "{log}"\n'
            '[ "$name" != "$FAILING" ]\n'
        )
        stand_in.chmod(0o755)
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\necho {SWITCHES}\n")
    python.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["FAILING"] = failing or ""
    proc = subprocess.run(
        ["bash", str(scripts / "test")], env=env, capture_output=True, timeout=30, check=False
    )
    ran = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, ran


def test_every_check_runs_when_all_pass(tmp_path: Path) -> None:
    code, ran = _run(tmp_path, None)
    assert code == 0
    assert ran == CHECKS


@pytest.mark.parametrize("failing", CHECKS)
def test_a_failing_check_fails_the_run_and_stops_it(tmp_path: Path, failing: str) -> None:
    code, ran = _run(tmp_path, failing)
    assert code != 0
    assert ran == CHECKS[: CHECKS.index(failing) + 1]
