"""What a run of either mode shares around its measuring: the work directory (`--keep`, or a
temporary one), the progress log (stderr when the report goes to stdout), and the report's
output (text or JSON, and `--strict`'s exit status)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


def work_directory(args: argparse.Namespace, stack: contextlib.ExitStack) -> Path:
    """`--keep`'s directory (made if missing, kept), else a temporary one that `stack` removes."""
    if args.keep is not None:
        workdir: Path = args.keep.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mpsched-bench-")))


def progress_log(args: argparse.Namespace) -> Callable[..., None]:
    """`print` for progress lines, to stderr when `--json -` keeps stdout for the report."""
    if args.json != "-":
        return print
    return lambda *a, **k: print(*a, **k, file=sys.stderr)


def write_report(args: argparse.Namespace, report: dict[str, Any], text: str) -> int:
    """Print the report (`text`, or the JSON with `--json -`), write `--json`'s file, and answer
    the exit status: 1 under `--strict` when a target was missed, else 0."""
    if args.json == "-":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(text)
        if args.json:
            Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    missed = any(t["result"] == "MISS" for t in report["targets"])
    return 1 if args.strict and missed else 0
