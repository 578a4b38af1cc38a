"""`mpsched simulate`: replay a trace (openb CSVs, or a cluster dump) through the packing core
with one or more policies over several seeds; print a table, optionally write JSON and a PNG.

Exit status: 0 done, 2 bad usage, 1 failure (unreadable input or config, bad row), with one
readable line on stderr. Bad usage goes through the parser's `error` (the dispatcher's parser
raises `extender.cli.UsageError` there): this layer may not import `extender.cli` itself.

The replay engine runs on numpy and the plot on matplotlib, both in the optional extra
`mpsched[simulate]` (the serving image has neither): they are imported only once the arguments
are good, and a missing one is one line naming the extra, before any work is done.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from extender.commands.common import ProgressLine, number, read_config
from extender.config import Config, ConfigError
from extender.packing.policies import POLICY_NAMES, all_shapes, make_policy, typical_workload
from extender.packing.policies.frag import Fragmentation
from extender.simulate.dump import read_cluster
from extender.simulate.seeds import parse_seeds
from extender.simulate.trace import read_nodes, read_pods
from extender.simulate.types import Cluster, TraceError

DEFAULT_SEEDS = "42-51"
#: What every replay imports (the engine), and what `--plot` does besides (matplotlib draws,
#: Pillow writes the PNG): all of them come with the extra.
NEEDS: tuple[str, ...] = ("numpy",)
PLOT_NEEDS: tuple[str, ...] = ("matplotlib", "PIL")
EXTRA_HINT = "pip install 'mpsched[simulate]'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, metavar="PATH", help="openb node list CSV")
    parser.add_argument("--pods", type=Path, metavar="PATH", help="openb pod list CSV")
    parser.add_argument(
        "--cluster",
        type=Path,
        metavar="PATH",
        help="instead of --nodes/--pods: a `kubectl get nodes,pods -A -o json` dump",
    )
    parser.add_argument(
        "--policy",
        action="append",
        type=parse_policies,
        metavar="NAME",
        help=f"policy to run, repeatable or comma-separated ({', '.join(POLICY_NAMES)}); "
        "default: the configured one",
    )
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=DEFAULT_SEEDS,
        metavar="SPEC",
        help=f"seeds as a range A-B or a list A,B,... (default {DEFAULT_SEEDS})",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write results as JSON: one object with trace, seeds, config and policies by name",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="write allocation and fragmentation curves (PNG)",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="mpsched configuration")
    parser.add_argument(
        "--tune",
        type=parse_tune,
        default=None,
        metavar="X",
        # The default lives with the replay (extender.simulate.replay.DEFAULT_TUNE), which is
        # not imported until the arguments are known to be good.
        help="inflate the workload to X × GPU capacity with clones (default: the paper's 1.3)",
    )
    parser.set_defaults(_simulate_usage=parser.error)


def parse_policies(text: str) -> list[str]:
    """ "fgd,bestfit" → ["fgd", "bestfit"]. Raises argparse.ArgumentTypeError."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(unknown) or '(none)'}; known: {', '.join(POLICY_NAMES)}"
        )
    return names


def parse_tune(text: str) -> float:
    return number(text, float, lambda v: 0 < v <= 100, ": must be a number in (0, 100]")


class Progress(ProgressLine):
    """Runs done of `total_runs` (each a policy and seed) as a bar on a terminal; silent
    otherwise."""

    def __init__(self, stream: TextIO, total_runs: int) -> None:
        super().__init__(stream)
        self.total_runs = total_runs
        self.done_runs = 0
        self.label = ""

    def start(self, label: str) -> None:
        self.label = label

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        frac = (self.done_runs + done / total) / self.total_runs
        self.show(f"{self.label:<28} {self.bar(frac)} {100 * frac:5.1f}%")
        if done == total:
            self.done_runs += 1


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.cluster is not None and (args.nodes is not None or args.pods is not None):
        return "give either --cluster or --nodes and --pods, not both"
    if args.cluster is None and (args.nodes is None or args.pods is None):
        return "need --nodes PATH and --pods PATH (or --cluster PATH)"
    return None


