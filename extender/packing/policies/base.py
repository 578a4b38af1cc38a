"""What a scoring policy sees and returns: the hashable node and pod views, the typical-pod
workload, the `Policy` protocol, and the canonical node form that makes score caching easy.

Units: CPU in millicores; GPU in thread percent (0..100 per GPU, 100 = a whole GPU). The FGD
paper counts GPU in milli (0..1000); one thread percent is 10 milli.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: Thread percent of one whole GPU.
WHOLE = 100


@dataclass(frozen=True, slots=True)
class NodeState:
    """What a policy sees of one node. Hashable, so callers can cache scores on it."""

    model: str
    #: Free CPU in millicores (use a large value when unknown).
    cpu_free_milli: int
    #: Free thread percentage 0..100 per GPU, in GPU index order; 0 for a GPU given out whole or
    #: unusable (no MPS client slot left, MPS down).
    gpu_free: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PodShape:
    """What a policy sees of one pod. Hashable."""

    cpu_milli: int
    #: Per-GPU thread percent: 1..99 a share, 100 whole GPUs, 0 CPU-only.
    threads: int
    #: 0 CPU-only, 1 for a share, k whole GPUs.
    gpus: int
    #: Allowed GPU models; empty = any.
    models: frozenset[str] = frozenset()

    @property
    def is_share(self) -> bool:
        return self.gpus == 1 and 0 < self.threads < WHOLE

    @property
    def gpu_demand(self) -> int:
        """Total thread percent asked across GPUs (a 2-GPU pod asks 200)."""
        return self.threads * self.gpus

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True, slots=True)
class TypicalPod:
    """One task type of the target workload and its share of all pods (popularities sum to 1)."""

    shape: PodShape
    popularity: float


Workload = tuple[TypicalPod, ...]


class Policy(Protocol):
    """A node scoring rule. Implementations are pure: same inputs, same answer."""

    @property
    def name(self) -> str:
        """The name `make_policy` knows it by."""
        ...

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        """Higher is better. `candidates` are the GPU indexes on which the pod fits on every
        budget (computed by the fit; for whole-GPU pods: the fully free GPUs, and the policy
        returns None as GPU). Returns (score, chosen GPU index for a share pod)."""
        ...


def canonical(node: NodeState) -> tuple[NodeState, tuple[int, ...]]:
    """The node with its GPUs sorted by free amount (ascending, ties by index), and `order`
    with order[i] = the real index of canonical GPU i. Every policy here scores a node by the
    multiset of its free amounts, so nodes that differ only in GPU order share one cache entry;
    map a chosen canonical index back with `order[i]`."""
    order = tuple(sorted(range(len(node.gpu_free)), key=node.gpu_free.__getitem__))
    if all(order[i] == i for i in range(len(order))):
        return node, order
    free = tuple(node.gpu_free[i] for i in order)
    return NodeState(node.model, node.cpu_free_milli, free), order


def share_candidates(node: NodeState, pod: PodShape) -> tuple[int, ...]:
    """GPU indexes whose free threads hold the pod, by the thread budget alone (the caller's
    fit also checks memory and clients); for whole-GPU pods, the fully free GPUs."""
    if pod.gpus == 0:
        return ()
    need = pod.threads if pod.is_share else WHOLE
    return tuple(i for i, f in enumerate(node.gpu_free) if f >= need)


def fits(node: NodeState, pod: PodShape, candidates: Sequence[int]) -> bool:
    """The pod fits on CPU, model and GPU count given these candidates."""
    if node.cpu_free_milli < pod.cpu_milli:
        return False
    if pod.gpus == 0:
        return True
    return pod.allows(node.model) and len(candidates) >= pod.gpus
