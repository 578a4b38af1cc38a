"""The `mpsched` command line: parses arguments and dispatches to each subcommand's module.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; only the named
command's module is imported, so that `mpsched check-config` never pays for aiohttp or numpy and
`mpsched --version` for none of them. Exit status: 0 on success (and for `--help`,
`--version`), 2 on bad usage, 1 on failure; errors go to stderr as one readable line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

#: subcommand → (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("extender.commands.serve", "run the extender HTTP service"),
    "webhook": ("extender.commands.webhook", "run the admission webhook (/mutate, /validate)"),
    "agent": ("extender.commands.agent", "run the node agent (NVML discovery, the MPS daemon)"),
    "demo": ("extender.commands.demo", "run the extender on a built-in sample cluster"),
    "status": ("extender.commands.status", "print the allocation table of a running extender"),
    "simulate": ("extender.commands.simulate", "replay a workload trace through the packing core"),
    "plan": ("extender.commands.plan", "capacity planning: GPUs a workload needs, per strategy"),
    "check-config": (
        "extender.commands.check_config",
        "validate an mpsched configuration file offline",
    ),
    "preflight": ("extender.commands.preflight", "check a cluster before and after install"),
    "kubectl": ("extender.commands.kubectl", "the kubectl plugin: status, why POD, top"),
}


class UsageError(Exception):
    """Bad command-line usage: exit status 2."""


def version() -> str:
    """The installed distribution's version (pyproject's `version`)."""
    try:
        return importlib.metadata.version("mpsched")
    except importlib.metadata.PackageNotFoundError:
        # Run from a source tree that was never installed (PYTHONPATH=.): still answer.
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of `command` only (its module is the one imported; with
    None, none is: the top level's help lists the commands, each one's `--help` its flags)."""
    parser = _Parser(prog="mpsched", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"mpsched {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    known = command if command in SUBCOMMANDS else None
    try:
        args = build_parser(known).parse_args(words)
    except UsageError as exc:
        where = f"mpsched {known} --help" if known else "mpsched --help"
        print(f"mpsched: usage error: {exc} (see '{where}')", file=sys.stderr)
        return 2
    except SystemExit as exc:
        # --help and --version: argparse has printed them and exits 0 (its usage errors come
        # here as UsageError instead); an exit status, not an exception, for in-process callers.
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args._module.run(args))
    except UsageError as exc:
        print(f"mpsched: usage error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
