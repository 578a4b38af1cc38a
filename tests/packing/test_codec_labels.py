"""Inventory derived from GPU Feature Discovery and GKE node labels."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.packing.codec import inventory_from_labels
from extender.packing.codec_labels import GKE_ACCELERATORS
from extender.packing.errors import CodecError
from extender.packing.model import ComputeCapability
from extender.packing.settings import BudgetSettings

B = BudgetSettings()
GFD = {
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/gpu.product": "Tesla-T4-SHARED",
    "nvidia.com/gpu.replicas": "8",
    "nvidia.com/gpu.sharing-strategy": "mps",
}


def test_gfd_labels() -> None:
    inv = inventory_from_labels("n1", GFD, budgets=B)
    assert inv is not None
    assert [g.uuid for g in inv.gpus] == ["n1-gpu0", "n1-gpu1"]
    g = inv.gpus[1]
    assert (g.index, g.model, g.memory_mib, g.compute_capability) == (
        1,
        "Tesla-T4",
        15360,
        ComputeCapability(7, 5),
    )
    assert (g.max_clients, g.units, g.mps) == (48, 8, "ready")
    assert dict(inv.labels) == GFD


def test_gfd_without_mps_sharing_gives_gpus_with_mps_off() -> None:
    labels = {k: v for k, v in GFD.items() if k != "nvidia.com/gpu.sharing-strategy"}
    inv = inventory_from_labels("n1", labels, budgets=B)
    assert inv is not None and {g.mps for g in inv.gpus} == {"off"}
    inv = inventory_from_labels("n1", {**labels, "nvidia.com/mps.capable": "true"}, budgets=B)
    assert inv is not None and {g.mps for g in inv.gpus} == {"ready"}


def test_gfd_pre_volta_and_client_cap() -> None:
    labels = {**GFD, "nvidia.com/gpu.compute.major": "6", "nvidia.com/gpu.compute.minor": "0"}
    inv = inventory_from_labels("n", labels, budgets=B)
    assert inv is not None and inv.gpus[0].max_clients == 16
    inv = inventory_from_labels("n", GFD, budgets=BudgetSettings(max_clients_per_gpu=5))
    assert inv is not None and inv.gpus[0].max_clients == 5


def test_gke_labels_with_capacity() -> None:
    labels = {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "cloud.google.com/gke-gpu-sharing-strategy": "mps",
        "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
    }
    inv = inventory_from_labels("g1", labels, budgets=B, capacity={"nvidia.com/gpu": "8"})
    assert inv is not None
    assert len(inv.gpus) == 2  # 8 advertised devices / 4 clients per GPU
    g = inv.gpus[0]
    assert (g.model, g.memory_mib, str(g.compute_capability), g.units, g.mps) == (
        "NVIDIA L4",
        23034,
        "8.9",
        4,
        "ready",
    )


def test_gke_without_sharing_counts_gpus_directly() -> None:
    labels = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    inv = inventory_from_labels("g", labels, budgets=B, capacity={"nvidia.com/gpu": 4})
    assert inv is not None and len(inv.gpus) == 4 and inv.gpus[0].mps == "off"
    assert inv.gpus[0].units == B.default_units


def test_gke_needs_a_known_accelerator_and_a_count() -> None:
    known = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert inventory_from_labels("g", known, budgets=B) is None  # no count anywhere
    assert inventory_from_labels("g", known, budgets=B, capacity={"nvidia.com/gpu": "x"}) is None
    unknown = {"cloud.google.com/gke-accelerator": "nvidia-quantum-9000"}
    assert inventory_from_labels("g", unknown, budgets=B, capacity={"nvidia.com/gpu": "1"}) is None


def test_the_accelerator_table_covers_the_usual_gke_gpus() -> None:
    for name in (
        "nvidia-tesla-t4",
        "nvidia-l4",
        "nvidia-tesla-a100",
        "nvidia-a100-80gb",
        "nvidia-h100-80gb",
        "nvidia-tesla-v100",
        "nvidia-tesla-p100",
    ):
        assert name in GKE_ACCELERATORS
    assert GKE_ACCELERATORS["nvidia-a100-80gb"].memory_mib == 81920
    assert str(GKE_ACCELERATORS["nvidia-tesla-v100"].compute_capability) == "7.0"


def test_nodes_without_gpu_labels_have_no_inventory() -> None:
    assert inventory_from_labels("n", {}, budgets=B) is None
    assert inventory_from_labels("n", {"kubernetes.io/os": "linux"}, budgets=B) is None
    assert inventory_from_labels("n", {**GFD, "nvidia.com/gpu.count": "0"}, budgets=B) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nvidia.com/gpu.count", "100000"),
        ("nvidia.com/gpu.count", "65"),
        ("nvidia.com/gpu.memory", "999999999"),
        ("nvidia.com/gpu.memory", "18446744073709551616"),
        ("nvidia.com/gpu.compute.major", "100"),
        ("nvidia.com/gpu.compute.minor", "4294967296"),
        ("nvidia.com/gpu.replicas", "49"),
        ("cloud.google.com/gke-max-shared-clients-per-gpu", "1000000"),
    ],
)
def test_a_label_out_of_its_range_refuses_the_inventory(key: str, value: str) -> None:
    """Before: a 9-digit memory label built GPUs of 954 TiB, longer values were ignored."""
    with pytest.raises(CodecError, match=re.escape(key)):
        inventory_from_labels("n", {**GFD, key: value}, budgets=B)
    # Not a number at all: ignored, as any label that is not ours (GFD reads as without it).
    assert inventory_from_labels("n", {**GFD, "nvidia.com/gpu.replicas": "x"}, budgets=B)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                *GFD,
                "cloud.google.com/gke-accelerator",
                "cloud.google.com/gke-gpu-sharing-strategy",
                "cloud.google.com/gke-max-shared-clients-per-gpu",
            ]
        ),
        st.sampled_from(["", "0", "1", "2", "7", "-1", "x", "mps", "nvidia-l4", "99999999999"])
        | st.text(max_size=5),
    ),
    st.none()
    | st.dictionaries(st.just("nvidia.com/gpu"), st.text(max_size=4) | st.integers(-2, 9)),
)
def test_arbitrary_labels_give_an_inventory_or_none(
    labels: dict[str, str], capacity: dict[str, object] | None
) -> None:
    refused = ""
    try:
        inv = inventory_from_labels("n", labels, budgets=B, capacity=capacity)
    except CodecError as exc:  # a number out of range: the label, or the count, is named
        inv, refused = None, str(exc)
    assert (
        not refused
        or "labels: nvidia.com/" in refused
        or "labels: cloud." in refused
        or ("GPUs, more than a node holds" in refused)
    )
    if inv is not None:
        assert 1 <= len(inv.gpus) <= 64
        assert all(g.units >= 1 and g.memory_mib >= 1 for g in inv.gpus)
