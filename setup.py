"""Build hook for setuptools (the project's metadata is in pyproject.toml).

With MPSCHED_COMPILE=1 the decision core's hot modules (`extender/build.py` lists them and
says why) are compiled with mypyc into C extension modules; the pure-Python sources stay in
the distribution beside them, and the C extension modules of `NATIVE_EXTENSIONS` are built
with `NATIVE_COMPILE_ARGS` (same file). Without it, this is a plain pure-Python build. The
in-tree backend (tools/mpsched_build.py) adds mypy to the build requirements only when compiling.
"""

from __future__ import annotations

import glob
import os
import runpy
import tempfile
from typing import Any

from setuptools import Extension, setup

ext_modules: list[Any] = []
options: dict[str, dict[str, str]] = {}
if os.environ.get("MPSCHED_COMPILE") == "1":
    from mypyc.build import mypycify

    build = runpy.run_path(os.path.join("extender", "build.py"))
    modules = build["COMPILED_MODULES"]
    paths = [name.replace(".", os.sep) + ".py" for name in modules]
    # Generated C and build products go to a fresh directory, never ./build: setuptools would
    # package whatever an earlier build left there (a module since dropped from the list).
    scratch = tempfile.mkdtemp(prefix="mpsched-build-")
    ext_modules = mypycify(paths, opt_level="3", target_dir=os.path.join(scratch, "c"))
    ext_modules += [
        Extension(
            name,
            [source],
            # The headers a source includes from its own folder (one translation unit).
            depends=sorted(glob.glob(os.path.join(os.path.dirname(source), "_*.h"))),
            extra_compile_args=list(build["NATIVE_COMPILE_ARGS"]),
        )
        for name, source in build["NATIVE_EXTENSIONS"]
    ]
    options = {"build": {"build_base": scratch}}

setup(ext_modules=ext_modules, options=options)
