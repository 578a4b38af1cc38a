"""BestFit and its mirror Spread, as the FGD paper's simulator scores them: the node whose
CPU and GPU left over after placement is smallest (BestFit) or largest (Spread) wins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender.packing.policies.base import NodeState, PodShape

#: The simulator normalises leftovers by the largest node it knows: 128 cores and 8 GPUs
#: (8000 milli). Kept in the paper's milli units so that the integer scores, and hence the
#: ties, are the same as there.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000
MILLI_PER_THREAD = 10


def leftover(node: NodeState, pod: PodShape) -> float:
    """0.5 * CPU left / 128 cores + 0.5 * GPU left / 8 GPUs, after placing the pod."""
    gpu_left = sum(node.gpu_free) - pod.gpu_demand
    cpu_part = (node.cpu_free_milli - pod.cpu_milli) / MAX_CPU_MILLI * 0.5
    return cpu_part + gpu_left * MILLI_PER_THREAD / MAX_GPU_MILLI * 0.5


def tightest(node: NodeState, candidates: Sequence[int]) -> int | None:
    """The candidate with the least free threads (first index on ties)."""
    return min(candidates, key=lambda g: node.gpu_free[g], default=None)


def loosest(node: NodeState, candidates: Sequence[int]) -> int | None:
    """The candidate with the most free threads (first index on ties)."""
    return max(candidates, key=lambda g: node.gpu_free[g], default=None)


@dataclass(frozen=True, slots=True)
class BestFitPolicy:
    """int(100 * (1 - leftover)); a share takes the tightest GPU that holds it."""

    name: str = "bestfit"

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        gpu = tightest(node, candidates) if pod.is_share else None
        return float(int((1.0 - leftover(node, pod)) * 100)), gpu


@dataclass(frozen=True, slots=True)
class SpreadPolicy:
    """int(100 * leftover); a share takes the loosest GPU. Keeps headroom on every node at
    the price of fragmenting all of them: a baseline, not a recommendation."""

    name: str = "spread"

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        gpu = loosest(node, candidates) if pod.is_share else None
        return float(int(leftover(node, pod) * 100)), gpu
