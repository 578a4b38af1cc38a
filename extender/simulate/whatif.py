"""What-if on a live cluster, from a dump (`kubectl get nodes,pods -A -o json`): would the
pending pods fit, and how many nodes of a given type must be added for all of them to.

The cluster's state: every pod the dump shows bound to a node (`spec.nodeName`) and not
finished (phase neither Succeeded nor Failed) is booked on that node first, in file order, on
the GPU the strategy's placement would choose there (the dump's own GPU assignment is not
read); a bound pod that does not fit its node by the budgets is counted and left out. Then the
pending pods (no node, not finished) are placed one by one in file order by the strategy, as
the scheduler's queue would take pods of one priority created in that order. Adding nodes:
k copies of the node type join the cluster (empty) and the whole placement is done again; k is
the smallest found by search (galloping, then bisection), up to `limit`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.cluster.loader import ClusterFileError, read_file
from extender.packing.policies import PolicySettings, all_shapes, make_policy, typical_workload
from extender.packing.settings import BudgetSettings
from extender.simulate.engine import Engine
from extender.simulate.pool import copies, smallest
from extender.simulate.replay import cluster_node_types, tie_order
from extender.simulate.strategy import Strategy
from extender.simulate.types import Cluster, SimNode, SimPod, TraceError

FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class LiveCluster:
    """A dump's nodes, the pods running on them (with their node's index), the pending pods."""

    nodes: tuple[SimNode, ...]
    running: tuple[tuple[SimPod, int], ...]
    pending: tuple[SimPod, ...]


def read_live(path: Path, cluster: Cluster) -> LiveCluster:
    """Split `cluster` (the dump read by `dump.read_cluster`) by what the dump says of each
    pod: its node and phase. Raises TraceError."""
    where: dict[str, tuple[str, str]] = {}
    try:
        for item in read_file(path):
            if item["kind"] != "Pod":
                continue
            meta = item["metadata"]
            spec = item.get("spec") or {}
            status = item.get("status") or {}
            key = f"{meta.get('namespace', 'default')}/{meta['name']}"
            where[key] = (str(spec.get("nodeName") or ""), str(status.get("phase") or "Pending"))
    except ClusterFileError as exc:
        raise TraceError(str(exc)) from None
    index = {n.name: i for i, n in enumerate(cluster.nodes)}
    running: list[tuple[SimPod, int]] = []
    pending: list[SimPod] = []
    for pod in cluster.pods:
        node, phase = where.get(pod.request.key, ("", "Pending"))
        if phase in FINISHED:
            continue
        if not node:
            pending.append(pod)
        elif node in index:
            running.append((pod, index[node]))
    return LiveCluster(cluster.nodes, tuple(running), tuple(pending))


@dataclass(frozen=True, slots=True)
class Placed:
    """One placement attempt of the pending pods on the cluster plus `added` nodes."""

    added: int
    #: Pending pod key → node name, or None where it does not fit.
    pending: dict[str, str | None]
    #: Bound pods the budgets would not let onto their node (left out).
    overbooked: tuple[str, ...]

    @property
    def all_fit(self) -> bool:
        return all(v is not None for v in self.pending.values())


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The answer for one strategy: the pods as the cluster is, and the nodes of the type to
    add (None: not even `limit` were enough) with the placement then."""

    strategy: str
    now: Placed
    add_nodes: int | None
    with_added: Placed | None


def place(
    live: LiveCluster,
    strategy: Strategy,
    extra: Sequence[SimNode],
    budgets: BudgetSettings,
    settings: PolicySettings,
    seed: int,
) -> Placed:
    """Book the running pods, then place the pending ones, on the dump's nodes plus `extra`."""
    nodes = [*live.nodes, *extra]
    all_pods = [p for p, _ in live.running] + list(live.pending)
    shapes = [strategy.transform(p).shape for p in all_pods]
    workload = typical_workload(shapes, coverage=settings.workload_coverage)
    policy = make_policy(
        strategy.policy,
        workload=workload,
        settings=settings,
        types=cluster_node_types(nodes),
        demand=all_shapes(shapes),
    )
    engine = Engine(nodes, policy, budgets, tie_order(len(nodes), random.Random(seed)))
    overbooked = tuple(
        pod.request.key
        for pod, i in live.running
        if engine.bind(i, strategy.transform(pod)) is None
    )
    out: dict[str, str | None] = {}
    for pod in live.pending:
        got = engine.place(strategy.transform(pod))
        out[pod.request.key] = None if got is None else nodes[got[0]].name
    return Placed(len(extra), out, overbooked)


def what_if(
    live: LiveCluster,
    strategy: Strategy,
    node_type: SimNode | None,
    budgets: BudgetSettings,
    settings: PolicySettings,
    *,
    seed: int,
    limit: int,
) -> WhatIf:
    """Whether the pending pods fit now and, given a node type, how many to add."""
    now = place(live, strategy, (), budgets, settings, seed)
    if now.all_fit or node_type is None:
        return WhatIf(strategy.name, now, 0 if now.all_fit else None, None)
    results: dict[int, Placed] = {}

    def hosts(k: int) -> bool:
        results[k] = place(
            live, strategy, copies(node_type, k, prefix=f"added-{node_type.name}"), budgets,
            settings, seed,
        )  # fmt: skip
        return results[k].all_fit

    found = smallest(hosts, start=1, limit=limit, below=False)
    with_added = None if found.size is None else results[found.size]
    return WhatIf(strategy.name, now, found.size, with_added)


def whatif_json(answers: Sequence[WhatIf], node_type: str | None) -> dict[str, object]:
    def placed(p: Placed | None) -> Mapping[str, object] | None:
        if p is None:
            return None
        return {
            "fit": sum(1 for v in p.pending.values() if v is not None),
            "do_not_fit": sorted(k for k, v in p.pending.items() if v is None),
            "placement": p.pending,
            "bound_pods_over_budget": list(p.overbooked),
        }

    return {
        "node_type": node_type,
        "strategies": {
            a.strategy: {
                "pending": len(a.now.pending),
                "now": placed(a.now),
                "add_nodes": a.add_nodes,
                "with_added": placed(a.with_added),
            }
            for a in answers
        },
    }


def whatif_table(answers: Sequence[WhatIf], node_type: str | None) -> str:
    lines = []
    for a in answers:
        total = len(a.now.pending)
        fit = sum(1 for v in a.now.pending.values() if v is not None)
        line = f"{a.strategy}: {fit} of {total} pending pods fit now"
        if fit < total:
            if node_type is None:
                line += " (give --add-node-type to size the nodes to add)"
            elif a.add_nodes is None:
                line += f"; even the most {node_type} nodes tried are not enough"
            else:
                line += f"; add {a.add_nodes} × {node_type} for all of them to fit"
        if a.now.overbooked:
            line += f" ({len(a.now.overbooked)} bound pods exceed their node's budgets)"
        lines.append(line)
    return "\n".join(lines)
