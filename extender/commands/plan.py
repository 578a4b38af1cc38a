"""`mpsched plan`: capacity planning. How many GPUs does a workload need with each sharing
strategy (no sharing, an equal split, mpsched's policies), and how many does mpsched save; or,
on a live cluster's dump, would the pending pods fit and how many nodes of a type to add.

Exit status: 0 done, 2 bad usage, 1 failure (unreadable input or config, bad row, unwritable
output), with one readable line on stderr. The replay needs numpy (the `mpsched[simulate]`
extra): the replay modules are imported once the arguments are good.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from extender import __version__
from extender.commands.common import ProgressLine, number, read_config
from extender.commands.simulate import EXTRA_HINT
from extender.config import Config, ConfigError
from extender.simulate.seeds import parse_seeds
from extender.simulate.strategy import Strategy, StrategyError, parse_strategies
from extender.simulate.timed import DISTRIBUTIONS

DEFAULT_STRATEGIES = "whole,equal:4,default"
DEFAULT_SEEDS = "42-46"
#: The search stops at this many times the pool's nodes (or this many nodes of a type, × 1000).
DEFAULT_MAX_SCALE = 4.0
NODE_TYPE_LIMIT = 10_000


def _positive(kind: str) -> Callable[[str], float]:
    if kind == "wait":
        return lambda text: number(
            text, float, lambda v: math.isfinite(v) and v >= 0, ": must be a number >= 0"
        )
    return lambda text: number(
        text, float, lambda v: math.isfinite(v) and v > 0, ": must be a number > 0"
    )


def _strategies(text: str) -> list[Strategy]:
    try:
        return parse_strategies(text)
    except StrategyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from extender.simulate.plan_columns import column_help

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    strategies = textwrap.fill(
        "strategies: whole (a share takes a whole GPU), equal:N (N equal units per GPU, a share "
        "takes the fewest covering it), or an mpsched policy; whole and equal:N are placed by "
        "mpsched's default policy unless named as whole@POLICY.",
        width=92,
    )
    parser.epilog = f"{strategies}\n\nfigures:\n{column_help()}"
    add = parser.add_argument
    add("--nodes", type=Path, metavar="PATH", help="openb node list CSV: the node pool")
    add("--pods", type=Path, metavar="PATH", help="openb pod list CSV: the workload")
    add(
        "--cluster",
        type=Path,
        metavar="PATH",
        help="what-if: a `kubectl get nodes,pods -A -o json` dump; do its pending pods fit?",
    )
    add(
        "--add-node-type",
        metavar="MODEL:GPUS[:CPU_MILLI:MEMORY_MIB]",
        help="what-if: how many nodes of this type to add for every pending pod to fit",
    )
    add(
        "--node-type",
        metavar="MODEL:GPUS[:CPU_MILLI:MEMORY_MIB]",
        help="size clusters as counts of this node type instead of scaling the --nodes pool "
        "(CPU and memory default to the pool's most common node of that model and GPU count)",
    )
    add(
        "--strategies",
        type=_strategies,
        default=DEFAULT_STRATEGIES,
        metavar="LIST",
        help=f"comma-separated strategies (default {DEFAULT_STRATEGIES})",
    )
    add(
        "--seeds",
        type=parse_seeds,
        default=DEFAULT_SEEDS,
        metavar="SPEC",
        help=f"seeds as A-B or A,B,... (default {DEFAULT_SEEDS}): the node tie order and, "
        "for a trace without times, the drawn arrivals",
    )
    add(
        "--load",
        type=_positive("load"),
        default=1.0,
        metavar="K",
        help="divide arrival times by K, keeping lifetimes (default 1)",
    )
    add(
        "--max-wait",
        type=_positive("wait"),
        default=0.0,
        metavar="SECONDS",
        help="a cluster hosts the workload when no pod waits longer than this (default 0: none "
        "waits; the lower bound holds for 0 only)",
    )
    add(
        "--rate",
        type=_positive("rate"),
        metavar="PODS_PER_S",
        help="for a trace without times: Poisson arrivals at this rate",
    )
    add(
        "--lifetime",
        type=_positive("lifetime"),
        metavar="SECONDS",
        help="for a trace without times: mean pod lifetime",
    )
    add(
        "--lifetime-dist",
        choices=DISTRIBUTIONS,
        default="exp",
        help="for a trace without times: lifetime distribution (default exp)",
    )
    add(
        "--max-scale",
        type=_positive("scale"),
        default=DEFAULT_MAX_SCALE,
        metavar="X",
        help=f"largest cluster tried: X × the pool (default {DEFAULT_MAX_SCALE:g})",
    )
    add(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        metavar="N",
        help="processes for the search (default: 2, or 1 on one CPU)",
    )
    add("--json", type=Path, metavar="PATH", help="write the plan as JSON")
    add("--report", type=Path, metavar="PATH.html", help="write the plan as one HTML page")
    add("--config", type=Path, metavar="FILE", help="mpsched configuration (GPU models, budgets)")
    parser.set_defaults(_plan_usage=parser.error)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.cluster is not None:
        if args.nodes is not None or args.pods is not None:
            return "give either --cluster or --nodes and --pods, not both"
        return None
    if args.nodes is None or args.pods is None:
        return "need --nodes PATH and --pods PATH (or --cluster PATH)"
    if args.add_node_type is not None:
        return "--add-node-type goes with --cluster (a what-if on a live cluster)"
    if (args.rate is None) != (args.lifetime is None):
        return "--rate and --lifetime go together (arrivals for a trace without times)"
    if args.jobs < 1:
        return "--jobs must be at least 1"
    return None


class Progress(ProgressLine):
    """The plan's jobs done, with an ETA, on a terminal; silent otherwise."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.started = time.monotonic()

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        frac = done / total
        elapsed = time.monotonic() - self.started
        eta = f"ETA {elapsed / frac * (1 - frac):4.0f}s" if frac > 0 else "ETA   ?"
        self.show(f"plan {self.bar(frac)} {done}/{total} jobs {elapsed:4.0f}s {eta}")


