"""Test isolation shared by every folder: commands run in-process (`serve`, `status`, `demo`)
install the process's logging as a real run would; each test, and each module (for fixtures
that run a command once per module), gets the root logger back as it was."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    with _root_logger_kept():
        yield


@pytest.fixture(autouse=True, scope="module")
def _root_logger_restored_after_the_module() -> Iterator[None]:
    with _root_logger_kept():
        yield
