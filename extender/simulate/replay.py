"""Replay rules of the FGD paper's benchmark and per-seed results.

Per seed: a seeded random tie order of the nodes; the pods sorted by name and shuffled; then
uniform random clones of the original pods appended until the next one would push the total GPU
request past `tune` (1.3) times the cluster's GPU capacity. Pods only arrive (no departures);
each is placed on the best node or fails for good. After every pod the allocated and arrived GPU
(as % of capacity) are recorded, and the cluster's fragmentation: FGD's measure (reference §3,
Σ_n F_n(M) as % of the GPU capacity, the paper's "fragmentation amount") with one typical
workload for every policy, so that the curves of different policies compare.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from extender.packing.policies import NodeTypes, Policy, node_types, typical_workload
from extender.packing.policies.frag import Fragmentation
from extender.packing.settings import BudgetSettings
from extender.simulate.engine import Engine
from extender.simulate.types import Cluster, SimNode, SimPod

#: The paper inflates the trace to 130 % of the cluster's GPU capacity.
DEFAULT_TUNE = 1.3
#: The curve is kept at each whole arrived % from 0 to this.
CURVE_MAX_PCT = 130


def cluster_node_types(nodes: Sequence[SimNode]) -> NodeTypes:
    """The node types the policy weighs task types by, as `serve` sees them (model of the
    first GPU, GPU count, allocatable CPU)."""
    return node_types((n.model, len(n.inventory.gpus), n.cpu_milli) for n in nodes)


@dataclass(frozen=True, slots=True)
class SeedResult:
    """One replay. Percentages are of the cluster's total GPU capacity."""

    seed: int
    arrivals: int
    placed: int
    #: Allocation % at the first pod after which arrived GPU reaches 100 % of capacity.
    alloc_pct_at_100: float
    alloc_pct_at_end: float
    arrived_pct_at_end: float
    #: curve[x] = allocation % at the first point where arrived % >= x (x = 0..130); points
    #: beyond the end of the run repeat the last value.
    curve: tuple[float, ...]
    #: GPU demand (% of capacity) of the pods that failed before arrived reached 100 %, by pod
    #: class ("cpu", "share", "1gpu", "2gpu", ...): where the allocation was lost.
    failed_pct_by_class: dict[str, float]
    seconds: float
    #: Fragmentation (% of capacity) at the same points as `curve`.
    frag_curve: tuple[float, ...]
    frag_pct_at_100: float


def pod_class(pod: SimPod) -> str:
    shape = pod.shape
    if shape.gpus == 0:
        return "cpu"
    return "share" if shape.is_share else f"{shape.gpus}gpu"


def arrivals(
    pods: Sequence[SimPod], capacity: int, rng: random.Random, *, tune: float
) -> list[SimPod]:
    """The arrival order: sorted by name, shuffled, then clones up to `tune` × capacity."""
    original = sorted(pods, key=lambda p: p.name)
    order = list(original)
    rng.shuffle(order)
    total = sum(p.shape.gpu_demand for p in order)
    target = tune * capacity
    if not any(p.shape.gpu_demand for p in original):
        return order
    clone = 0
    while True:
        pick = original[rng.randrange(len(original))]
        if total + pick.shape.gpu_demand > target:
            return order
        total += pick.shape.gpu_demand
        name = f"{pick.name}-clone-{clone}"
        request = replace(pick.request, name=name, pod_uid=name)
        order.append(replace(pick, name=name, request=request))
        clone += 1


def tie_order(n: int, rng: random.Random) -> list[int]:
    """rank[i] of node i: a seeded random permutation (the paper's simulator renames nodes
    with a seeded prefix and breaks score ties by name, which amounts to this)."""
    rank = list(range(n))
    rng.shuffle(rank)
    return rank


def run_seed(
    cluster: Cluster,
    policy: Policy,
    budgets: BudgetSettings,
    seed: int,
    *,
    tune: float = DEFAULT_TUNE,
    progress: Callable[[int, int], None] | None = None,
    fragmentation: Fragmentation | None = None,
) -> SeedResult:
    """Replay the cluster's pods once with this seed and policy. `fragmentation` measures the
    cluster (FGD's measure of the trace's typical workload when None); pass one to share its
    memo between runs."""
    started = time.perf_counter()
    if fragmentation is None:
        fragmentation = Fragmentation(typical_workload(p.shape for p in cluster.pods))
    rng = random.Random(seed)
    rank = tie_order(len(cluster.nodes), rng)
    order = arrivals(cluster.pods, cluster.gpu_capacity, rng, tune=tune)
    engine = Engine(cluster.nodes, policy, budgets, rank)
    capacity = cluster.gpu_capacity
    arrived = allocated = placed = 0
    at_100: float | None = None
    frag_at_100: float | None = None
    curve: list[float] = []
    # Σ F_n kept up to date node by node: a placement changes only its node's F.
    node_frag = [fragmentation(engine.view(i)) for i in range(len(cluster.nodes))]
    frag = sum(node_frag)
    frag_curve: list[float] = []
    failed: dict[str, float] = {}
    step = max(1, len(order) // 200)
    for k, pod in enumerate(order):
        demand = pod.shape.gpu_demand
        arrived += demand
        where = engine.place(pod)
        if where is not None:
            placed += 1
            allocated += demand
            i = where[0]
            now = fragmentation(engine.view(i))
            frag += now - node_frag[i]
            node_frag[i] = now
        elif at_100 is None:
            cls = pod_class(pod)
            failed[cls] = failed.get(cls, 0.0) + 100.0 * demand / capacity
        alloc_pct = 100.0 * allocated / capacity
        arrived_pct = 100.0 * arrived / capacity
        frag_pct = 100.0 * frag / capacity
        while len(curve) <= CURVE_MAX_PCT and arrived_pct >= len(curve):
            curve.append(alloc_pct)
            frag_curve.append(frag_pct)
        if at_100 is None and arrived >= capacity:
            at_100, frag_at_100 = alloc_pct, frag_pct
        if progress is not None and (k % step == 0 or k == len(order) - 1):
            progress(k + 1, len(order))
    end_alloc = 100.0 * allocated / capacity
    end_frag = 100.0 * frag / capacity
    frag_curve.extend([end_frag] * (CURVE_MAX_PCT + 1 - len(frag_curve)))
    curve.extend([end_alloc] * (CURVE_MAX_PCT + 1 - len(curve)))
    return SeedResult(
        seed=seed,
        arrivals=len(order),
        placed=placed,
        alloc_pct_at_100=end_alloc if at_100 is None else at_100,
        alloc_pct_at_end=end_alloc,
        arrived_pct_at_end=100.0 * arrived / capacity,
        curve=tuple(curve),
        failed_pct_by_class=failed,
        seconds=time.perf_counter() - started,
        frag_curve=tuple(frag_curve),
        frag_pct_at_100=end_frag if frag_at_100 is None else frag_at_100,
    )
