"""The usage the ledger keeps: allocations (which GPUs, how much of each budget), each GPU's
capacity and running load, and each node's GPUs; the rule of what puts a GPU over budget.

Plain data the ledger (`extender.packing.ledger`) owns and changes; everything else reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from extender.packing.model import GpuInfo, NodeInventory
from extender.packing.request import ContainerDemand
from extender.packing.settings import BudgetSettings

AllocationKind = Literal["share", "whole"]
#: "assumed": reserved by a bind not seen in the cluster yet; "in_doubt": its Binding was sent
#: and no answer came (it may have been applied); "confirmed": the cluster shows it.
AllocationState = Literal["assumed", "in_doubt", "confirmed"]


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
    #: Further whole-GPU owners the cluster shows on this GPU (recorded, never assumed): each
    #: one puts the GPU over budget.
    extra_owners: list[str] = field(default_factory=list)
    #: pod_uid → allocation, for every share on this GPU.
    shares: dict[str, Allocation] = field(default_factory=dict)
    #: runAsUser → number of shares with that UID, None for shares whose UID is unknown (UID
    #: isolation: at most one key, and None at most once, unless the node runs multi-user MPS).
    uids: dict[int | None, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return self.owner is None and not self.shares

    def over_budget(self, *, multi_user: bool, uid_isolation: bool) -> str | None:
        """Why what runs here exceeds a budget (threads, clients, pinned memory, one UID per
        MPS server, one whole owner), or None when it is within all."""
        cap = self.capacity
        if self.extra_owners:
            return f"given out whole to {1 + len(self.extra_owners)} pods"
        if self.owner is not None and self.shares:
            return "given out whole and shared at once"
        if not self.shares:
            return None
        if self.threads > cap.threads:
            return f"threads {self.threads}% > {cap.threads}%"
        if self.clients > cap.clients:
            return f"MPS clients {self.clients} > {cap.clients}"
        if cap.memory_left(self.memory_mib, self.clients) < 0:
            used = self.memory_mib + self.clients * cap.client_overhead_mib
            return f"pinned memory {used} MiB > {cap.memory_mib} MiB"
        if uid_isolation and not multi_user and uids_mixed(self.uids):
            return f"one MPS server shared by {self.uid_count()} UIDs (or UIDs not known)"
        return None

    def uid_count(self) -> int:
        """How many UIDs may run here: each share of unknown UID counts as one of its own."""
        uids = self.uids
        return len(uids) - 1 + uids[None] if None in uids else len(uids)


def uids_mixed(uids: dict[int | None, int]) -> bool:
    """Whether shares of `uids` (runAsUser → shares) may run as more than one UID: two UIDs,
    or two shares whose UID is not known (an unknown UID is never taken to be another's)."""
    return len(uids) > 1 or uids.get(None, 0) > 1


@dataclass(slots=True)
class NodeUsage:
    """The inventory of one node and the usage of each of its GPUs, in index order."""

    inventory: NodeInventory
    gpus: list[GpuUsage]
    #: Bumped on every change to this node: callers key caches on (node, generation).
    generation: int = 0
    #: GPUs that pods mpsched did not place hold through NVIDIA's device plugin
    #: (`nvidia.com/gpu`), which ones unknown: while any are held, nothing new goes here.
    held_elsewhere: int = 0
    #: GPU uuid → its index (and position in `gpus`): allocations find their GPUs by uuid.
    uuids: dict[str, int] = field(default_factory=dict)
    #: Pods whose allocation names a GPU this inventory does not show: while any are here,
    #: nothing new goes on the node (module docstring).
    unplaced: set[str] = field(default_factory=set)


def gpu_capacity(info: GpuInfo, budgets: BudgetSettings) -> GpuCapacity:
    """The budgets of one GPU (threads, pinned memory, MPS clients). A GPU whose MPS is not
    ready, a MIG-enabled GPU, or a pre-Volta GPU in "whole-only" mode, has no share capacity
    (it can still be given out whole)."""
    shareable = (
        info.mps == "ready" and not info.mig and (info.shareable or budgets.pre_volta == "share")
    )
    if not shareable:
        return GpuCapacity(0, 0, 0, budgets.client_overhead_mib)
    return GpuCapacity(
        threads=budgets.thread_capacity(),
        memory_mib=max(0, info.memory_mib - budgets.memory_reserve_mib),
        # Capped by configuration where the inventory was built (`model.client_limit`).
        clients=info.max_clients,
        client_overhead_mib=budgets.client_overhead_mib,
    )
