"""What each accelerator earns, on the realistic bench: `python scripts/bench_ablation.py --help`,
or scripts/bench-ablation, which runs serve on the compiled build.

Runs scripts/bench_extender.py (realistic mode; every flag this script does not know is passed
to it) with every accelerator on, and with each one off in turn, alternating: round after round,
each configuration once per round, `--runs` rounds. Each run measures serve against its own
floor, so the ratios compare runs made under different load. Prints the medians and, for each
accelerator, the gain all-on shows over it off and the keep/remove verdict
(`extender_bench.ablation`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from extender_bench.ablation import SWITCHES, label, parse_off, render, summarise

BENCH = Path(__file__).resolve().parent / "bench_extender.py"


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="bench-ablation",
        description="All accelerators on against each one off, alternating, on the realistic "
        "bench; other flags go to bench-extender (e.g. --nodes 200 --pods 50 for a smoke run)",
    )
    p.add_argument("--runs", type=int, default=5, help="runs of each configuration (default 5)")
    p.add_argument(
        "--switches",
        default=",".join(SWITCHES),
        help="the accelerators to switch off in turn (default: every one)",
    )
    p.add_argument(
        "--serve-python",
        default=sys.executable,
        help="the interpreter that runs serve and the floor (scripts/bench-ablation passes "
        "the compiled build's)",
    )
    args, rest = p.parse_known_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    try:
        args.switches = parse_off(args.switches)
    except ValueError as exc:
        p.error(f"--switches: {exc}")
    for flag in ("--off", "--json", "--mode"):
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            p.error(f"{flag} is set by bench-ablation itself")
    return args, rest


def run_once(args: argparse.Namespace, rest: list[str], off: tuple[str, ...]) -> dict[str, Any]:
    """One bench run with these switches off: its JSON report. RuntimeError when it fails."""
    with tempfile.TemporaryDirectory(prefix="mpsched-ablation-") as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, str(BENCH), *rest, "--serve-python", args.serve_python]
        command += ["--json", str(out)]
        if off:
            command += ["--off", ",".join(off)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{label(off)}: bench-extender failed:\n{done.stderr[-2000:]}")
        report: dict[str, Any] = orjson.loads(out.read_bytes())
        return report


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = parse_args(argv)
    configurations = [(), *((s,) for s in args.switches)]
    runs: dict[str, list[dict[str, Any]]] = {label(off): [] for off in configurations}
    for round_ in range(1, args.runs + 1):
        for off in configurations:
            print(f"round {round_}/{args.runs}: {label(off)} ...", file=sys.stderr, flush=True)
            try:
                runs[label(off)].append(run_once(args, rest, off))
            except RuntimeError as exc:
                print(f"bench-ablation: {exc}", file=sys.stderr)
                return 1
    builds = [r["runtime"]["build"] for reports in runs.values() for r in reports]
    sys.stdout.write(render(summarise(runs), builds=builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
