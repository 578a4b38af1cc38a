"""The records around the decision state: the watch event it applies, what one `apply` reports,
what it remembers of each non-terminal pod, and the settings a state is built from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.packing.ledger import Allocation
from extender.packing.notices import Notice
from extender.packing.parsing import ParsedPod
from extender.packing.policies import PodShape, PolicySettings
from extender.packing.settings import BudgetSettings, NodeSelection


class ObjectEvent(Protocol):
    """One change to a Node or Pod, as a watch delivers it (`extender.cluster.ClusterEvent`)."""

    @property
    def type(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def obj(self) -> Mapping[str, Any]: ...


@dataclass(slots=True)
class Applied:
    """What one `apply` changed: the nodes whose decisions may differ now, and notices."""

    touched: set[str] = field(default_factory=set)
    notices: list[Notice] = field(default_factory=list)


@dataclass(slots=True)
class PodRecord:
    """What the state remembers of one non-terminal pod."""

    namespace: str
    name: str
    node: str | None
    cpu_milli: int
    priority: int
    #: The pod's shape for the typical-pod workload; None when its request is invalid.
    shape: PodShape | None
    #: The allocation first seen on the bound pod, and its annotation text as seen then:
    #: immutable for the pod's life (rule 2).
    allocation: Allocation | None = None
    allocation_text: str | None = None
    #: The last annotation text reported as a change (to report each change once).
    reported_text: str | None = None
    #: The pod's request as the API server has it (pending pods only): what /bind decides
    #: from, never a request body (truth rule 4 of docs/design.md).
    parsed: ParsedPod | None = None
    #: Whole GPUs it holds through NVIDIA's device plugin (`nvidia.com/gpu`), not mpsched.
    plugin_gpus: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StateSettings:
    """Everything a decision state is built from; equal settings make equal decisions."""

    budgets: BudgetSettings
    selection: NodeSelection
    policy: PolicySettings
