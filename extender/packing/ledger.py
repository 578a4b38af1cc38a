"""The ledger: per-GPU budgets (threads, pinned memory, clients), whole-GPU ownership and UID
isolation, with assume / confirm / release of allocations and a check of its own invariants.

The ledger is the single source of truth the extender decides from. It is synchronous and does no
I/O; callers serialise access (the service holds one lock around check-and-assume).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from extender.packing.errors import BudgetExceeded, InvariantViolation, LedgerError, UnknownNode
from extender.packing.model import GpuInfo, NodeInventory
from extender.packing.request import ContainerDemand
from extender.packing.settings import BudgetSettings

AllocationKind = Literal["share", "whole"]
AllocationState = Literal["assumed", "confirmed"]


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A GPU named by both index (for env vars and NVML) and uuid (stable identity)."""

    index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class Allocation:
    """The decision for one pod: which GPU(s) and how much of each budget.

    For "share", threads/memory_mib/clients are the load on the single GPU in `gpus`. For
    "whole", every GPU in `gpus` is owned exclusively and the three figures are 0.
    """

    pod_uid: str
    namespace: str
    name: str
    node: str
    kind: AllocationKind
    gpus: tuple[GpuRef, ...]
    threads: int = 0
    memory_mib: int = 0
    clients: int = 0
    containers: tuple[ContainerDemand, ...] = ()
    run_as_user: int | None = None
    priority: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    """What one GPU can carry in total, derived from its inventory and the budget settings."""

    threads: int
    memory_mib: int
    clients: int
    client_overhead_mib: int

    def memory_left(self, memory_used: int, clients_used: int) -> int:
        return self.memory_mib - memory_used - clients_used * self.client_overhead_mib


@dataclass(slots=True)
class GpuUsage:
    """The running load on one GPU."""

    info: GpuInfo
    capacity: GpuCapacity
    threads: int = 0
    memory_mib: int = 0
    clients: int = 0
    #: pod_uid of the whole-GPU owner, if the GPU is given out whole.
    owner: str | None = None
    #: pod_uid → allocation, for every share on this GPU.
    shares: dict[str, Allocation] = field(default_factory=dict)
    #: runAsUser → number of shares with that UID (UID isolation: at most one key unless the
    #: node runs multi-user MPS).
    uids: dict[int | None, int] = field(default_factory=dict)

    @property
    def threads_free(self) -> int:
        return 0 if self.owner is not None else self.capacity.threads - self.threads

    @property
    def memory_free(self) -> int:
        if self.owner is not None:
            return 0
        return self.capacity.memory_left(self.memory_mib, self.clients)

    @property
    def clients_free(self) -> int:
        return 0 if self.owner is not None else self.capacity.clients - self.clients

    @property
    def idle(self) -> bool:
        return self.owner is None and not self.shares


@dataclass(slots=True)
class NodeUsage:
    """The inventory of one node and the usage of each of its GPUs, in index order."""

    inventory: NodeInventory
    gpus: list[GpuUsage]
    #: Bumped on every change to this node: callers key caches on (node, generation).
    generation: int = 0


def gpu_capacity(info: GpuInfo, budgets: BudgetSettings) -> GpuCapacity:
    """The budgets of one GPU (DESIGN §4). A GPU whose MPS is not ready, or a pre-Volta GPU in
    "whole-only" mode, has no share capacity (it can still be given out whole)."""
    shareable = info.mps == "ready" and (info.shareable or budgets.pre_volta == "share")
    if not shareable:
        return GpuCapacity(0, 0, 0, budgets.client_overhead_mib)
    return GpuCapacity(
        threads=budgets.thread_capacity(),
        memory_mib=max(0, info.memory_mib - budgets.memory_reserve_mib),
        clients=min(info.max_clients, budgets.max_clients_per_gpu or info.max_clients),
        client_overhead_mib=budgets.client_overhead_mib,
    )


