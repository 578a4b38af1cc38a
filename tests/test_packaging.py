"""What `pip install .` (the serving image) brings: not numpy, matplotlib or Pillow, which only
`mpsched simulate` needs (the `simulate` extra). Checked three ways: the declared dependencies,
their installed closure in this environment, and a clean virtual environment with `pip install`
from a copy of the project (slow: it downloads the dependencies). Also `simulate` without the
extra (one line naming it, exit 1, before any work), the Dockerfile's shape, and the LICENSE."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from extender.cli import main
from extender.commands.simulate import EXTRA_HINT

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Distributions (PyPI names, normalised) the serving image must not carry, and their modules.
SIMULATE_ONLY = {"numpy": "numpy", "matplotlib": "matplotlib", "pillow": "PIL"}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def test_the_runtime_dependencies_leave_the_simulator_out() -> None:
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not runtime & set(SIMULATE_ONLY)
    extra = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["simulate"]}
    assert {"numpy", "matplotlib"} <= extra


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution `requirements` pull in here (no extras; markers for this Python)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _name(str(req))
        if name in seen:
            continue
        seen.add(name)
        todo.extend(importlib.metadata.requires(name) or [])
    return seen


def test_the_installed_closure_of_the_runtime_dependencies_has_no_simulator() -> None:
    closure = _closure(PYPROJECT["project"]["dependencies"])
    assert {"aiohttp", "kubernetes-asyncio", "grpcio"} <= closure
    assert not closure & set(SIMULATE_ONLY), sorted(closure & set(SIMULATE_ONLY))


@pytest.mark.parametrize(("blocked", "says"), [("numpy", "simulate needs numpy"),
                                               ("matplotlib", "--plot needs matplotlib"),
                                               ("PIL", "--plot needs PIL")])  # fmt: skip
def test_simulate_without_the_extra_names_it_before_any_work(
    blocked: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # A None entry in sys.modules is how the import system records "not importable".
    monkeypatch.setitem(sys.modules, blocked, None)
    png = tmp_path / "r.png"
    # The input files do not exist: the check comes before anything is read.
    argv = ["simulate", "--nodes", "n.csv", "--pods", "p.csv", "--plot", str(png)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert says in captured.err and captured.err.endswith(f"{EXTRA_HINT}\n")
    assert "pip install 'mpsched[simulate]'" in captured.err
    assert not png.exists()


def test_simulate_without_plot_needs_no_matplotlib(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    # Past the check: the missing trace file is the failure now.
    assert main(["simulate", "--nodes", "n.csv", "--pods", "p.csv"]) == 1
    assert EXTRA_HINT not in capsys.readouterr().err


def copy_project(dest: Path) -> None:
    """What the image's build stage copies, and only that (so a file the build needs but the
    Dockerfile leaves out fails the tests that build from it)."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.py"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    for name in ("extender", "tools"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_install_in_a_clean_venv_has_no_simulator(tmp_path: Path) -> None:
    """`pip install .` as the Dockerfile runs it, from a copy holding only what the image
    copies (so a file the build needs but the Dockerfile leaves out fails here too)."""
    src = tmp_path / "src"
    copy_project(src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    python, mpsched = str(venv / "bin" / "python"), str(venv / "bin" / "mpsched")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
        )

    for module in SIMULATE_ONLY.values():
        probe = run(python, "-c", f"import {module}")
        assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, module
    version = run(mpsched, "--version")
    assert (version.returncode, version.stdout) == (
        0,
        f"mpsched {PYPROJECT['project']['version']}\n",
    )
    # Every command the image runs loads without the extra.
    serving = run(python, "-c", "import extender.commands.serve, extender.commands.webhook, "
                  "extender.commands.agent, extender.kube.api, extender.kube.proxy")  # fmt: skip
    assert serving.returncode == 0, serving.stderr
    for command in ("serve", "webhook", "agent", "status", "simulate"):
        helped = run(mpsched, command, "--help")
        assert helped.returncode == 0, helped.stderr
    simulate = run(mpsched, "simulate", "--nodes", "n.csv", "--pods", "p.csv")
    assert simulate.returncode == 1
    assert simulate.stderr == (
        f"mpsched: simulate: simulate needs numpy (not installed): {EXTRA_HINT}\n"
    )
    plot = run(mpsched, "simulate", "--nodes", "n.csv", "--pods", "p.csv", "--plot", "x.png")
    assert plot.returncode == 1 and plot.stderr.endswith(f"{EXTRA_HINT}\n")
    assert plot.stderr.count("\n") == 1
    # The license travels with the distribution.
    files = run(python, "-c", "import importlib.metadata as m; "
                "print([str(f) for f in m.files('mpsched') if 'LICENSE' in str(f)])")  # fmt: skip
    assert "LICENSE" in files.stdout, files.stdout + files.stderr


def _stages(dockerfile: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), one list per build stage."""
    text = re.sub(r"\\\n", " ", dockerfile)
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_the_dockerfile_builds_a_slim_non_root_image() -> None:
    stages = _stages((ROOT / "Dockerfile").read_text())
    assert len(stages) >= 2, "multi-stage: the build's tools stay in the first stage"
    build, final = stages[0], stages[-1]
    installs = [i for i in build if "pip install" in i]
    assert installs, build
    # The project without the simulate extra (only `fast`, uvloop, is wanted).
    assert all("simulate" not in i and "dev" not in i for i in installs)
    # The project is built as a wheel from "." (its dependencies come from the locks:
    # tests/deploy/test_release.py).
    assert any(re.search(r'pip (install|wheel)\b.*"\.(\[fast\])?"', i) for i in build), build
    # The final stage installs nothing: it copies the built environment and drops pip.
    assert not [i for i in final if re.search(r"pip install|apt-get install|apk add", i)]
    assert any(i.startswith("COPY --from=") for i in final)
    assert any("pip uninstall" in i for i in final)
    users = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    assert users, "the image must not run as root"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so that runAsNonRoot can be checked by the kubelet without /etc/passwd.
    assert uid.isdigit() and int(uid) != 0 and (not gid or gid.isdigit())
    assert final[-1].startswith("ENTRYPOINT")
    copied = " ".join(i for i in build if i.upper().startswith("COPY "))
    for needed in ("pyproject.toml", "README.md", "LICENSE", "setup.py", "tools", "extender"):
        assert needed in copied, needed
    # The image runs the compiled build, and says so if the compilation went missing.
    assert any("MPSCHED_COMPILE=1" in i for i in build), build
    assert any("b.build() == 'mypyc'" in i for i in build), build


def test_the_license_is_apache_2() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 The mpsched Authors" in text
    assert len(text.splitlines()) > 190


def test_simulates_tune_help_names_the_replays_default(capsys: pytest.CaptureFixture[str]) -> None:
    # The help cannot import the replay (numpy) to read its default: it must not drift from it.
    from extender.simulate.replay import DEFAULT_TUNE

    assert main(["simulate", "--help"]) == 0
    assert f"default: the paper's {DEFAULT_TUNE:g})" in " ".join(capsys.readouterr().out.split())
