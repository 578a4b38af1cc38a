"""Test isolation shared by every folder: commands run in-process (`serve`, `status`, `demo`)
install the process's logging as a real run would; each test, and each module (for fixtures
that run a command once per module), gets the root logger back as it was."""

from __future__ import annotations

import contextlib
import dataclasses
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


def pytest_addoption(parser: pytest.Parser) -> None:
    from extender.config import AcceleratorSettings

    switches = [f.name for f in dataclasses.fields(AcceleratorSettings)]
    parser.addoption(
        "--accelerators",
        default="on",
        choices=("on", "off", *(f"{s}-alone" for s in switches)),
        help="the accelerators a configuration gets by default: all on (as shipped), all off, "
        "or one on alone; the answers must not change (scripts/test runs the verbs' tests off)",
    )


@pytest.fixture(autouse=True, scope="session")
def _accelerators_by_default(request: pytest.FixtureRequest) -> Iterator[None]:
    """Make `--accelerators` the default of every configuration the tests build."""
    from extender.config import AcceleratorSettings

    chosen: str = request.config.getoption("--accelerators")
    init = AcceleratorSettings.__init__
    kept = dict(init.__kwdefaults__ or {})
    if chosen != "on":
        alone = chosen.removesuffix("-alone")
        init.__kwdefaults__ = {name: name == alone for name in kept}
    try:
        yield
    finally:
        init.__kwdefaults__ = kept


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "accelerator(name): a test of that accelerator's own mechanism (or 'every': of the "
        "switches themselves), skipped by an --accelerators run that turns it off",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen: str = config.getoption("--accelerators")
    if chosen == "on":
        return
    alone = chosen.removesuffix("-alone")
    for item in items:
        for mark in item.iter_markers("accelerator"):
            name = mark.args[0]
            if name != alone:
                item.add_marker(pytest.mark.skip(reason=f"tests {name}, off in this run"))
