"""The typical-pod workload the fragmentation-aware policies score against, learned from the
pods in the cluster (FGD's "target workload": shape frequencies, the top ones covering 95 %).

Owns the default used before any pod is seen and the rule for when a newly learned workload
is different enough to replace the one in force: a replacement empties every score cache, so
it is worth doing only when the mix really moved, not on every pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from extender.packing.policies import NodeTypes, PodShape, TypicalPod, Workload

#: Before the cluster shows any pod: a spread of common asks (quarter, half and whole GPUs,
#: some CPU-only pods), so that FGD still prefers packing to scattering.
DEFAULT_WORKLOAD: Final[Workload] = (
    TypicalPod(PodShape(1000, 25, 1), 0.3),
    TypicalPod(PodShape(2000, 50, 1), 0.3),
    TypicalPod(PodShape(4000, 100, 1), 0.3),
    TypicalPod(PodShape(1000, 0, 0), 0.1),
)
#: Popularity change (absolute) of any one shape that counts as a different workload.
POPULARITY_TOLERANCE: Final = 0.05
#: Change of any one node type's share of the cluster's GPUs (absolute) that counts as a
#: different cluster for the policy's arrival weights: a node or two joining or leaving a
#: large cluster must not empty every score cache.
CAPACITY_TOLERANCE: Final = 0.02


@dataclass(frozen=True, slots=True)
class Learned:
    """What the pods known say: the typical workload the policies measure against, and every
    shape with its share of the pods (`all_shapes`), which the pinned loads are computed from."""

    typical: Workload
    demand: Workload


def materially_different(old: Workload, new: Workload) -> bool:
    """True when the shapes differ or a popularity moved by more than the tolerance."""
    a = {t.shape: t.popularity for t in old}
    b = {t.shape: t.popularity for t in new}
    if a.keys() != b.keys():
        return True
    return any(abs(a[s] - b[s]) > POPULARITY_TOLERANCE for s in a)


def _gpu_shares(types: NodeTypes) -> dict[tuple[str, int], float]:
    total = sum(t.capacity for t in types) or 1
    return {t.key: t.capacity / total for t in types}


def types_materially_different(old: NodeTypes, new: NodeTypes) -> bool:
    """True when a node type appeared or went, its largest CPU changed, or its share of the
    cluster's GPUs moved by more than the tolerance."""
    if {(t.key, t.cpu_milli) for t in old} != {(t.key, t.cpu_milli) for t in new}:
        return True
    a, b = _gpu_shares(old), _gpu_shares(new)
    return any(abs(a[k] - b[k]) > CAPACITY_TOLERANCE for k in a)
