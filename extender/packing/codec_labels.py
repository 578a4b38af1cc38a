"""Node inventory from node labels, for nodes without the agent's `mpsched.io/gpus` annotation
(docs/design.md, Annotations): NVIDIA GPU Feature Discovery labels, or GKE's accelerator labels plus
a built-in table of GKE accelerators. Every GPU of such a node is assumed identical.

Owns the label vocabulary and the accelerator table; `codec` re-exports the entry points.
Synthesised GPU uuids are `<node>-gpu<index>`: deterministic, so a ledger rebuilt from the same
labels names the same GPUs, and visibly not NVIDIA uuids (`GPU-…`). A pod placed on such a node
gets that name as its visible device, which only a device plugin that reads these names can use:
label-derived inventory suits simulation, the demo and capacity planning; real MPS placement
wants the agent's annotation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from extender.packing import bounds
from extender.packing.bounds import Bound
from extender.packing.errors import CodecError
from extender.packing.model import ComputeCapability, GpuInfo, MpsState, NodeInventory, client_limit
from extender.packing.settings import BudgetSettings

GKE_ACCELERATOR: Final = "cloud.google.com/gke-accelerator"
GKE_SHARING_STRATEGY: Final = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_SHARED_CLIENTS: Final = "cloud.google.com/gke-max-shared-clients-per-gpu"
NVIDIA_COUNT: Final = "nvidia.com/gpu.count"
NVIDIA_MEMORY: Final = "nvidia.com/gpu.memory"
NVIDIA_CC_MAJOR: Final = "nvidia.com/gpu.compute.major"
NVIDIA_CC_MINOR: Final = "nvidia.com/gpu.compute.minor"
NVIDIA_PRODUCT: Final = "nvidia.com/gpu.product"
NVIDIA_REPLICAS: Final = "nvidia.com/gpu.replicas"
NVIDIA_SHARING_STRATEGY: Final = "nvidia.com/gpu.sharing-strategy"
NVIDIA_MPS_CAPABLE: Final = "nvidia.com/mps.capable"
#: Node capacity resource that counts GPUs (times the sharing factor on GKE sharing nodes).
NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"
#: More GPUs than any node holds: a label claiming more is garbage, not a node to build.
MAX_GPUS_PER_NODE: Final = bounds.MAX_GPUS_PER_NODE
#: The numeric labels read, each with its range (`bounds`). A value outside it refuses the
#: node's inventory; a value that is not a number at all is ignored (labels are not ours).
LABEL_BOUNDS: Final = MappingProxyType(
    {
        NVIDIA_COUNT: Bound(0, MAX_GPUS_PER_NODE, "a node holds at most 64 GPUs"),
        NVIDIA_MEMORY: Bound(0, bounds.GPU_MEMORY_MIB.high, bounds.GPU_MEMORY_MIB.why),
        NVIDIA_CC_MAJOR: Bound(0, bounds.COMPUTE_MAJOR.high, bounds.COMPUTE_MAJOR.why),
        NVIDIA_CC_MINOR: bounds.COMPUTE_MINOR,
        NVIDIA_REPLICAS: Bound(0, bounds.UNITS.high, bounds.UNITS.why),
        GKE_MAX_SHARED_CLIENTS: Bound(0, bounds.UNITS.high, bounds.UNITS.why),
    }
)
#: The labels that give a node's share units where its inventory does not.
UNIT_LABELS: Final = (GKE_MAX_SHARED_CLIENTS, NVIDIA_REPLICAS)


@dataclass(frozen=True, slots=True)
class KnownGpu:
    """A GPU model's facts when nothing on the node states them."""

    model: str
    #: NVML total MiB; where several values are seen (ECC, driver), the lowest, so that a budget
    #: never promises memory the GPU does not have.
    memory_mib: int
    compute_capability: ComputeCapability


def _cc(major: int, minor: int) -> ComputeCapability:
    return ComputeCapability(major, minor)


#: GKE `cloud.google.com/gke-accelerator` values → facts (GKE's documentation, NVML's totals).
GKE_ACCELERATORS: Final = MappingProxyType(
    {
        "nvidia-tesla-k80": KnownGpu("Tesla K80", 11439, _cc(3, 7)),
        "nvidia-tesla-p4": KnownGpu("Tesla P4", 7611, _cc(6, 1)),
        "nvidia-tesla-p100": KnownGpu("Tesla P100-PCIE-16GB", 16280, _cc(6, 0)),
        "nvidia-tesla-v100": KnownGpu("Tesla V100-SXM2-16GB", 16130, _cc(7, 0)),
        "nvidia-tesla-t4": KnownGpu("Tesla T4", 15109, _cc(7, 5)),
        "nvidia-l4": KnownGpu("NVIDIA L4", 23034, _cc(8, 9)),
        "nvidia-tesla-a100": KnownGpu("NVIDIA A100-SXM4-40GB", 40960, _cc(8, 0)),
        "nvidia-a100-80gb": KnownGpu("NVIDIA A100-SXM4-80GB", 81920, _cc(8, 0)),
        "nvidia-h100-80gb": KnownGpu("NVIDIA H100 80GB HBM3", 81559, _cc(9, 0)),
        "nvidia-h100-mega-80gb": KnownGpu("NVIDIA H100 80GB HBM3", 81559, _cc(9, 0)),
        "nvidia-h200-141gb": KnownGpu("NVIDIA H200", 143771, _cc(9, 0)),
        "nvidia-b200": KnownGpu("NVIDIA B200", 183359, _cc(10, 0)),
    }
)


