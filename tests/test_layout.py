"""The package layout (docs/design.md, Architecture) holds: every package and top-level module of
`extender` has a place in import-linter's layers contract (so a new one cannot slip in unchecked),
the pure core's modules import nothing that does I/O, every module opens with a docstring and
stays under the line limit, and every subcommand lives in `extender.commands`."""

from __future__ import annotations

import ast
import pkgutil
import tomllib
from pathlib import Path

import extender
from extender.cli import SUBCOMMANDS

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


#: The most lines a module of `extender/` may have: past it, a newcomer cannot hold it in mind.
MAX_MODULE_LINES = 500


def _modules() -> list[Path]:
    return sorted((ROOT / "extender").rglob("*.py"))


def test_every_module_opens_with_a_docstring_and_stays_short() -> None:
    for path in _modules():
        text = path.read_text()
        name = path.relative_to(ROOT)
        assert ast.get_docstring(ast.parse(text)), f"{name} has no docstring"
        assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name} is over {MAX_MODULE_LINES}"


def test_every_c_source_stays_short() -> None:
    """The C extensions' files too (a source split into headers it includes once)."""
    sources = [*(ROOT / "extender").rglob("*.c"), *(ROOT / "extender").rglob("*.h")]
    assert sources
    for path in sources:
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} is over {MAX_MODULE_LINES}"


def test_every_subcommand_lives_in_the_commands_package() -> None:
    for name, (module, _help) in SUBCOMMANDS.items():
        assert module.startswith("extender.commands."), (name, module)
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), (name, module)
    # The adapters hold no command: each one's command is in extender/commands/.
    commands = {p.stem for p in (ROOT / "extender" / "commands").glob("*.py")}
    for folder in ("http", "webhook", "agent", "simulate"):
        stray = {p.name for p in (ROOT / "extender" / folder).glob("*.py")} & {
            "cli.py",
            "serve_cli.py",
            "status_cli.py",
            "demo.py",
        }
        assert stray == set(), (folder, stray)
    assert {"serve", "status", "demo", "simulate", "webhook", "agent", "check_config"} <= commands


def _bound_names(init: Path) -> set[str]:
    """The names a package's __init__ binds itself (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def test_no_submodule_shadows_a_name_of_its_package() -> None:
    # Importing `extender.kube.connect` would replace the function `extender.kube.connect` on the
    # package with the module: every later caller of the function would call a module.
    for init in (ROOT / "extender").rglob("__init__.py"):
        folder = init.parent
        submodules = {p.stem for p in folder.glob("*.py")} | {
            p.name for p in folder.iterdir() if (p / "__init__.py").is_file()
        }
        submodules.discard("__init__")
        clash = _bound_names(init) & submodules
        assert clash == set(), (str(folder.relative_to(ROOT)), clash)