def _load(args: argparse.Namespace, config: Config) -> tuple[Cluster, dict[str, str]]:
    if args.cluster is not None:
        cluster = read_cluster(args.cluster, config.budgets, selection=config.node_selection())
        return cluster, {"cluster": str(args.cluster)}
    nodes = read_nodes(args.nodes, config.gpu_models, budgets=config.budgets)
    pods = read_pods(args.pods)
    return Cluster(nodes, pods), {"nodes": str(args.nodes), "pods": str(args.pods)}


def missing_modules(*, plot: bool) -> list[str]:
    """The optional modules a run needs that are not installed (looked up, not imported)."""
    needed = NEEDS + (PLOT_NEEDS if plot else ())
    return [name for name in needed if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem is not None:
        usage: Callable[[str], None] = args._simulate_usage
        usage(problem)  # raises the dispatcher's usage error (exit status 2)
        return 2
    missing = missing_modules(plot=args.plot is not None)
    if missing:
        what = "--plot needs" if set(missing) <= set(PLOT_NEEDS) else "simulate needs"
        print(
            f"mpsched: simulate: {what} {', '.join(missing)} (not installed): {EXTRA_HINT}",
            file=sys.stderr,
        )
        return 1
    # Imported here, not at the top: they need numpy (see the module's docstring).
    from extender.simulate.replay import DEFAULT_TUNE, cluster_node_types, run_seed
    from extender.simulate.report import (
        PolicyRun,
        Setup,
        paper_figures,
        table,
        write_json,
        write_plot,
    )

    tune: float = DEFAULT_TUNE if args.tune is None else args.tune
    seeds: list[int] = args.seeds
    try:
        config = read_config(args.config)
    except ConfigError as exc:
        print(f"mpsched: simulate: {args.config}: {exc}", file=sys.stderr)
        return 1
    given: list[list[str]] = args.policy or [[config.policy.name]]
    names = list(dict.fromkeys(n for group in given for n in group))
    try:
        cluster, sources = _load(args, config)
    except TraceError as exc:
        print(f"mpsched: simulate: {exc}", file=sys.stderr)
        return 1
    shapes = [p.shape for p in cluster.pods]
    workload = typical_workload(shapes, coverage=config.policy.workload_coverage)
    demand = all_shapes(shapes)
    types = cluster_node_types(cluster.nodes)
    # One measure for every policy and seed: the curves compare, and its memo is shared.
    fragmentation = Fragmentation(workload)
    setup = Setup(
        trace={**sources, "gpu_count": cluster.gpu_capacity // 100, "pod_count": len(cluster.pods)},
        seeds=tuple(seeds),
        config="defaults" if args.config is None else str(args.config),
        tune=tune,
    )
    progress = Progress(sys.stderr, len(names) * len(seeds))
    runs = []
    try:
        for name in names:
            results = []
            for seed in seeds:
                progress.start(f"{name} seed {seed}")
                policy = make_policy(
                    name, workload=workload, settings=config.policy, types=types, demand=demand
                )
                results.append(
                    run_seed(
                        cluster,
                        policy,
                        config.budgets,
                        seed,
                        tune=tune,
                        progress=progress.update,
                        fragmentation=fragmentation,
                    )
                )
            runs.append(PolicyRun(name, tuple(results)))
    finally:
        progress.close()
    if args.config is None:
        print("config: product defaults (no --config; config/bench-openb.yaml models the paper)")
    else:
        print(f"config: {args.config}")
    paper = paper_figures(sources.get("pods"))
    print(table(runs, paper))
    try:
        if args.json is not None:
            write_json(args.json, runs, setup, paper)
        if args.plot is not None:
            write_plot(args.plot, runs, setup, paper)
    except OSError as exc:
        print(f"mpsched: simulate: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0
