"""Micro-benchmark of the scoring policy alone, as /prioritize calls it: score one pod on every
node of a cluster of realistic size (the openb node list: 1,213 GPU nodes), cold (a new policy,
empty memo: the first call after a workload change) and warm (the same nodes again), for the
openb typical pods. Node states are part-filled at random (seeded), so most are distinct.

    .venv/bin/python scripts/bench_policy.py NODES_CSV PODS_CSV [--policy default]

Prints microseconds per node score. Runs on any version of the policy API (node types are
passed where make_policy takes them).
"""

from __future__ import annotations

import argparse
import csv
import inspect
import random
import time
from pathlib import Path
from typing import Any

from extender.packing.policies import (
    NodeState,
    PodShape,
    PolicySettings,
    make_policy,
    share_candidates,
    typical_workload,
)


def _nodes(path: Path) -> list[tuple[str, int, int]]:
    with path.open(newline="") as f:
        return [
            (r["model"], int(r["gpu"]), int(r["cpu_milli"]))
            for r in csv.DictReader(f)
            if int(r["gpu"])
        ]


def _shapes(path: Path) -> list[PodShape]:
    out = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            num, milli = int(r["num_gpu"]), int(r["gpu_milli"])
            models = frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m)
            threads = 0 if num == 0 else (100 if milli >= 1000 else max(1, milli // 10))
            out.append(PodShape(int(r["cpu_milli"]), threads, num, models))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("nodes", type=Path)
    parser.add_argument("pods", type=Path)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    nodes = _nodes(args.nodes)
    shapes = _shapes(args.pods)
    workload = typical_workload(shapes)
    states = []
    for model, gpus, cpu in nodes:
        free = tuple(rng.choice([0, 19, 35, 53, 100, 100, 100]) for _ in range(gpus))
        states.append(NodeState(model, rng.randrange(0, cpu + 1, 500), free))
    pods = [s for s in workload[:8] for _ in range(1)]
    kwargs: dict[str, Any] = {}
    if "types" in inspect.signature(make_policy).parameters:
        from extender.packing.policies import node_types

        kwargs["types"] = node_types((m, g, c) for m, g, c in nodes)
    cold = warm = 0.0
    calls = 0
    for _ in range(args.rounds):
        policy = make_policy(args.policy, workload=workload, settings=PolicySettings(), **kwargs)
        for tp in pods:
            cands = [share_candidates(s, tp.shape) for s in states]
            for label in ("cold", "warm"):
                t0 = time.perf_counter()
                for s, c in zip(states, cands, strict=True):
                    if c or tp.shape.gpus == 0:
                        policy.score(s, tp.shape, c)
                dt = time.perf_counter() - t0
                if label == "cold":
                    cold += dt
                else:
                    warm += dt
            calls += len(states)
    print(
        f"{args.policy}: {len(states)} nodes, {len(pods)} pod shapes x {args.rounds} rounds: "
        f"cold {cold / calls * 1e6:.2f} us/node, warm {warm / calls * 1e6:.2f} us/node"
    )


if __name__ == "__main__":
    main()
