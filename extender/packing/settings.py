"""Settings the packing core reads: one frozen dataclass per concern, each field with its unit
and the reason for its default. `extender.config` builds these from the YAML document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

PreVoltaMode = Literal["whole-only", "share"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetSettings:
    """The three per-GPU budgets: threads, pinned memory, MPS clients."""

    #: Σ thread percentage allowed per GPU, as a multiple of 100 (1.0 → 100 %). Default 1.0 so
    #: that each pod's SM share is really available to it; >1 lets MPS's load balancer overlap
    #: clients (NVIDIA suggests up to 2.0 for bursty clients) at the cost of that guarantee.
    oversubscription: float = 1.0
    #: MiB per GPU kept out of the pinned-memory budget for the MPS server and driver. 256 MiB
    #: covers an MPS server's own context on current drivers with a margin.
    memory_reserve_mib: int = 256
    #: MiB charged per MPS client on top of its pinned limit. 0 because the pinned limit already
    #: counts CUDA's internal allocations of the client (MPS doc §2.3.5.4); raise it for drivers
    #: that allocate outside the limit.
    client_overhead_mib: int = 0
    #: Cap on MPS clients per GPU below the architecture limit (48 / 16); None = no cap.
    max_clients_per_gpu: int | None = None
    #: Volta+ GPUs whose driver supports CUDA 13.1 or newer serve 60 MPS clients instead of 48
    #: (as reported for newer drivers). False until checked on a real GPU: 48 is the documented
    #: limit, and a budget above the real one fails context creation in the client over it.
    clients_cuda131: bool = False
    #: Pre-Volta GPUs cannot enforce thread or memory limits (MPS doc §1.7): by default they take
    #: only whole-GPU pods. "share" packs them anyway (limits then are advisory only).
    pre_volta: PreVoltaMode = "whole-only"
    #: Share units per GPU (U) when neither the inventory nor a node label says.
    default_units: int = 4
    #: Given only threads (or only memory), derive the other proportionally to the GPU's
    #: pinnable memory. False leaves the missing one at 0 (memory) or rejects (threads).
    proportional: bool = True
    #: Pods of different effective runAsUser never share a GPU unless the node runs MPS in
    #: multi-user mode: one MPS server serves one UID and others would wait (MPS doc §2.3.1.1).
    uid_isolation: bool = True

    def thread_capacity(self) -> int:
        """Σ thread percentage one GPU may carry."""
        return round(100 * self.oversubscription)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSelection:
    """Which nodes the core schedules onto, and which of them run MPS for many UIDs."""

    #: Only nodes whose labels include all of these. Empty: every node with a GPU inventory
    #: (nodes without one never fit GPU pods anyway).
    selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Nodes whose labels include all of these run MPS multi-user (any UID shares a server).
    #: None: none do, because in multi-user mode one user's fault kills every other user's
    #: clients (MPS doc §3.3.1).
    multi_user_selector: Mapping[str, str] | None = None

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector.items())

    def multi_user(self, labels: Mapping[str, str]) -> bool:
        chosen = self.multi_user_selector
        return bool(chosen) and all(labels.get(k) == v for k, v in (chosen or {}).items())
