"""Fit: which GPUs of a node can take a request, and, when none can, why not and whether
evicting pods could help. "Does not fit" is a result (`Misfit`), never an exception."""

from __future__ import annotations

from dataclasses import dataclass

from extender.packing.ledger import (
    Allocation,
    GpuRef,
    GpuUsage,
    NodeUsage,
    share_cause,
    unplaced_reason,
    unshareable_detail,
)
from extender.packing.request import (
    ContainerDemand,
    Demand,
    ShareRequest,
    container_demands,
    demand_on,
)
from extender.packing.settings import BudgetSettings


@dataclass(frozen=True, slots=True)
class Fit:
    """The request fits this node. `gpus`: for a share, every GPU index that can take it (the
    policy picks one); for whole GPUs, every idle GPU index (the lowest ones are taken)."""

    node: str
    gpus: tuple[int, ...]
    #: Per candidate, the concrete demand (shares only; whole-GPU demands are empty).
    demands: tuple[Demand, ...] = ()


@dataclass(frozen=True, slots=True)
class Misfit:
    """The request does not fit. `resolvable`: evicting pods from this node could make room
    (kube-scheduler's Unschedulable); False means no eviction can help
    (UnschedulableAndUnresolvable)."""

    node: str
    reason: str
    resolvable: bool


FitResult = Fit | Misfit
#: A share's demand per GPU shape (memory, units): it depends on the GPU's shape only, so one
#: request's is shared by every node with GPUs of that shape.
ShapeDemands = dict[tuple[int, int], Demand]


def fit_node(
    node: NodeUsage,
    request: ShareRequest,
    budgets: BudgetSettings,
    *,
    shapes: ShapeDemands | None = None,
) -> FitResult:
    """Decide where on `node` the request can go, from the ledger's current usage. `shapes`:
    where to keep (and find) the request's demands per GPU shape across calls; the caller
    owns it and must use it for this request and budgets only."""
    name = node.inventory.name
    if request.kind == "none":
        return Fit(name, ())
    if not node.gpus:
        return Misfit(name, "node has no GPUs", resolvable=False)
    if node.held_elsewhere:
        return Misfit(name, held_elsewhere_reason(node.held_elsewhere), resolvable=True)
    if node.unplaced:
        return Misfit(name, unplaced_reason(len(node.unplaced)), resolvable=True)
    if request.kind == "whole":
        return _fit_whole(node, request)
    return _fit_share(node, request, budgets, {} if shapes is None else shapes)


def held_elsewhere_reason(gpus: int) -> str:
    """Why a node whose GPUs device-plugin pods hold takes nothing new (truth rule 3 of
    docs/design.md)."""
    return (
        f"{gpus} GPU(s) held through the device plugin (nvidia.com/gpu) and which is not known: "
        "nothing new is placed here while they run"
    )


def _fit_whole(node: NodeUsage, request: ShareRequest) -> FitResult:
    name = node.inventory.name
    want = request.whole_gpus
    if len(node.gpus) < want:
        return Misfit(name, f"node has {len(node.gpus)} GPUs, pod needs {want} whole", False)
    idle = tuple(g.info.index for g in node.gpus if g.idle)
    if len(idle) >= want:
        return Fit(name, idle)
    return Misfit(name, f"fewer than {want} idle GPUs", resolvable=True)


def _fit_share(
    node: NodeUsage, request: ShareRequest, budgets: BudgetSettings, shapes: ShapeDemands
) -> FitResult:
    name = node.inventory.name
    multi_user = node.inventory.multi_user
    uid_isolation = budgets.uid_isolation
    user = request.run_as_user
    candidates: list[int] = []
    demands: list[Demand] = []
    # Per cause, the (GPU, demand) it was first seen with: the reason names that one.
    problems: dict[str, tuple[GpuUsage, Demand]] = {}
    could_ever = False
    # A node's GPUs are nearly always of one shape: the last one's demand is tried first.
    last_memory = last_units = -1
    demand: Demand | None = None
    for g in node.gpus:
        info = g.info
        if demand is None or info.memory_mib != last_memory or info.units != last_units:
            last_memory, last_units = info.memory_mib, info.units
            shape = (last_memory, last_units)
            demand = shapes.get(shape)
            if demand is None:
                demand = shapes[shape] = demand_on(request, info, budgets)
        cause = share_cause(
            g, demand.threads, demand.memory_mib, demand.clients, user,
            multi_user=multi_user, uid_isolation=uid_isolation,
        )  # fmt: skip
        if cause is None:
            candidates.append(info.index)
            demands.append(demand)
            continue
        never = _never_cause(g, demand)
        # Where the GPU could never hold the share, its lasting limit is the reason to give,
        # not whatever happens to be in use on it now.
        if never is None:
            could_ever = True
            problems.setdefault(cause, (g, demand))
        else:
            problems.setdefault(never, (g, demand))
    if candidates:
        return Fit(name, tuple(candidates), tuple(demands))
    # Node reasons name what the pod needs, never a node's current figures: kube-scheduler
    # counts identical reasons across nodes ("0/500 nodes are available: 320 <reason>, ..."),
    # so a reason per node state would flood the pod's condition and events. Built only here,
    # once per cause: most nodes fit, and their GPUs' reasons would be thrown away.
    summary = "; ".join(_reason(c, *problems[c]) for c in CAUSE_ORDER if c in problems)
    if not could_ever:
        return Misfit(name, f"no GPU here can ever hold this share: {summary}", False)
    return Misfit(name, f"no GPU has room: {summary}", resolvable=True)


