"""The pinned grid benchmark: every cell of `synthetic.grid_cells` replayed with a policy and
with `fgd` on the same seeds (same pods, order and tie order), paired.

    python -m extender.simulate.grid [--policy default] [--seeds 1-20] [--cells NAME,...]
        [--config config/bench-openb.yaml] [--json PATH] [--markdown PATH]

Per cell and seed: the GPU left unallocated (% of capacity) when the arrived GPU request first
reaches the cluster's capacity, the FGD benchmark's point (the replay stops there: the same
figure as `replay.run_seed`'s alloc_pct_at_100), and the idle GPUs by node model then. The
table has one row per cell, the worst first: fgd's and the policy's means, the paired mean
difference (policy - fgd, pp of unallocated GPU: positive is worse) with its standard error,
and mean - 2 s.e. (above 0: worse than fgd beyond noise). Exit status 1 when some cell is.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.config import Config, ConfigError, load_config
from extender.packing.policies import all_shapes, make_policy, typical_workload
from extender.simulate.engine import Engine
from extender.simulate.replay import arrivals, cluster_node_types, tie_order
from extender.simulate.seeds import parse_seeds
from extender.simulate.synthetic import (
    GridCell,
    grid_cells,
    grid_node_rows,
    grid_pods,
    write_csv,
    write_nodes_csv,
)
from extender.simulate.trace import read_nodes, read_pods
from extender.simulate.types import Cluster, TraceError

#: The generator seed of every cell's pods (the replay seeds vary the order and the ties).
POD_SEED = 1


@dataclass(frozen=True, slots=True)
class Run:
    """One replay up to arrived = 100 %."""

    #: GPU left unallocated, % of the cluster's capacity.
    unallocated: float
    #: Idle GPUs (whole-GPU units) by node model.
    idle_by_model: dict[str, float]


@dataclass(frozen=True, slots=True)
class CellResult:
    """One cell, paired over the seeds."""

    cell: str
    fgd: float
    policy: float
    #: Mean and standard error of policy - fgd (pp of unallocated GPU).
    diff: float
    se: float
    idle_fgd: dict[str, float]
    idle_policy: dict[str, float]
    #: policy - fgd per seed, in seed order.
    diffs: tuple[float, ...] = ()

    @property
    def upper(self) -> float:
        """diff - 2 s.e.: above 0, the policy is worse than fgd beyond noise."""
        return self.diff - 2 * self.se


def replay_to_100(cluster: Cluster, policy_name: str, config: Config, seed: int) -> Run:
    """The benchmark's replay of `cluster` with one policy and seed, stopped at the first pod
    after which the arrived GPU request reaches the capacity."""
    shapes = [p.shape for p in cluster.pods]
    workload = typical_workload(shapes, coverage=config.policy.workload_coverage)
    policy = make_policy(
        policy_name, workload=workload, settings=config.policy,
        types=cluster_node_types(cluster.nodes), demand=all_shapes(shapes),
    )  # fmt: skip
    rng = random.Random(seed)
    rank = tie_order(len(cluster.nodes), rng)
    # The clones past 100 % are drawn after the shuffle: the order up to 100 % is run_seed's.
    order = arrivals(cluster.pods, cluster.gpu_capacity, rng, tune=1.3)
    engine = Engine(cluster.nodes, policy, config.budgets, rank)
    capacity = cluster.gpu_capacity
    arrived = allocated = 0
    for pod in order:
        arrived += pod.shape.gpu_demand
        if engine.place(pod) is not None:
            allocated += pod.shape.gpu_demand
        if arrived >= capacity:
            break
    idle: dict[str, float] = {}
    for i, node in enumerate(cluster.nodes):
        if node.inventory.gpus:
            idle[node.model] = idle.get(node.model, 0.0) + sum(engine.view(i).gpu_free) / 100
    return Run(100.0 - 100.0 * allocated / capacity, idle)


def cell_cluster(cell: GridCell, folder: Path, config: Config) -> Cluster:
    """The cell's cluster and pods, written as openb CSVs into `folder` and read back the way
    `mpsched simulate` reads them."""
    nodes_csv = folder / "grid-nodes.csv"
    with nodes_csv.open("w", encoding="utf-8") as out:
        write_nodes_csv(grid_node_rows(), out)
    pods_csv = folder / f"{cell.name}.csv"
    with pods_csv.open("w", encoding="utf-8") as out:
        write_csv(grid_pods(cell, seed=POD_SEED), out)
    nodes = read_nodes(nodes_csv, config.gpu_models, budgets=config.budgets)
    return Cluster(nodes, read_pods(pods_csv))


def paired(diffs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of paired differences (s.e. 0 for a single one)."""
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def run_cell(
    cell: GridCell, policy_name: str, config: Config, seeds: Sequence[int], folder: Path
) -> CellResult:
    """The cell replayed with `fgd` and the policy on every seed, paired."""
    cluster = cell_cluster(cell, folder, config)
    diffs: list[float] = []
    totals = {"fgd": 0.0, "policy": 0.0}
    idle: dict[str, dict[str, float]] = {"fgd": {}, "policy": {}}
    for seed in seeds:
        got = {}
        for key, name in (("fgd", "fgd"), ("policy", policy_name)):
            run = got[key] = replay_to_100(cluster, name, config, seed)
            totals[key] += run.unallocated
            for model, gpus in run.idle_by_model.items():
                idle[key][model] = idle[key].get(model, 0.0) + gpus / len(seeds)
        diffs.append(got["policy"].unallocated - got["fgd"].unallocated)
    mean, se = paired(diffs)
    n = len(seeds)
    return CellResult(
        cell.name, totals["fgd"] / n, totals["policy"] / n, mean, se, idle["fgd"], idle["policy"],
        tuple(diffs),
    )  # fmt: skip


