"""Which pods to evict from one node so that a pod's GPU request fits (the /preempt verb).

Owns the victim-selection rule. Shares are per GPU: evicting pods spread over several GPUs
frees nothing usable unless one GPU ends up with room for the whole request, so every GPU is
tried on its own. On each GPU the rule mirrors kube-scheduler's own dry run: evict every
allowed pod, check the request fits, then reprieve (keep) pods one at a time while it still
fits, the highest priority first. Two reprieve orders are tried (priority then smallest; smallest
then priority) and the GPU and order that evict the fewest pods, then the lowest priorities, win.
Pure: reads the ledger's usage objects, changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence

from extender.packing.ledger import Allocation, GpuUsage, Ledger, NodeUsage, share_cause
from extender.packing.request import Demand, ShareRequest, demand_on
from extender.packing.settings import BudgetSettings

Cost = tuple[int, int, int, int]


def _cost(victims: Sequence[Allocation], index: int) -> Cost:
    """Fewest victims, then the lowest highest priority, then the lowest priority sum."""
    prios = [a.priority for a in victims]
    return (len(victims), max(prios, default=-(2**31)), sum(prios), index)


def _fits(
    g: GpuUsage,
    keep: Sequence[Allocation],
    demand: Demand,
    request: ShareRequest,
    node: NodeUsage,
    *,
    uid_isolation: bool,
) -> bool:
    uids: Counter[int | None] = Counter(a.run_as_user for a in keep)
    trial = GpuUsage(
        g.info,
        g.capacity,
        threads=sum(a.threads for a in keep),
        memory_mib=sum(a.memory_mib for a in keep),
        clients=sum(a.clients for a in keep),
        uids=dict(uids),
    )
    cause = share_cause(
        trial, demand.threads, demand.memory_mib, demand.clients, request.run_as_user,
        multi_user=node.inventory.multi_user, uid_isolation=uid_isolation,
    )  # fmt: skip
    return cause is None


def _share_on_gpu(
    node: NodeUsage,
    g: GpuUsage,
    request: ShareRequest,
    removable: Collection[str],
    owner: Allocation | None,
    budgets: BudgetSettings,
) -> list[Allocation] | None:
    if g.capacity.threads == 0:
        return None
    forced: list[Allocation] = []
    if g.owner is not None:
        # A GPU given out whole takes shares only once its owner is gone.
        if owner is None or g.owner not in removable:
            return None
        forced.append(owner)
    shares = list(g.shares.values())
    evictable = [a for a in shares if a.pod_uid in removable]
    keep = [a for a in shares if a.pod_uid not in removable]
    demand = demand_on(request, g.info, budgets)
    if not _fits(g, keep, demand, request, node, uid_isolation=budgets.uid_isolation):
        return None
    best: list[Allocation] | None = None
    orders = (
        sorted(evictable, key=lambda a: (-a.priority, a.threads, a.memory_mib, a.pod_uid)),
        sorted(evictable, key=lambda a: (a.threads, a.memory_mib, -a.priority, a.pod_uid)),
    )
    for order in orders:
        kept = list(keep)
        victims = list(forced)
        for a in order:
            if _fits(g, [*kept, a], demand, request, node, uid_isolation=budgets.uid_isolation):
                kept.append(a)
            else:
                victims.append(a)
        if best is None or _cost(victims, 0) < _cost(best, 0):
            best = victims
    return best


def select_victims(
    node: NodeUsage,
    request: ShareRequest,
    removable: Collection[str],
    budgets: BudgetSettings,
    *,
    allocation_of: Callable[[str], Allocation | None],
) -> list[Allocation] | None:
    """The allocations on `node`, drawn from `removable` (pod uids), whose eviction lets the
    request fit: an empty list when it fits already, None when no choice works."""
    if request.kind == "none":
        return []
    if request.kind == "whole":
        return _whole(node, request, removable, allocation_of)
    best: list[Allocation] | None = None
    best_cost: Cost | None = None
    for g in node.gpus:
        owner = allocation_of(g.owner) if g.owner is not None else None
        victims = _share_on_gpu(node, g, request, removable, owner, budgets)
        if victims is None:
            continue
        cost = _cost(victims, g.info.index)
        if best_cost is None or cost < best_cost:
            best, best_cost = victims, cost
    return best


def _whole(
    node: NodeUsage,
    request: ShareRequest,
    removable: Collection[str],
    allocation_of: Callable[[str], Allocation | None],
) -> list[Allocation] | None:
    options: list[tuple[Cost, list[Allocation]]] = []
    for g in node.gpus:
        if g.owner is not None:
            owner = allocation_of(g.owner)
            if owner is None or g.owner not in removable:
                continue
            pods = [owner]
        else:
            pods = list(g.shares.values())
            if any(a.pod_uid not in removable for a in pods):
                continue
        options.append((_cost(pods, g.info.index), pods))
    if len(options) < request.whole_gpus:
        return None
    options.sort(key=lambda o: o[0])
    victims: dict[str, Allocation] = {}
    for _, pods in options[: request.whole_gpus]:
        for a in pods:
            victims[a.pod_uid] = a
    return list(victims.values())


def node_victims(
    ledger: Ledger,
    node: str,
    request: ShareRequest,
    proposal: Sequence[str],
    budgets: BudgetSettings,
    *,
    extra: bool = False,
) -> list[str] | None:
    """The victims (uids) to answer for one node, or None to leave the node out.

    GPU victims are drawn from the scheduler's `proposal` (and, with `extra`, from every
    lower-priority GPU pod on the node, which the scheduler's dry run cannot see as useful):
    the fewest, lowest-priority ones that free room on one GPU. Proposed pods that hold no GPU
    on this node are kept (the scheduler evicts them for its own resources). When the GPUs
    hold the pod already, the scheduler's proposal is answered as it is."""
    usage = ledger.get_node(node)
    if usage is None:
        # No GPUs here: only a pod that asks for none can use the node.
        return list(proposal) if request.kind == "none" else None
    if usage.held_elsewhere and request.kind != "none":
        return None  # evicting mpsched's pods frees nothing while device-plugin pods hold GPUs
    holders = {u for u in proposal if (a := ledger.allocation(u)) is not None and a.node == node}
    removable = set(holders)
    if extra:
        for g in usage.gpus:
            owners = [g.owner] if g.owner is not None else list(g.shares)
            for uid in owners:
                alloc = ledger.allocation(uid)
                if alloc is not None and alloc.priority < request.priority:
                    removable.add(uid)
    chosen = select_victims(usage, request, removable, budgets, allocation_of=ledger.allocation)
    if chosen is None:
        return None
    if not chosen:
        return list(proposal)
    return [u for u in proposal if u not in holders] + [a.pod_uid for a in chosen]