#: The order causes are named in a node's reason (stable, so reasons aggregate).
CAUSE_ORDER = (
    "threads", "memory", "clients", "uid", "whole", "unshareable",
    "never-threads", "never-memory", "never-clients",
)  # fmt: skip


def _reason(cause: str, g: GpuUsage, demand: Demand) -> str:
    """A node's reason for one cause: what the pod needs (see `_fit_share`)."""
    if cause == "threads":
        return f"none with {demand.threads}% threads free"
    if cause == "memory":
        return f"none with {demand.memory_mib} MiB pinned memory free"
    if cause == "clients":
        return f"none with {demand.clients} MPS clients free"
    if cause == "uid":
        return "the others with room serve another UID (a share without runAsUser shares none)"
    if cause == "whole":
        return "some given out whole"
    cap = g.capacity
    if cause == "unshareable":
        return unshareable_detail(g.info)
    if cause == "never-threads":
        return f"{demand.threads}% threads needed, a GPU has {cap.threads}%"
    if cause == "never-clients":
        return f"{demand.clients} MPS clients needed, a GPU serves {cap.clients}"
    most = cap.memory_left(0, demand.clients)
    return f"{demand.memory_mib} MiB needed, {max(most, 0)} MiB pinnable"


def _never_cause(g: GpuUsage, demand: Demand) -> str | None:
    """Why `demand` would not fit `g` even if the GPU were empty (a cause of CAUSE_ORDER), or
    None if it would."""
    cap = g.capacity
    if cap.threads == 0:
        return "unshareable"
    if demand.threads > cap.threads:
        return "never-threads"
    if demand.clients > cap.clients:
        return "never-clients"
    if demand.memory_mib > cap.memory_left(0, demand.clients):
        return "never-memory"
    return None


def allocate(
    node: NodeUsage, request: ShareRequest, fit: Fit, gpu_index: int | None, budgets: BudgetSettings
) -> Allocation:
    """Turn a fit and the policy's choice into an Allocation the ledger can assume.
    Whole-GPU requests take the lowest-index idle GPUs (which ones does not change packing)."""
    name = node.inventory.name
    if request.kind == "whole":
        chosen = sorted(fit.gpus)[: request.whole_gpus]
        refs = tuple(GpuRef(i, node.gpus[i].info.uuid) for i in chosen)
        return _allocation(request, name, refs)
    if gpu_index is None or gpu_index not in fit.gpus:
        raise ValueError(f"GPU {gpu_index} is not a candidate on {name}")
    demand = fit.demands[fit.gpus.index(gpu_index)]
    info = node.gpus[gpu_index].info
    containers = container_demands(request, info, budgets)
    return _allocation(request, name, (GpuRef(gpu_index, info.uuid),), demand, containers)


def _allocation(
    request: ShareRequest,
    node: str,
    gpus: tuple[GpuRef, ...],
    demand: Demand | None = None,
    containers: tuple[ContainerDemand, ...] = (),
) -> Allocation:
    """The request's allocation of `gpus` on `node`: whole GPUs, or a share of `demand`."""
    return Allocation(
        pod_uid=request.pod_uid,
        namespace=request.namespace,
        name=request.name,
        node=node,
        kind="whole" if demand is None else "share",
        gpus=gpus,
        threads=0 if demand is None else demand.threads,
        memory_mib=0 if demand is None else demand.memory_mib,
        clients=0 if demand is None else demand.clients,
        containers=containers,
        run_as_user=request.run_as_user,
        priority=request.priority,
    )