def _idle(idle: dict[str, float]) -> str:
    ranked = sorted(idle.items(), key=lambda kv: (-kv[1], kv[0]))
    return " ".join(f"{model} {gpus:.1f}" for model, gpus in ranked if gpus >= 0.05)


def table(results: Sequence[CellResult], policy_name: str, seeds: str) -> str:
    """The results as a markdown table, the worst cell first, and a verdict line."""
    rows = sorted(results, key=lambda r: (-r.upper, r.cell))
    lines = [
        f"`{policy_name}` against `fgd` on the pinned grid: GPU unallocated (%) at arrived = "
        f"100 %, replay seeds {seeds}, paired; idle GPUs by node model at that point.",
        "",
        f"| cell | fgd | {policy_name} | diff ± s.e. (pp) | diff − 2 s.e. | idle GPUs, fgd | "
        f"idle GPUs, {policy_name} |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.cell} | {r.fgd:.2f} | {r.policy:.2f} | {r.diff:+.3f} ± {r.se:.3f} | "
            f"{r.upper:+.3f} | {_idle(r.idle_fgd)} | {_idle(r.idle_policy)} |"
        )
    worse = [r.cell for r in rows if r.upper > 0]
    lines += ["", f"Cells worse than fgd beyond noise: {len(worse)} of {len(rows)}."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--policy", default="default", help="the policy paired with fgd")
    parser.add_argument("--seeds", default="1-20", help="replay seeds, A-B or A,B,...")
    parser.add_argument("--cells", help="comma-separated cell names (default: every cell)")
    parser.add_argument("--config", type=Path, default=Path("config/bench-openb.yaml"))
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        cells = [GridCell.parse(n) for n in args.cells.split(",")] if args.cells else grid_cells()
        make_policy(args.policy, workload=(), settings=Config.default().policy)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"grid: {args.config}: {exc}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for cell in cells:
                result = run_cell(cell, args.policy, config, seeds, Path(tmp))
                results.append(result)
                print(f"  {cell.name}: {result.diff:+.3f} ± {result.se:.3f}", file=sys.stderr)
    except TraceError as exc:
        print(f"grid: {exc}", file=sys.stderr)
        return 1
    text = table(results, args.policy, args.seeds)
    print(text)
    print(f"({time.perf_counter() - started:.0f} s)")
    try:
        if args.json is not None:
            rows = [
                {"cell": r.cell, "fgd": r.fgd, args.policy: r.policy, "diff": r.diff,
                 "se": r.se, "upper": r.upper, "idle_fgd": r.idle_fgd,
                 "idle_policy": r.idle_policy, "diffs": list(r.diffs)}
                for r in sorted(results, key=lambda r: -r.upper)
            ]  # fmt: skip
            document = {"policy": args.policy, "seeds": seeds, "cells": rows}
            args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        if args.markdown is not None:
            args.markdown.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"grid: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    return 1 if any(r.upper > 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
