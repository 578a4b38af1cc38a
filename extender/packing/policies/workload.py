"""The typical-pod workload a fragmentation-aware policy measures nodes against, computed from a
sample of pod shapes the way the FGD paper does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from extender.packing.policies.base import PodShape, TypicalPod, Workload

#: Kubernetes counts a container without a CPU request as 100m when scoring (the "non-zero"
#: default); the paper's typical pods do the same.
NONZERO_CPU_MILLI = 100


def typical_workload(shapes: Iterable[PodShape], *, coverage: float = 0.95) -> Workload:
    """Group identical shapes, keep the most frequent ones until they cover at least `coverage`
    of all pods, and renormalise their frequencies to sum to 1.

    Ties in frequency are ordered by (cpu, threads, gpus, models), larger first, as the
    paper's simulator sorts them; CPU 0 counts as 100m. An empty sample gives an empty workload.
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    counts = Counter(
        PodShape(s.cpu_milli or NONZERO_CPU_MILLI, s.threads, s.gpus, s.models) for s in shapes
    )
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(
        counts.items(),
        key=lambda kv: (kv[1], kv[0].cpu_milli, kv[0].threads, kv[0].gpus, sorted(kv[0].models)),
        reverse=True,
    )
    kept: list[tuple[PodShape, int]] = []
    covered = 0
    for shape, n in ranked:
        if covered >= coverage * total:
            break
        kept.append((shape, n))
        covered += n
    return tuple(TypicalPod(shape, n / covered) for shape, n in kept)


def all_shapes(shapes: Iterable[PodShape]) -> Workload:
    """Every shape of the sample with its share of the pods (`typical_workload` without the
    cut): what pinned pods ask in all, rare shapes included."""
    return typical_workload(shapes, coverage=1.0)
