"""What "in use" means for a GPU and for the cluster: the one definition `/status`, `mpsched
status`, the metrics and the dashboard all show.

A GPU's SMs in use, as a fraction 0..1 of the GPU: a GPU given out whole is fully in use; a
shared GPU's thread percentages are scaled back by the oversubscription (200 % of threads at
×2.0 is the whole GPU), at most the whole GPU. The cluster's figure is the sum over its GPUs,
in GPUs, out of the number of GPUs: a GPU that cannot be shared (MPS down, MIG, pre-Volta)
counts as a GPU like any other, in use when given out whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.packing.ledger import GpuUsage


def gpu_in_use(g: GpuUsage, *, oversubscription: float) -> float:
    """The fraction 0..1 of `g`'s SMs in use (module docstring)."""
    if g.owner is not None:
        return 1.0
    return min(1.0, g.threads / (100 * max(oversubscription, 1e-9)))


@dataclass(slots=True)
class ClusterInUse:
    """GPUs in use over the cluster, accumulated GPU by GPU."""

    oversubscription: float
    gpus: int = 0
    #: Σ gpu_in_use: GPUs' worth of SMs in use.
    used: float = 0.0

    def add(self, g: GpuUsage) -> float:
        """Count `g`; its own fraction in use."""
        fraction = gpu_in_use(g, oversubscription=self.oversubscription)
        self.gpus += 1
        self.used += fraction
        return fraction

    @property
    def percent(self) -> float:
        """The share of all GPUs' SMs in use, 0..100."""
        return 100.0 * self.used / self.gpus if self.gpus else 0.0
