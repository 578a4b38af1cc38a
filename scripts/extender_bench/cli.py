"""The bench's command line: its flags and defaults (`parse_args`), and `main`, which runs a
floor or an API server when the bench re-launched itself as one, and otherwise the mode asked
for."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import extender_bench
from extender_bench.ablation import SWITCHES, parse_off
from extender_bench.classic_run import main_classic
from extender_bench.processes import parse_cpus
from extender_bench.realistic_run import main_realistic
from extender_bench.servers import serve_api, serve_floor


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench-extender", description=extender_bench.__doc__.splitlines()[0]
    )
    p.add_argument(
        "--mode",
        choices=("realistic", "classic"),
        default="realistic",
        help="realistic (default): an empty cluster filled by distinct pods new to the "
        "extender, rotating windows, async binds; classic: the half-full cluster, warm shapes, "
        "random candidates and binds after all filters (issue #3's bench)",
    )
    p.add_argument("--nodes", type=int, default=5000, help="nodes of 8 GPUs (default 5000)")
    p.add_argument(
        "--running-pods",
        type=int,
        default=None,
        help="classic: pods already running (default 12 per node: 60,000 at 5,000 nodes)",
    )
    p.add_argument(
        "--pods",
        type=int,
        default=None,
        help="pods measured (default: realistic 3000; classic 2000, with the adaptive "
        "candidate count)",
    )
    p.add_argument(
        "--pods-all",
        type=int,
        default=None,
        help="classic: pods scheduled with every node as a candidate (default pods/4)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="candidate NodeNames per call (default: kube-scheduler's adaptive count, "
        "500 at 5,000 nodes)",
    )
    p.add_argument(
        "--block",
        type=int,
        default=50,
        help="pods per server before switching to the other (default 50; 1: pod by pod)",
    )
    p.add_argument(
        "--score-pause-ms",
        type=float,
        default=0.0,
        help="realistic: milliseconds the scheduler spends between a pod's filter answer and "
        "its prioritize call, as kube-scheduler runs its own Score plugins there (default 0: "
        "back to back, the issue's bench)",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--prefix", default="", help="URL path prefix of the extender's verbs")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for serve's /readyz (default 300)",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        type=Path,
        default=None,
        help="write the cluster file and logs here and keep them",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the report as JSON ('-' for stdout, replacing the text)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed")
    p.add_argument(
        "--profile-serve",
        metavar="PATH",
        type=Path,
        default=None,
        help="realistic: run serve under cProfile and write its profile here",
    )
    p.add_argument(
        "--serve-config",
        metavar="PATH",
        type=Path,
        default=None,
        help="realistic: serve's configuration file (default: none, the built-in defaults); "
        "e.g. another policy",
    )
    p.add_argument(
        "--off",
        metavar="SWITCHES",
        default="",
        help="realistic: accelerators serve runs with switched off, comma-separated "
        f"configuration keys ({', '.join(SWITCHES)}), set over --serve-config's file; "
        "scripts/bench-ablation runs each off in turn against all on",
    )
    p.add_argument(
        "--serve-python",
        metavar="PATH",
        default=sys.executable,
        help="the interpreter that runs serve and the floor (default: this one); "
        "scripts/bench-extender passes .venv-fast's, the compiled build as the image ships",
    )
    p.add_argument(
        "--server-cpus",
        metavar="LIST",
        default=None,
        help="realistic: run serve and the floor on these CPUs only (taskset's list: 1, 2-3) "
        "and the driver and the API servers on the others, as in production, where the "
        "extender's pod has CPUs of its own beside kube-scheduler and the API server (default: "
        "every process on every CPU; on a machine of few cores the servers then also wait for "
        "the driver's and the API server's turns)",
    )
    p.add_argument(
        "--api",
        choices=("process", "embedded"),
        default="process",
        help="realistic: where the cluster lives. process (default): a Kubernetes API server "
        "in its own process (the project's fake), which serve watches and binds through as in "
        "production, and where the floor creates its Bindings too (a second one, so that both "
        "bind the same pods); embedded: serve's --cluster-file, the API server inside serve's "
        "process, and a floor whose bind only answers",
    )
    p.add_argument(
        "--floor-server", type=int, metavar="PORT", default=None, help=argparse.SUPPRESS
    )  # internal: run the floor server on PORT
    p.add_argument("--floor-api", default=None, help=argparse.SUPPRESS)  # internal: its API URL
    p.add_argument(
        "--api-server", type=int, metavar="PORT", default=None, help=argparse.SUPPRESS
    )  # internal: run an API server on PORT ...
    p.add_argument("--api-dump", type=Path, default=None, help=argparse.SUPPRESS)  # ... from this
    args = p.parse_args(argv)
    try:
        args.off = parse_off(args.off)
    except ValueError as exc:
        p.error(f"--off: {exc}")
    if args.server_cpus is not None:
        try:
            args.server_cpus = parse_cpus(args.server_cpus)
        except ValueError as exc:
            p.error(f"--server-cpus: {exc}")
    if os.sep in args.serve_python:
        # The servers run from the work directory: a relative path would not be found there.
        args.serve_python = os.path.abspath(args.serve_python)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.floor_server is not None:
        return serve_floor(args.floor_server, args.floor_api)
    if args.api_server is not None:
        return serve_api(args.api_server, args.api_dump)
    if args.pods is None:
        args.pods = 3000 if args.mode == "realistic" else 2000
    if args.mode == "classic" and (args.off or args.server_cpus):
        flag = "--off" if args.off else "--server-cpus"
        print(f"bench-extender: {flag} is for the realistic mode", file=sys.stderr)
        return 2
    if args.mode == "realistic":
        return main_realistic(args)
    return main_classic(args)
