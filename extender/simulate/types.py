"""The simulator's view of a cluster: nodes with their GPU inventory and NodeResourcesFit
capacity, pods with their share request and the shape a policy scores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from extender.packing.model import NodeInventory
from extender.packing.policies import PodShape
from extender.packing.request import ShareRequest

#: The UID a trace's share pods run as. A trace names no users; its pods are taken as one
#: tenant's, packed together as in the cluster traced (under UID isolation a pod whose UID is
#: unknown shares no GPU, which would not replay the trace).
TRACE_USER: Final = 1000


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node: allocatable CPU (millicores) and memory (MiB), and its GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    inventory: NodeInventory

    @property
    def model(self) -> str:
        """The node's GPU model (the first GPU's; a node without GPUs has "")."""
        return self.inventory.gpus[0].model if self.inventory.gpus else ""


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod: CPU/memory requests, the GPU request the ledger books, and the policy's view."""

    name: str
    cpu_milli: int
    memory_mib: int
    shape: PodShape
    request: ShareRequest


@dataclass(frozen=True, slots=True)
class Cluster:
    """A replayable input: the nodes (in file order) and the original pods (in file order)."""

    nodes: tuple[SimNode, ...]
    pods: tuple[SimPod, ...]

    @property
    def gpu_capacity(self) -> int:
        """Thread percent of every GPU together (100 per GPU)."""
        return 100 * sum(len(n.inventory.gpus) for n in self.nodes)


class TraceError(Exception):
    """An input file cannot be read or has a bad row; the message names file and line."""
