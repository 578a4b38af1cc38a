"""The compiled build (MPSCHED_COMPILE=1: the decision core's hot modules through mypyc, as the
image ships) decides exactly as the pure-Python sources do.

The list of compiled modules lives in `extender/build.py` and setup.py reads it from there; the
fast tests check that list. The slow test builds the compiled distribution from a copy of the
project (it downloads mypy into the isolated build environment, ~1 min to compile) and runs the
decision core's own tests against it: packing, the service over the embedded cluster, serve and
simulate agreeing, and the simulator's replay figures, with the compiled modules shadowing the
sources (the scheduling answers, the ledger's invariants and the openb figures are the same
assertions both builds must pass)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from extender.build import (
    COMPILED_MODULES,
    NATIVE_EXTENSIONS,
    NATIVE_SWITCHES,
    build,
    compiled_modules,
)
from extender.config import AcceleratorSettings
from tests.test_packaging import copy_project

ROOT = Path(__file__).resolve().parents[1]
#: The tests run against the compiled build: the decision core's, the replay's figures, the
#: C writer of prioritize's answer, and the forecast call computed ahead (`warm_from`).
PARITY_TESTS = (
    "tests/packing",
    "tests/service/test_service.py",
    "tests/service/test_forecast.py",
    "tests/http/test_wire_native.py",
    "tests/test_serve_simulate_agree.py",
    "tests/simulate",
)


def test_the_native_switches_are_accelerators() -> None:
    # scripts/test leaves their alone runs out where the C is not built: the names must be the
    # configuration's.
    fields = {f.name for f in dataclasses.fields(AcceleratorSettings)}
    assert set(NATIVE_SWITCHES) < fields


def test_every_compiled_module_is_a_pure_core_source_file() -> None:
    for name in COMPILED_MODULES:
        assert name.startswith("extender.packing."), name
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name
    assert len(set(COMPILED_MODULES)) == len(COMPILED_MODULES)


def test_modules_read_by_introspection_or_owning_an_estimate_stay_pure() -> None:
    # The configuration reader checks values against the settings dataclasses' field types;
    # the codecs rely on Python's own errors for values of the wrong type; the parse cache's
    # byte estimate is measured on the pure objects (extender/build.py says why).
    for kept_pure in ("settings", "policies.settings", "codec", "codec_labels", "parsing"):
        assert f"extender.packing.{kept_pure}" not in COMPILED_MODULES


def test_this_interpreter_runs_a_whole_build() -> None:
    # A compiled build with some extension modules missing (or shadowed) is a broken install.
    assert build() in ("python", "mypyc")
    whole = len(COMPILED_MODULES) + len(NATIVE_EXTENSIONS)
    assert (build() == "mypyc") == (len(compiled_modules()) == whole)


def test_setup_compiles_the_listed_modules_only() -> None:
    text = (ROOT / "setup.py").read_text()
    assert 'runpy.run_path(os.path.join("extender", "build.py"))' in text
    assert 'build["COMPILED_MODULES"]' in text
    assert 'build["NATIVE_EXTENSIONS"]' in text
    assert 'os.environ.get("MPSCHED_COMPILE") == "1"' in text


def _python(
    args: list[str], *, env: dict[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """This interpreter with `args`, its output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_compiled_build_passes_the_decision_cores_tests(tmp_path: Path) -> None:
    src, site = tmp_path / "src", tmp_path / "site"
    copy_project(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    built = _python(
        ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(site), str(src)],
        env={**env, "MPSCHED_COMPILE": "1"},
        timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    # The checkout's tests, beside (not inside) a copy of the sources: the compiled
    # distribution on PYTHONPATH is what they import. The replay's smoke test finds the
    # shared traces next to the checkout, as in the repository.
    run = tmp_path / "w" / "main"
    run.mkdir(parents=True)
    for name in ("pyproject.toml",):
        shutil.copy(ROOT / name, run / name)
    for name in ("tests", "config"):
        shutil.copytree(ROOT / name, run / name, ignore=shutil.ignore_patterns("__pycache__"))
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (tmp_path / "w" / "shared").symlink_to(shared)
    compiled_env = {**env, "PYTHONPATH": str(site)}
    which = _python(
        ["-c", "import extender.build as b; print(b.build())"],
        env=compiled_env,
        cwd=run,
        timeout=60,
    )
    assert which.stdout.strip() == "mypyc", which.stdout + which.stderr
    tested = _python(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", *PARITY_TESTS],
        env=compiled_env,
        cwd=run,
        timeout=900,
    )
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-2000:]
