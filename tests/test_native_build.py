"""The C extension modules of the compiled build (`NATIVE_EXTENSIONS`: `packing/_native.c`,
`http/_wire.c`) compile cleanly with the build's flags, and decide and write as the Python code
does: this test compiles them with the machine's C compiler and runs, in a fresh interpreter
that imports them, the tests that hold them to the Python code and to the published score
reference. (The compiled build's own test runs them too, on the whole compiled distribution;
this one is quick, so every run checks it.)"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from extender.build import NATIVE_COMPILE_ARGS, NATIVE_EXTENSIONS

ROOT = Path(__file__).resolve().parents[1]
#: Run against the compiled extension: its own tests, and those whose policies and evaluator
#: take it wherever it is installed.
NATIVE_TESTS = (
    "tests/packing/test_native.py",
    "tests/packing/test_ledger_inventory.py",
    "tests/packing/test_unknown_uid.py",
    "tests/packing/test_policies.py",
    "tests/packing/test_evaluate_scores.py",
    "tests/packing/test_evaluate_bounds.py",
    "tests/test_serve_simulate_agree.py",
    "tests/service/test_service.py",
    "tests/http/test_wire_native.py",
    "tests/test_accelerators.py",
)
#: Makes the freshly compiled modules (`name=path` arguments, up to `--`) the ones their names
#: import, then runs pytest with the arguments after `--`.
RUNNER = """
import importlib.util, sys
cut = sys.argv.index("--")
for arg in sys.argv[1:cut]:
    name, path = arg.split("=", 1)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
from extender.packing import native
from extender.http import wire
compiled = sys.modules["extender.packing._native"]
assert native.PLAN is compiled.Plan and native.SCALE is compiled.scale
assert wire._HOST_PRIORITIES_IN_C is sys.modules["extender.http._wire"].host_priorities
import pytest
sys.exit(pytest.main(sys.argv[cut + 1:]))
"""


def compile_native(module: str, source: Path, out_dir: Path) -> Path:
    """`source` compiled as the build compiles it (NATIVE_COMPILE_ARGS), warnings as errors,
    into an extension module file for `module`."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if shutil.which(cc[0]) is None:
        pytest.skip(f"no C compiler ({cc[0]}) on this machine")
    target = out_dir / (module.rpartition(".")[2] + str(sysconfig.get_config_var("EXT_SUFFIX")))
    command = [
        *cc,
        "-shared",
        "-fPIC",
        *NATIVE_COMPILE_ARGS,
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-Wno-missing-field-initializers",
        "-Werror",
        "-I",
        sysconfig.get_paths()["include"],
        str(source),
        "-o",
        str(target),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return target


@pytest.mark.slow
def test_the_c_extension_decides_as_the_python_code(tmp_path: Path) -> None:
    modules = dict(NATIVE_EXTENSIONS)
    assert set(modules) == {"extender.packing._native", "extender.http._wire"}
    built = [f"{m}={compile_native(m, ROOT / source, tmp_path)}" for m, source in modules.items()]
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            RUNNER,
            *built,
            "--",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            *NATIVE_TESTS,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    # Nothing skipped for want of the extension: it was the one imported.
    assert "C extension is not installed" not in run.stdout, run.stdout[-2000:]
