"""`mpsched check-config FILE`: validate a configuration offline (docs/design.md, Configuration).

Prints `FILE: ok` and a short summary on stdout and exits 0, or prints every problem on stderr,
one per line as `FILE: problem`, and exits 1; a file that cannot be read gives one line and
exit status 1. Imports nothing heavier than PyYAML.
"""

from __future__ import annotations

import argparse
import sys

from extender.config import ConfigError, ConfigReadError, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the mpsched configuration (YAML) to check")


def run(args: argparse.Namespace) -> int:
    path: str = args.file
    try:
        config = load_config(path)
    except ConfigReadError as exc:
        print(f"mpsched: check-config: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{path}: {problem}", file=sys.stderr)
        return 1
    print(f"{path}: ok")
    for line in config.summary():
        print(f"  {line}")
    return 0