def _fail(message: str) -> int:
    print(f"mpsched: plan: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    problem = _usage_problem(args)
    if problem is not None:
        args._plan_usage(problem)  # raises the dispatcher's usage error (exit status 2)
        return 2
    from extender.commands.simulate import missing_modules

    if missing_modules(plot=False):
        return _fail(
            f"needs {', '.join(missing_modules(plot=False))} (not installed): {EXTRA_HINT}"
        )
    try:
        config = read_config(args.config)
    except ConfigError as exc:
        return _fail(f"{args.config}: {exc}")
    from extender.simulate.types import TraceError
    from extender.simulate.workers import WorkerError

    try:
        return _what_if(args, config) if args.cluster is not None else _plan(args, config)
    except (TraceError, WorkerError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot write {exc.filename}: {exc.strerror}")


def _plan(args: argparse.Namespace, config: Config) -> int:
    from extender.packing.policies import typical_workload
    from extender.packing.policies.frag import Fragmentation
    from extender.simulate.plan_html import render
    from extender.simulate.plan_report import plan_json, table
    from extender.simulate.planner import Settings, Sizing, answer_all, compare
    from extender.simulate.pool import PoolError, gpu_count, parse_node_type
    from extender.simulate.timed import (
        Synthetic,
        TimedPod,
        draw_times,
        from_trace,
        lower_bound,
        read_times,
        with_load,
    )
    from extender.simulate.trace import read_nodes, read_pods

    pool = read_nodes(args.nodes, config.gpu_models, budgets=config.budgets)
    pods = read_pods(args.pods)
    times = read_times(args.pods) if args.rate is None else None
    if args.rate is None and times is None:
        args._plan_usage(
            f"{args.pods} has no creation_time/deletion_time: give --rate and --lifetime"
        )
        return 2
    synthetic = (
        None if args.rate is None else Synthetic(args.rate, args.lifetime, args.lifetime_dist)
    )
    seeds: list[int] = args.seeds
    load: float = args.load

    def workload(seed: int) -> list[TimedPod]:
        if synthetic is None:
            assert times is not None
            return with_load(from_trace(pods, times), load)
        return with_load(draw_times(pods, synthetic, seed), load)

    if args.node_type is not None:
        try:
            template = parse_node_type(
                args.node_type, pool, config.gpu_models, budgets=config.budgets
            )
        except PoolError as exc:
            args._plan_usage(str(exc))
            return 2
        sizing = Sizing((template,), NODE_TYPE_LIMIT, by_type=True)
    else:
        sizing = Sizing(pool, max(1, math.ceil(args.max_scale * len(pool))))
    first = workload(seeds[0])
    # A drawn workload differs by seed; the bound is the largest over them.
    hosts = sizing.nodes
    bounds = [lower_bound(first, hosts)] + [
        lower_bound(workload(s), hosts) for s in seeds[1:] if synthetic
    ]
    bound = max(bounds, key=lambda b: b.gpus)
    start = sizing.size_for(bound.gpus, bound.per_model)
    settings = Settings(sizing, args.max_wait, config.budgets, config.policy, start)
    strategies: list[Strategy] = args.strategies
    progress = Progress(sys.stderr)
    started = time.monotonic()
    try:
        answers = answer_all(
            settings, strategies, workload, seeds, jobs=args.jobs, done=progress.update
        )
    finally:
        progress.close()
    found = [s.nodes for a in answers for s in a.seeds[:1] if s.nodes is not None]
    comparison = None
    if found:
        measure = Fragmentation(typical_workload(p.shape for p in pods))
        comparison = compare(
            settings, strategies, first, seeds[0], min(found), measure, buckets=240
        )
    inputs: dict[str, Any] = {
        "version": __version__,
        "pods": str(args.pods),
        "pod_count": len(pods),
        "nodes": str(args.nodes),
        "node_count": len(pool),
        "pool_gpus": gpu_count(pool),
        "sizing": f"counts of {args.node_type}"
        if args.node_type
        else "the pool, scaled (mix kept)",
        "times": "trace"
        if synthetic is None
        else (
            f"drawn: {synthetic.rate:g} pods/s, {synthetic.distribution} lifetimes of mean "
            f"{synthetic.mean_lifetime:g}s"
        ),
        "seeds": seeds,
        "load": load,
        "max_wait_s": args.max_wait,
        "strategies": [s.name for s in strategies],
        "config": "defaults" if args.config is None else str(args.config),
        "policy_settings": {"workload_coverage": config.policy.workload_coverage},
        "budgets": {
            "oversubscription": config.budgets.oversubscription,
            "memory_reserve_mib": config.budgets.memory_reserve_mib,
            "pre_volta": config.budgets.pre_volta,
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    floor = (start, gpu_count(sizing.cluster(start)))
    doc = plan_json(inputs=inputs, bound=bound, floor=floor, answers=answers, comparison=comparison)
    print(table(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.report is not None:
        args.report.write_text(render(doc), encoding="utf-8")
    return 0


def _what_if(args: argparse.Namespace, config: Config) -> int:
    from extender.simulate.dump import read_cluster
    from extender.simulate.pool import PoolError, parse_node_type
    from extender.simulate.whatif import read_live, what_if, whatif_json, whatif_table

    cluster = read_cluster(args.cluster, config.budgets, selection=config.node_selection())
    live = read_live(args.cluster, cluster)
    template = None
    if args.add_node_type is not None:
        try:
            template = parse_node_type(
                args.add_node_type,
                cluster.nodes,
                config.gpu_models,
                budgets=config.budgets,
            )
        except PoolError as exc:
            args._plan_usage(str(exc))
            return 2
    strategies: Sequence[Strategy] = args.strategies
    answers = [
        what_if(
            live,
            s,
            template,
            config.budgets,
            config.policy,
            seed=args.seeds[0],
            limit=NODE_TYPE_LIMIT,
        )
        for s in strategies
    ]
    print(whatif_table(answers, args.add_node_type))
    if args.json is not None:
        doc = whatif_json(answers, args.add_node_type)
        doc["inputs"] = {
            "version": __version__,
            "cluster": str(args.cluster),
            "seed": args.seeds[0],
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0
