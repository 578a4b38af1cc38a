"""What the report says the bench ran on: the machine (CPU, cores, Python, platform) and the
runtime of serve and the floor (the interpreter, its Python, mpsched's build, the event loop)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def runtime(python: str, workdir: Path) -> dict[str, str]:
    """What serve and the floor run on: the interpreter, its Python, mpsched's build (mypyc:
    the decision core compiled, as the image ships; python: the sources) and the event loop
    `serve --loop auto` and the floor pick (uvloop when installed)."""
    probe = (
        "import importlib.util, platform, extender.build as b; "
        "print(platform.python_version(), b.build(), "
        "'uvloop' if importlib.util.find_spec('uvloop') else 'asyncio')"
    )
    done = subprocess.run(
        [python, "-c", probe], cwd=workdir, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot run {python}: {done.stderr.strip()[-500:]}")
    version, build, loop = done.stdout.split()
    return {"interpreter": python, "python": version, "build": build, "loop": loop}
