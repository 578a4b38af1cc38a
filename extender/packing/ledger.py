"""The ledger: per-GPU budgets (threads, pinned memory, clients), whole-GPU ownership and UID
isolation, with assume / confirm / release of allocations and a check of its own invariants.

The ledger is the single source of truth the extender decides from. It is synchronous and does no
I/O; callers serialise access (the service holds one lock around check-and-assume).

Two ways in, for two kinds of truth (truth rule 1 of docs/design.md):

- `assume` is a *decision*: it checks every budget and refuses what does not fit;
- `record` is a *fact*: a pod the cluster shows bound with this allocation runs, so it counts
  as it is, even where that puts a GPU over a budget (the node's inventory changed, the budgets
  were lowered, an answer was lost). An over-budget GPU takes nothing new (every fit check
  refuses it) until enough of what runs there is gone; `over_budget()` names such GPUs.

Nothing that runs is dropped: an allocation whose node or GPU is not in the inventory (the node
is gone, its agent republished fewer GPUs) is kept *unplaced* and placed again, counted as it
is, as soon as the node shows that GPU again. Allocations find their GPUs by uuid: an index is
only where NVML enumerated the GPU when the allocation was made, and a reboot or a GPU gone
renumbers the rest while their pods run on. A node that shows an inventory but holds an
allocation it cannot place takes nothing new (`NodeUsage.unplaced`): that pod runs on one of
its GPUs, which one is unknown, so no GPU of the node can be known to have room.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from extender.packing.errors import BudgetExceeded, InvariantViolation, LedgerError, UnknownNode
from extender.packing.model import NVML_UUID_PREFIXES, GpuInfo, NodeInventory
from extender.packing.settings import BudgetSettings
from extender.packing.usage import (
    Allocation,
    AllocationKind,
    AllocationState,
    GpuCapacity,
    GpuRef,
    GpuUsage,
    NodeUsage,
    gpu_capacity,
    uids_mixed,
)

#: The usage types are the ledger's vocabulary: callers import them from here.
__all__ = [
    "Allocation",
    "AllocationKind",
    "AllocationState",
    "GpuCapacity",
    "GpuRef",
    "GpuUsage",
    "Ledger",
    "NodeUsage",
    "ShareCause",
    "ShareProblem",
    "gpu_capacity",
    "share_cause",
    "share_problem",
    "unplaced_reason",
    "unshareable_detail",
]


class Ledger:
    """Per-GPU budgets for every node, and the allocations that use them.

    An allocation is *assumed* when the extender reserves it (before the cluster shows it), *in
    doubt* while nobody knows whether its Binding was applied, and *confirmed* once the pod's
    annotation is seen in the cluster. All three count against budgets.
    """

    def __init__(self, budgets: BudgetSettings) -> None:
        self.budgets = budgets
        self._nodes: dict[str, NodeUsage] = {}
        self._allocations: dict[str, Allocation] = {}
        self._states: dict[str, AllocationState] = {}
        #: Allocations that load their GPUs now (the others wait for their node or GPU).
        self._placed: set[str] = set()

    # -- nodes -------------------------------------------------------------------------------

    def set_node(self, inventory: NodeInventory) -> list[Allocation]:
        """Add or replace a node's inventory. Every allocation on the node is placed again as
        it is, within budget or not; those whose GPU is not in the new inventory stay unplaced
        and are returned."""
        old = self._nodes.get(inventory.name)
        usage = NodeUsage(
            inventory,
            [GpuUsage(g, gpu_capacity(g, self.budgets)) for g in inventory.gpus],
            generation=(old.generation + 1) if old else 0,
            held_elsewhere=old.held_elsewhere if old else 0,
            uuids={g.uuid: i for i, g in enumerate(inventory.gpus)},
        )
        self._nodes[inventory.name] = usage
        unplaced: list[Allocation] = []
        for alloc in self._allocations.values():
            if alloc.node != inventory.name:
                continue
            self._placed.discard(alloc.pod_uid)
            if not self._load(alloc, usage):
                unplaced.append(alloc)
                usage.unplaced.add(alloc.pod_uid)
        return unplaced

    def hold_elsewhere(self, name: str, gpus: int) -> bool:
        """Record how many of the node's GPUs device-plugin pods hold; whether it changed."""
        node = self._nodes.get(name)
        if node is None or node.held_elsewhere == gpus:
            return False
        node.held_elsewhere = gpus
        node.generation += 1
        return True

    def remove_node(self, name: str) -> list[Allocation]:
        """Forget a node's inventory. Its allocations stay (the pods still run), unplaced until
        the node returns; they are returned."""
        usage = self._nodes.pop(name, None)
        if usage is None:
            return []
        gone = [a for a in self._allocations.values() if a.node == name]
        for alloc in gone:
            self._placed.discard(alloc.pod_uid)
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
        """Every allocation counted, placed or not."""
        return iter(self._allocations.values())

    def unplaced(self) -> Iterator[Allocation]:
        """Allocations whose node or GPU the inventory does not show (yet)."""
        return (a for u, a in self._allocations.items() if u not in self._placed)

    def assume(self, alloc: Allocation, *, confirmed: bool = False) -> None:
        """Reserve `alloc`, checking every budget. Re-assuming an identical allocation is a
        no-op (idempotent binds); a different allocation for a pod that already holds one is
        refused, and so is anything that does not fit (nothing is half-applied)."""
        held = self._allocations.get(alloc.pod_uid)
        if held is not None:
            if held != alloc:
                raise LedgerError(
                    f"pod {alloc.key} already holds an allocation on node {held.node!r}"
                )
            if confirmed:
                self._states[alloc.pod_uid] = "confirmed"
            return
        node = self.node(alloc.node)
        if node.unplaced:
            raise BudgetExceeded(f"{alloc.node}: {unplaced_reason(len(node.unplaced))}")
        targets = self._targets(alloc, node)
        if alloc.kind == "whole":
            for g in targets:
                if not g.idle:
                    raise BudgetExceeded(f"GPU {g.info.index} on {alloc.node} is not idle")
        else:
            problem = share_problem(
                targets[0],
                alloc,
                multi_user=node.inventory.multi_user,
                uid_isolation=self.budgets.uid_isolation,
            )
            if problem:
                raise BudgetExceeded(
                    f"GPU {targets[0].info.index} on {alloc.node}: {problem.detail}"
                )
        self._allocations[alloc.pod_uid] = alloc
        self._states[alloc.pod_uid] = "confirmed" if confirmed else "assumed"
        self._apply(alloc, node, targets)

    def record(self, alloc: Allocation, *, state: AllocationState = "confirmed") -> bool:
        """Count `alloc` as running, whatever the budgets say (module docstring); `state` is
        "confirmed" for what the cluster shows (a reservation carried from an older ledger keeps
        its own). A different allocation held for the pod is replaced. Returns whether it is
        placed on its GPUs (False: its node or GPU is not in the inventory now; it stays
        counted)."""
        held = self._allocations.get(alloc.pod_uid)
        if held is not None and held != alloc:
            self._forget(alloc.pod_uid)
            held = None
        self._states[alloc.pod_uid] = state
        if held is not None:
            return alloc.pod_uid in self._placed
        self._allocations[alloc.pod_uid] = alloc
        node = self._nodes.get(alloc.node)
        if node is None:
            return False
        if self._load(alloc, node):
            return True
        node.unplaced.add(alloc.pod_uid)
        node.generation += 1
        return False

    def confirm(self, pod_uid: str) -> None:
        """The cluster now shows this allocation: it is no longer merely assumed."""
        if pod_uid not in self._allocations:
            raise LedgerError(f"no allocation for pod uid {pod_uid!r} to confirm")
        self._states[pod_uid] = "confirmed"

    def doubt(self, pod_uid: str) -> None:
        """Its Binding was sent and no answer came: keep it counted until someone knows."""
        if self._states.get(pod_uid) == "assumed":
            self._states[pod_uid] = "in_doubt"

    def release(self, pod_uid: str) -> Allocation | None:
        """Give back a pod's share (pod terminal, deleted, or bind failed). Unknown → None."""
        alloc = self._allocations.get(pod_uid)
        if alloc is not None:
            self._forget(pod_uid)
        return alloc

    def over_budget(self) -> Iterator[tuple[str, GpuUsage, str]]:
        """(node, GPU, why) for every GPU whose running load exceeds a budget."""
        for name, node in self._nodes.items():
            for g in node.gpus:
                why = g.over_budget(
                    multi_user=node.inventory.multi_user,
                    uid_isolation=self.budgets.uid_isolation,
                )
                if why is not None:
                    yield name, g, why

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _targets(alloc: Allocation, node: NodeUsage) -> list[GpuUsage]:
        """The GPUs `alloc` names, found by uuid in the inventory (whatever index the node
        gives them now). Raises LedgerError."""
        targets: list[GpuUsage] = []
        for ref in alloc.gpus:
            at = _position(ref, node)
            if at is None:
                raise LedgerError(f"node {alloc.node!r} has no GPU with uuid {ref.uuid}")
            targets.append(node.gpus[at])
        if len({t.info.uuid for t in targets}) != len(targets) or not targets:
            raise LedgerError(f"allocation for {alloc.key} names no GPU or a GPU twice")
        if alloc.kind == "share" and len(targets) != 1:
            raise LedgerError(f"share allocation for {alloc.key} must name exactly one GPU")
        return targets

    def _load(self, alloc: Allocation, node: NodeUsage) -> bool:
        """Place a counted allocation on its GPUs without a budget check; False when the node
        does not show them."""
        try:
            targets = self._targets(alloc, node)
        except LedgerError:
            return False
        self._apply(alloc, node, targets)
        return True

    def _apply(self, alloc: Allocation, node: NodeUsage, targets: list[GpuUsage]) -> None:
        if alloc.kind == "whole":
            for g in targets:
                if g.owner is None:
                    g.owner = alloc.pod_uid
                else:
                    g.extra_owners.append(alloc.pod_uid)
        else:
            g = targets[0]
            g.threads += alloc.threads
            g.memory_mib += alloc.memory_mib
            g.clients += alloc.clients
            g.shares[alloc.pod_uid] = alloc
            g.uids[alloc.run_as_user] = g.uids.get(alloc.run_as_user, 0) + 1
        node.generation += 1
        self._placed.add(alloc.pod_uid)

    def _forget(self, pod_uid: str) -> None:
        alloc = self._allocations.pop(pod_uid)
        self._states.pop(pod_uid, None)
        if pod_uid not in self._placed:
            node_of = self._nodes.get(alloc.node)
            if node_of is not None and pod_uid in node_of.unplaced:
                node_of.unplaced.discard(pod_uid)
                node_of.generation += 1
            return
        self._placed.discard(pod_uid)
        node = self._nodes[alloc.node]
        for ref in alloc.gpus:
            at = _position(ref, node)
            assert at is not None  # placed: the inventory has not changed since
            g = node.gpus[at]
            if alloc.kind == "whole":
                if g.owner == pod_uid:
                    g.owner = g.extra_owners.pop(0) if g.extra_owners else None
                elif pod_uid in g.extra_owners:
                    g.extra_owners.remove(pod_uid)
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
        """Recompute every GPU's load from the allocations and compare. Budgets may be exceeded
        only by what was recorded (over_budget says where); the bookkeeping must always agree.
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
                if g.extra_owners and g.owner is None:
                    raise InvariantViolation(f"{where}: extra whole owners without an owner")
                real_uids = {a.run_as_user for a in g.shares.values()}
                if set(g.uids) != real_uids:
                    raise InvariantViolation(f"{where}: UID index drifted")
                owners = [g.owner] if g.owner else []
                for uid in [*g.shares, *owners, *g.extra_owners]:
                    alloc = self._allocations.get(uid)
                    if alloc is None or alloc.node != name:
                        raise InvariantViolation(f"{where}: holds unknown pod {uid}")
                    seen.add(uid)
            for uid in node.unplaced:
                alloc = self._allocations.get(uid)
                if alloc is None or alloc.node != name or uid in self._placed:
                    raise InvariantViolation(f"{name}: unplaced pod {uid} is not unplaced here")
        if seen != self._placed:
            raise InvariantViolation("placed allocations and GPU loads disagree")
        if not self._placed <= set(self._allocations):
            raise InvariantViolation("a placed allocation is not counted")


def _position(ref: GpuRef, node: NodeUsage) -> int | None:
    """Where in `node.gpus` the GPU `ref` names is: found by uuid, or None."""
    at = node.uuids.get(ref.uuid)
    if at is None and not ref.uuid.startswith(NVML_UUID_PREFIXES):
        # A stand-in uuid (an inventory from node labels): the pod was given its GPU by index
        # (`codec.device_ids`), so the index is what holds.
        at = ref.index if 0 <= ref.index < len(node.gpus) else None
    return at


#: What keeps a share off one GPU (a stable name, for grouping reasons and for metrics).
ShareCause = Literal["whole", "unshareable", "threads", "clients", "memory", "uid"]


@dataclass(frozen=True, slots=True)
class ShareProblem:
    """Why a share does not fit one GPU: a stable `cause` (for grouping and metrics) and a
    human `detail` with the figures."""

    cause: ShareCause
    detail: str


def share_cause(
    g: GpuUsage,
    threads: int,
    memory_mib: int,
    clients: int,
    run_as_user: int | None,
    *,
    multi_user: bool,
    uid_isolation: bool,
) -> ShareCause | None:
    """The share fit: which budget keeps a share of `threads` %, `memory_mib` pinned MiB and
    `clients` MPS clients, running as `run_as_user`, off GPU `g`, or None if it fits every
    one. The one definition of the rule: the ledger's check (`share_problem` adds the
    figures), the fit of every candidate node (`fit.fit_node`), the policy's free share
    (`view.gpu_free`) and the compiled build's C fit (`_native.c`, held to this by
    tests/packing/test_native.py) all decide by it."""
    cap = g.capacity
    # Unshareable first: it is the lasting reason, and it decides "unresolvable".
    if cap.threads == 0:
        return "unshareable"
    if g.owner is not None:
        return "whole"
    uids = g.uids
    if uid_isolation and not multi_user and uids_mixed(uids):
        # Over budget already (recorded, never assumed): nothing new until it is not.
        return "uid"
    if g.threads + threads > cap.threads:
        return "threads"
    if g.clients + clients > cap.clients:
        return "clients"
    if cap.memory_left(g.memory_mib, g.clients + clients) < memory_mib:
        return "memory"
    # A share whose UID is unknown (no runAsUser: the image's user) shares with nobody: it
    # may be any UID, and one MPS server serves one (docs/requesting-gpu-shares.md).
    if (
        uid_isolation
        and not multi_user
        and uids
        and (run_as_user is None or run_as_user not in uids)
    ):
        return "uid"
    return None


def share_problem(
    g: GpuUsage, alloc: Allocation, *, multi_user: bool, uid_isolation: bool
) -> ShareProblem | None:
    """Why `alloc` (a share) cannot go on GPU `g`, or None if it fits every budget."""
    cause = share_cause(
        g, alloc.threads, alloc.memory_mib, alloc.clients, alloc.run_as_user,
        multi_user=multi_user, uid_isolation=uid_isolation,
    )  # fmt: skip
    return None if cause is None else ShareProblem(cause, _share_detail(cause, g, alloc))


def _share_detail(cause: ShareCause, g: GpuUsage, alloc: Allocation) -> str:
    cap = g.capacity
    if cause == "unshareable":
        return unshareable_detail(g.info)
    if cause == "whole":
        return "given out whole"
    if cause == "uid":
        if uids_mixed(g.uids):
            return f"one MPS server shared by {g.uid_count()} UIDs (over budget)"
        server, pod = next(iter(g.uids)), alloc.run_as_user
        return (
            f"MPS server runs as UID {'unknown' if server is None else server}, pod as "
            f"{'unknown (no runAsUser)' if pod is None else pod}"
        )
    if cause == "threads":
        return f"{cap.threads - g.threads}% threads free, {alloc.threads}% needed"
    if cause == "clients":
        return f"{cap.clients - g.clients} MPS clients free, {alloc.clients} needed"
    left = cap.memory_left(g.memory_mib, g.clients + alloc.clients)
    return f"{max(left, 0)} MiB pinned memory free, {alloc.memory_mib} MiB needed"


def unplaced_reason(pods: int) -> str:
    """Why a node whose inventory lacks a GPU an allocation names takes nothing new. It names
    no node: a node's fit reason is kept for every node in the same state."""
    return (
        f"{pods} running pod(s) hold GPUs of the node that its inventory does not show (by "
        "uuid): nothing new is placed here until the node shows them again or the pods end"
    )


def unshareable_detail(info: GpuInfo) -> str:
    """Why a GPU takes no shares at all."""
    if info.mig:
        return "takes no shares (MIG is enabled)"
    if info.mps != "ready":
        return f"takes no shares (MPS is {info.mps})"
    if not info.shareable:
        return f"takes no shares (pre-Volta, compute capability {info.compute_capability})"
    return "takes no shares"
