"""Where the typical pods will go: per node type, the rate at which each task type of the
workload is expected to arrive, from which node types can host it and how scarce they are.

Why. FGD weighs task type m by its popularity p_m on every node, as if every pod could land
anywhere. A pod that names a GPU model (or needs 8 GPUs, or more CPU than small nodes have) can
only land on some node types; when those are a small part of the cluster, m's pods arrive there
far more often than p_m says, and the other pods should leave those nodes to them. A node-local
measure cannot see that; this module computes it once per workload and cluster, and the
fragmentation measure (frag.py) then weighs m on a node of type k by `weight[k][m]`.

The rule, in GPU units (a CPU-only task type asks none, see below):

1. Demand. Type m asks g_m = threads × GPUs per pod; scaled so that the whole workload asks
   exactly the cluster's GPUs (the regime where fragmentation matters: the cluster fills up),
   D_m = C × p_m g_m / Σ_j p_j g_j, C the cluster's GPUs.
2. Hosts. Node type k (GPU model, GPU count, CPU) can host m when the model is allowed, it has
   at least m's GPU count, and its CPU holds m's CPU ask (`can_host`).
3. Filling. The most constrained types first (least GPU capacity on the node types that can
   host them), each type's demand goes to its hosts in proportion to their capacity not yet
   taken, never past it (`fill`): a type pinned to a small model takes that model first, and
   unpinned types spread over what is left. Demand past the hosts' capacity is dropped: those
   pods will fail anyway.
4. Weight. a_mk the demand of m given to k, C_k the GPUs of k: weight[k][m] = (G / g_m) ×
   a_mk / C_k with G = Σ_j p_j g_j: pods of m per GPU of k, in units where an unconstrained
   workload gives weight = p_m everywhere (so this reduces to FGD's weighting when every type
   fits every node). It is at most G / g_m: a type never counts more than if it alone filled k.

A CPU-only type asks no GPU; it lands on any node whose CPU holds it, in proportion to the
node type's GPUs, so its weight is p_m × C / (GPUs of its hosts) on a host.

Where a type cannot go. A type pinned to other GPU models never arrives at the node: weight 0,
so its pods' demand elsewhere does not make this node's idle GPU look like fragment (FGD counts
all of it, which draws unpinned pods onto the small models that pinned pods need). A type the
node type is too small for (GPU count, CPU) keeps FGD's rule, its popularity, with all idle GPU
fragment for it: that draws small pods to small nodes and keeps big ones for big pods (on the
openb default trace, weight 0 there too costs 0.06 pp and gains little where pods are pinned).
A node type the table does not know (a node added since) gets the popularities (FGD).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from extender.packing.policies.base import WHOLE, PodShape, Workload


@dataclass(frozen=True, slots=True)
class NodeType:
    """The nodes of one GPU model and GPU count: how many, and the most CPU one of them has."""

    model: str
    gpus: int
    #: Allocatable CPU (millicores) of the largest node of the type.
    cpu_milli: int
    #: Nodes of the type.
    count: int

    @property
    def key(self) -> tuple[str, int]:
        return self.model, self.gpus

    @property
    def capacity(self) -> int:
        """GPUs of all nodes of the type."""
        return self.gpus * self.count


#: The cluster as a scarcity weighting sees it, by (model, GPU count).
NodeTypes = tuple[NodeType, ...]
#: weight[(model, gpus)][i] = weight of workload entry i on that node type.
Weights = Mapping[tuple[str, int], tuple[float, ...]]


def node_types(nodes: Iterable[tuple[str, int, int | None]]) -> NodeTypes:
    """Group (model, GPU count, allocatable CPU or None) of each GPU node into node types, by
    (model, GPU count), ordered by key. Unknown CPU counts as unbounded (kube-scheduler
    checks CPU itself there); nodes without GPUs are left out."""
    cpu: dict[tuple[str, int], int] = {}
    count: dict[tuple[str, int], int] = {}
    for model, gpus, cpu_milli in nodes:
        if gpus <= 0:
            continue
        key = (model, gpus)
        c = UNBOUNDED_CPU if cpu_milli is None else cpu_milli
        cpu[key] = max(cpu.get(key, 0), c)
        count[key] = count.get(key, 0) + 1
    return tuple(NodeType(m, g, cpu[(m, g)], count[(m, g)]) for m, g in sorted(count))


#: CPU of a node whose allocatable CPU is unknown.
UNBOUNDED_CPU = 1 << 62


def can_host(node: NodeType, task: PodShape) -> bool:
    """An empty node of this type holds one pod of the task type (CPU, model, GPU count)."""
    if node.cpu_milli < task.cpu_milli:
        return False
    if task.gpus == 0 or task.threads == 0:
        return True
    return task.allows(node.model) and node.gpus >= task.gpus


def gpu_ask(task: PodShape) -> int:
    """GPU of one pod of the task type, in thread percent (0 for CPU-only)."""
    if task.threads == 0:
        return 0
    return min(task.threads, WHOLE) * task.gpus


def fill(demand: float, hosts: Iterable[int], left: list[float]) -> dict[int, float]:
    """Give `demand` to the `hosts` (indexes into `left`, the capacity not yet taken) in
    proportion to what each has left, never past it; take it from `left`; what each got."""
    hosts = list(hosts)
    room = sum(left[k] for k in hosts)
    if room <= 0.0:
        return {}
    share = min(1.0, demand / room)
    got = {}
    for k in hosts:
        got[k] = left[k] * share
        left[k] -= got[k]
    return got


def arrival_weights(workload: Workload, types: NodeTypes) -> Weights:
    """weight[k][i] for every node type k and workload entry i (module docstring)."""
    if not types or not workload:
        return {}
    caps = [float(t.capacity * WHOLE) for t in types]
    total = sum(caps)
    hosts = [tuple(k for k, t in enumerate(types) if can_host(t, tp.shape)) for tp in workload]
    asks = [gpu_ask(tp.shape) for tp in workload]
    mean_ask = sum(tp.popularity * a for tp, a in zip(workload, asks, strict=True))
    weights = [[0.0] * len(workload) for _ in types]
    left = list(caps)

    def room(i: int) -> float:
        return sum(caps[k] for k in hosts[i])

    gpu_tasks = [i for i, a in enumerate(asks) if a > 0 and hosts[i]]
    for i in sorted(gpu_tasks, key=lambda i: (room(i), i)):
        demand = total * workload[i].popularity * asks[i] / mean_ask
        for k, got in fill(demand, hosts[i], left).items():
            weights[k][i] = mean_ask / asks[i] * got / caps[k]
    for i, a in enumerate(asks):
        if a == 0 and hosts[i]:
            for k in hosts[i]:
                weights[k][i] = workload[i].popularity * total / room(i)
    for k, t in enumerate(types):
        for i, tp in enumerate(workload):
            if k not in hosts[i] and tp.shape.allows(t.model):
                # Too small for the type: FGD's rule (every idle GPU is fragment for it).
                weights[k][i] = tp.popularity
    return {t.key: tuple(w) for t, w in zip(types, weights, strict=True)}
