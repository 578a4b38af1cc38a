"""mpsched's PEP 517 build backend: setuptools', plus mypy as a build requirement when
MPSCHED_COMPILE=1 asks for the compiled build (setup.py). Editable installs are never compiled:
extension modules built beside the sources would shadow every later edit of them."""

from __future__ import annotations

import os
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

#: What compiling needs besides setuptools: mypyc ships with mypy.
COMPILE_REQUIRES = ["mypy>=1.10"]


def _compiling() -> bool:
    return os.environ.get("MPSCHED_COMPILE") == "1"


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    if not _compiling():
        return _setuptools.get_requires_for_build_wheel(config_settings)
    # setuptools runs setup.py to collect its requirements, before mypy is there to import:
    # that run must not compile.
    os.environ.pop("MPSCHED_COMPILE")
    try:
        found = _setuptools.get_requires_for_build_wheel(config_settings)
    finally:
        os.environ["MPSCHED_COMPILE"] = "1"
    return [*found, *COMPILE_REQUIRES]


def build_wheel(
    wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None
) -> str:
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return _setuptools.get_requires_for_build_editable(config_settings)


def build_editable(
    wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None
) -> str:
    os.environ.pop("MPSCHED_COMPILE", None)
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
