"""`packing.in_use`: the fraction of a GPU's SMs in use, and the cluster's sum."""

from __future__ import annotations

import pytest

from extender.packing.in_use import ClusterInUse, gpu_in_use
from extender.packing.ledger import GpuCapacity, GpuUsage
from extender.packing.model import ComputeCapability, GpuInfo

H100 = GpuInfo(0, "GPU-0", "H100", 81559, ComputeCapability(9, 0), 48, 4)


def usage(threads: int = 0, owner: str | None = None, capacity: int = 200) -> GpuUsage:
    return GpuUsage(H100, GpuCapacity(capacity, 80000, 48, 0), threads=threads, owner=owner)


@pytest.mark.parametrize(
    ("g", "fraction"),
    [
        (usage(), 0.0),
        (usage(threads=100), 0.5),  # 100 % of threads at x2.0: half the SMs
        (usage(threads=200), 1.0),
        (usage(threads=260), 1.0),  # over budget: still at most the whole GPU
        (usage(owner="uid"), 1.0),  # given out whole
        (usage(owner="uid", capacity=0), 1.0),  # whole, on a GPU that cannot be shared
    ],
)
def test_a_gpus_fraction_in_use(g: GpuUsage, fraction: float) -> None:
    assert gpu_in_use(g, oversubscription=2.0) == fraction


def test_the_cluster_sums_its_gpus_out_of_every_gpu() -> None:
    cluster = ClusterInUse(2.0)
    for g in (usage(threads=100), usage(owner="w", capacity=0), usage()):
        cluster.add(g)
    assert (cluster.gpus, cluster.used, cluster.percent) == (3, 1.5, 50.0)
    assert ClusterInUse(1.0).percent == 0.0