def _digits(labels: Mapping[str, object], key: str) -> str | None:
    value = labels.get(key)
    return value if isinstance(value, str) and value.isascii() and value.isdigit() else None


def label_int(labels: Mapping[str, object], key: str) -> int | None:
    """A label's non-negative integer value inside its range (`LABEL_BOUNDS`); anything else
    is ignored here (labels are not ours; `label_problem` reports a number out of range)."""
    value = _digits(labels, key)
    if value is None or len(value) >= 10:
        return None
    number = int(value)
    bound = LABEL_BOUNDS.get(key)
    return None if bound is not None and bound.problem(number) else number


def label_problem(labels: Mapping[str, object], keys: Iterable[str] = LABEL_BOUNDS) -> str | None:
    """Why a numeric label of `keys` is out of its range (the node's inventory is then
    refused), or None."""
    for key in keys:
        value = _digits(labels, key)
        if value is None:
            continue
        # 12 digits are past every range; int() of thousands of digits is slow, then refused.
        problem = LABEL_BOUNDS[key].problem(int(value[:12]))
        if problem is not None:
            return f"{key}={value[:24]}: {problem}"
    return None


def units_from_labels(labels: Mapping[str, object], budgets: BudgetSettings) -> int:
    """U where the inventory does not say: GKE's max shared clients, then NVIDIA's replicas
    (only ≥ 2 counts: NDP writes 1 or 0 for an unshared GPU), then the configured default."""
    for key, low in ((GKE_MAX_SHARED_CLIENTS, 1), (NVIDIA_REPLICAS, 2)):
        value = label_int(labels, key)
        if value is not None and value >= low:
            return value
    return budgets.default_units


def inventory_from_labels(
    node_name: str,
    labels: Mapping[str, object],
    *,
    budgets: BudgetSettings,
    capacity: Mapping[str, object] | None = None,
) -> NodeInventory | None:
    """The node's GPUs from GFD or GKE labels, or None when the labels do not describe GPUs.

    GFD needs `nvidia.com/gpu.count`, `.memory` (MiB) and `.compute.major`. GKE needs a known
    `cloud.google.com/gke-accelerator`; GKE labels no GPU count, so it comes from `capacity`
    (the node's `status.capacity`: `nvidia.com/gpu`, divided by the clients per GPU on a GKE
    sharing node). MPS counts as ready only where the labels say MPS sharing is on
    (NDP's `nvidia.com/gpu.sharing-strategy=mps` / `nvidia.com/mps.capable=true`, GKE's
    `gke-gpu-sharing-strategy=mps`); otherwise "off" and the GPUs are only given out whole.
    A numeric label out of its range, or more than 64 GPUs, raises CodecError."""
    problem = label_problem(labels)
    if problem is not None:
        raise CodecError(f"node {node_name!r} labels: {problem}")
    units = units_from_labels(labels, budgets)
    memory = label_int(labels, NVIDIA_MEMORY)
    major = label_int(labels, NVIDIA_CC_MAJOR)
    mps: MpsState
    if memory and major is not None:
        count = label_int(labels, NVIDIA_COUNT)
        cc = _cc(major, label_int(labels, NVIDIA_CC_MINOR) or 0)
        product = labels.get(NVIDIA_PRODUCT)
        model = product.removesuffix("-SHARED") if isinstance(product, str) else ""
        on = (
            labels.get(NVIDIA_SHARING_STRATEGY) == "mps" or labels.get(NVIDIA_MPS_CAPABLE) == "true"
        )
        mps = "ready" if on else "off"
    else:
        known = GKE_ACCELERATORS.get(str(labels.get(GKE_ACCELERATOR, "")))
        if known is None:
            return None
        count = label_int(labels, NVIDIA_COUNT) or _gke_count(labels, capacity)
        memory, cc, model = known.memory_mib, known.compute_capability, known.model
        mps = "ready" if labels.get(GKE_SHARING_STRATEGY) == "mps" else "off"
    if not count:
        return None
    if count > MAX_GPUS_PER_NODE:
        raise CodecError(f"node {node_name!r}: {count} GPUs, more than a node holds (64)")
    max_clients = client_limit(cc, budgets.max_clients_per_gpu)
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"{node_name}-gpu{i}",
            model=model,
            memory_mib=memory,
            compute_capability=cc,
            max_clients=max_clients,
            units=units,
            mps=mps,
        )
        for i in range(count)
    )
    pairs = tuple(sorted((k, v) for k, v in labels.items() if isinstance(v, str)))
    return NodeInventory(name=node_name, gpus=gpus, labels=pairs)


def _gke_count(labels: Mapping[str, object], capacity: Mapping[str, object] | None) -> int | None:
    raw = (capacity or {}).get(NVIDIA_GPU_RESOURCE)
    if isinstance(raw, int) and not isinstance(raw, bool):
        advertised: int | None = raw
    else:
        advertised = label_int({"v": raw}, "v")
    if not advertised:
        return None
    # A GKE sharing node advertises one device per client: GPUs × max-shared-clients.
    shared = label_int(labels, GKE_MAX_SHARED_CLIENTS)
    if labels.get(GKE_SHARING_STRATEGY) in ("mps", "time-sharing") and shared:
        return advertised // shared or None
    return advertised