class Ledger:
    """Per-GPU budgets for every node, and the allocations that use them.

    An allocation is *assumed* when the extender reserves it (before the cluster shows it) and
    *confirmed* once the pod's annotation is seen in the cluster. Both count against budgets.
    """

    def __init__(self, budgets: BudgetSettings) -> None:
        self.budgets = budgets
        self._nodes: dict[str, NodeUsage] = {}
        self._allocations: dict[str, Allocation] = {}
        self._states: dict[str, AllocationState] = {}

    # -- nodes -------------------------------------------------------------------------------

    def set_node(self, inventory: NodeInventory) -> list[Allocation]:
        """Add or replace a node's inventory. Allocations on GPUs that still exist are kept;
        those whose GPU vanished (or no longer fits) are dropped and returned."""
        old = self._nodes.get(inventory.name)
        usage = NodeUsage(
            inventory,
            [GpuUsage(g, gpu_capacity(g, self.budgets)) for g in inventory.gpus],
            generation=(old.generation + 1) if old else 0,
        )
        self._nodes[inventory.name] = usage
        dropped: list[Allocation] = []
        if old is not None:
            carried = [a for a in self._allocations.values() if a.node == inventory.name]
            for alloc in carried:
                del self._allocations[alloc.pod_uid]
                state = self._states.pop(alloc.pod_uid)
                try:
                    self._apply(alloc, state)
                except LedgerError:
                    dropped.append(alloc)
        return dropped

    def remove_node(self, name: str) -> list[Allocation]:
        """Forget a node and every allocation on it; return those allocations."""
        usage = self._nodes.pop(name, None)
        if usage is None:
            return []
        gone = [a for a in self._allocations.values() if a.node == name]
        for alloc in gone:
            self._forget(alloc.pod_uid)
        return gone

    def node(self, name: str) -> NodeUsage:
        try:
            return self._nodes[name]
        except KeyError:
            raise UnknownNode(f"node {name!r} has no GPU inventory") from None

    def get_node(self, name: str) -> NodeUsage | None:
        return self._nodes.get(name)

    def node_names(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    # -- allocations -------------------------------------------------------------------------

    def allocation(self, pod_uid: str) -> Allocation | None:
        return self._allocations.get(pod_uid)

    def state(self, pod_uid: str) -> AllocationState | None:
        return self._states.get(pod_uid)

    def allocations(self) -> Iterator[Allocation]:
        return iter(self._allocations.values())

    def assume(self, alloc: Allocation, *, confirmed: bool = False) -> None:
        """Reserve `alloc`. Re-assuming an identical allocation is a no-op (idempotent binds);
        a different allocation for a pod that already holds one is refused."""
        held = self._allocations.get(alloc.pod_uid)
        if held is not None:
            if held != alloc:
                raise LedgerError(
                    f"pod {alloc.key} already holds an allocation on node {held.node!r}"
                )
            if confirmed:
                self._states[alloc.pod_uid] = "confirmed"
            return
        self._apply(alloc, "confirmed" if confirmed else "assumed")

    def confirm(self, pod_uid: str) -> None:
        """The cluster now shows this allocation: it is no longer merely assumed."""
        if pod_uid not in self._allocations:
            raise LedgerError(f"no allocation for pod uid {pod_uid!r} to confirm")
        self._states[pod_uid] = "confirmed"

    def release(self, pod_uid: str) -> Allocation | None:
        """Give back a pod's share (pod terminal, deleted, or bind failed). Unknown → None."""
        alloc = self._allocations.get(pod_uid)
        if alloc is not None:
            self._forget(pod_uid)
        return alloc

    # -- internals ---------------------------------------------------------------------------

    def _apply(self, alloc: Allocation, state: AllocationState) -> None:
        node = self.node(alloc.node)
        targets: list[GpuUsage] = []
        for ref in alloc.gpus:
            if not 0 <= ref.index < len(node.gpus) or node.gpus[ref.index].info.uuid != ref.uuid:
                raise LedgerError(
                    f"node {alloc.node!r} has no GPU {ref.index} with uuid {ref.uuid}"
                )
            targets.append(node.gpus[ref.index])
        if len({t.info.uuid for t in targets}) != len(targets) or not targets:
            raise LedgerError(f"allocation for {alloc.key} names no GPU or a GPU twice")
        if alloc.kind == "whole":
            for g in targets:
                if not g.idle:
                    raise BudgetExceeded(f"GPU {g.info.index} on {alloc.node} is not idle")
            for g in targets:
                g.owner = alloc.pod_uid
        else:
            if len(targets) != 1:
                raise LedgerError(f"share allocation for {alloc.key} must name exactly one GPU")
            g = targets[0]
            problem = share_problem(
                g,
                alloc,
                multi_user=node.inventory.multi_user,
                uid_isolation=self.budgets.uid_isolation,
            )
            if problem:
                raise BudgetExceeded(f"GPU {g.info.index} on {alloc.node}: {problem.detail}")
            g.threads += alloc.threads
            g.memory_mib += alloc.memory_mib
            g.clients += alloc.clients
            g.shares[alloc.pod_uid] = alloc
            g.uids[alloc.run_as_user] = g.uids.get(alloc.run_as_user, 0) + 1
        node.generation += 1
        self._allocations[alloc.pod_uid] = alloc
        self._states[alloc.pod_uid] = state

    def _forget(self, pod_uid: str) -> None:
        alloc = self._allocations.pop(pod_uid)
        self._states.pop(pod_uid, None)
        node = self._nodes.get(alloc.node)
        if node is None:
            return
        for ref in alloc.gpus:
            g = node.gpus[ref.index]
            if alloc.kind == "whole":
                if g.owner == pod_uid:
                    g.owner = None
            elif g.shares.pop(pod_uid, None) is not None:
                g.threads -= alloc.threads
                g.memory_mib -= alloc.memory_mib
                g.clients -= alloc.clients
                left = g.uids[alloc.run_as_user] - 1
                if left:
                    g.uids[alloc.run_as_user] = left
                else:
                    del g.uids[alloc.run_as_user]
        node.generation += 1

    # -- invariants --------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Recompute every GPU's load from the allocations and compare; check every budget.
        Raises InvariantViolation describing the first broken rule."""
        seen: set[str] = set()
        for name, node in self._nodes.items():
            for g in node.gpus:
                where = f"{name} GPU {g.info.index}"
                t = sum(a.threads for a in g.shares.values())
                m = sum(a.memory_mib for a in g.shares.values())
                c = sum(a.clients for a in g.shares.values())
                if (t, m, c) != (g.threads, g.memory_mib, g.clients):
                    raise InvariantViolation(f"{where}: running totals drifted")
                if g.owner is not None and g.shares:
                    raise InvariantViolation(f"{where}: given out whole and shared at once")
                if g.threads > g.capacity.threads:
                    raise InvariantViolation(f"{where}: threads {g.threads} > {g.capacity.threads}")
                if g.clients > g.capacity.clients:
                    raise InvariantViolation(f"{where}: clients {g.clients} > {g.capacity.clients}")
                if g.capacity.memory_left(g.memory_mib, g.clients) < 0:
                    raise InvariantViolation(f"{where}: pinned memory over budget")
                real_uids = {a.run_as_user for a in g.shares.values()}
                if set(g.uids) != real_uids:
                    raise InvariantViolation(f"{where}: UID index drifted")
                if (
                    len(real_uids) > 1
                    and self.budgets.uid_isolation
                    and not node.inventory.multi_user
                ):
                    raise InvariantViolation(f"{where}: pods of several UIDs share one MPS server")
                for uid in [*g.shares, *([g.owner] if g.owner else [])]:
                    alloc = self._allocations.get(uid)
                    if alloc is None or alloc.node != name:
                        raise InvariantViolation(f"{where}: holds unknown pod {uid}")
                    seen.add(uid)
        if seen != set(self._allocations):
            raise InvariantViolation("allocations exist that no GPU carries")


@dataclass(frozen=True, slots=True)
class ShareProblem:
    """Why a share does not fit one GPU: a stable `cause` (for grouping and metrics) and a
    human `detail` with the figures."""

    cause: Literal["whole", "unshareable", "threads", "clients", "memory", "uid"]
    detail: str


def share_problem(
    g: GpuUsage, alloc: Allocation, *, multi_user: bool, uid_isolation: bool
) -> ShareProblem | None:
    """Why `alloc` (a share) cannot go on GPU `g`, or None if it fits every budget."""
    # Unshareable first: it is the lasting reason, and it decides "unresolvable".
    if g.capacity.threads == 0:
        return ShareProblem("unshareable", unshareable_detail(g.info))
    if g.owner is not None:
        return ShareProblem("whole", "given out whole")
    if g.threads + alloc.threads > g.capacity.threads:
        free = g.capacity.threads - g.threads
        return ShareProblem("threads", f"{free}% threads free, {alloc.threads}% needed")
    if g.clients + alloc.clients > g.capacity.clients:
        free = g.capacity.clients - g.clients
        return ShareProblem("clients", f"{free} MPS clients free, {alloc.clients} needed")
    left = g.capacity.memory_left(g.memory_mib, g.clients + alloc.clients)
    if left < alloc.memory_mib:
        return ShareProblem(
            "memory", f"{max(left, 0)} MiB pinned memory free, {alloc.memory_mib} MiB needed"
        )
    if uid_isolation and not multi_user and g.uids and alloc.run_as_user not in g.uids:
        other = next(iter(g.uids))
        return ShareProblem("uid", f"MPS server runs as UID {other}, pod as {alloc.run_as_user}")
    return None


def unshareable_detail(info: GpuInfo) -> str:
    """Why a GPU takes no shares at all."""
    if info.mps != "ready":
        return f"takes no shares (MPS is {info.mps})"
    if not info.shareable:
        return f"takes no shares (pre-Volta, compute capability {info.compute_capability})"
    return "takes no shares"
