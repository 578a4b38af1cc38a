"""The package layout (docs/design.md, Architecture) holds: every package and top-level module of
`extender` has a place in import-linter's layers contract (so a new one cannot slip in unchecked),
and the pure core's modules import nothing that does I/O."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import extender

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict[str, object]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = doc["tool"]["importlinter"]["contracts"]
    return contracts


def test_every_package_has_a_layer() -> None:
    [layers] = [c for c in _contracts() if c["type"] == "layers"]
    placed = {
        name.strip()
        for layer in layers["layers"]  # type: ignore[attr-defined]
        for name in str(layer).split("|")
    }
    modules = {f"extender.{m.name}" for m in pkgutil.iter_modules(extender.__path__)}
    assert modules - placed == set()
    assert placed - modules == set()


def test_the_core_is_forbidden_every_io_module() -> None:
    [core] = [c for c in _contracts() if c["name"] == "The packing core does no I/O"]
    forbidden = set(core["forbidden_modules"])  # type: ignore[call-overload]
    assert {
        "asyncio",
        "os",
        "socket",
        "aiohttp",
        "extender.cluster",
        "extender.service",
    } <= forbidden
