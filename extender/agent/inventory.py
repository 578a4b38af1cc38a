"""What the agent publishes on its Node (docs/design.md, Annotations), decided without I/O: the GPU
inventory built from an NVML discovery, the `mpsched.io/agent` record, and the one merge patch that
brings the Node's metadata up to date (or None: nothing to write).

Owns the agent record's form and the rule "write only what differs"; the inventory's wire form is
`extender.packing.codec`'s, so the extender reads exactly what the agent wrote. Also holds what
NVML finds (`Discovery`, `GpuSample`, ...) as plain data: `extender.agent.nvml` produces it and
re-exports it, and the pure modules (this one, `usage`) may not import that module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from extender.packing.codec_labels import units_from_labels
from extender.packing.model import ComputeCapability, GpuInfo, MpsState, NodeInventory, client_limit
from extender.packing.settings import BudgetSettings

AGENT_KEY: Final = "mpsched.io/agent"
MPS_READY_LABEL: Final = "mpsched.io/mps-ready"
#: States of the node's MPS control daemon the record may carry.
AGENT_MPS_STATES: Final = frozenset({"ready", "down", "foreign", "off"})
#: A reason longer than this is cut: it is one line for humans, and annotations are bounded.
MAX_REASON: Final = 512


# -- what NVML found ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveredGpu:
    index: int
    uuid: str
    name: str
    #: Total memory in MiB, rounded down (what the budgets may promise).
    memory_mib: int
    compute_capability: ComputeCapability
    #: MIG is enabled now (the current mode; a pending change counts after the GPU's reset).
    mig: bool
    #: `NVML_COMPUTEMODE_*`; None where NVML does not say (a MIG-enabled GPU, say).
    compute_mode: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Discovery:
    driver_version: str
    #: The CUDA version the driver supports, "12.4" (NVML reports 12040).
    cuda_version: str
    gpus: tuple[DiscoveredGpu, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    pid: int
    #: MiB rounded down; None where NVML cannot tell (it often cannot, for MPS clients).
    used_memory_mib: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    index: int
    uuid: str
    #: Percent of the last sample period a kernel ran; None where unsupported (MIG).
    utilization_percent: int | None
    memory_used_mib: int | None
    #: MPS client processes (Volta and later); under MPS `processes` shows the MPS server.
    mps_clients: tuple[GpuProcess, ...]
    processes: tuple[GpuProcess, ...]


# -- what the agent publishes ---------------------------------------------------------------


def inventory_from_discovery(
    node_name: str,
    discovery: Discovery,
    *,
    labels: Mapping[str, str],
    budgets: BudgetSettings,
    mps: MpsState,
) -> NodeInventory:
    """The node's inventory: each GPU's client limit from its compute capability and the
    driver's CUDA version (60 from CUDA 13.1 on where `budgets.clientsCuda131` says so), capped
    by configuration; share units from the node's labels; MIG GPUs marked so that the ledger
    gives them out only whole. `multi_user` stays False: the extender decides it by node
    labels."""
    units = units_from_labels(labels, budgets)
    cuda = cuda_version(discovery.cuda_version)
    gpus = tuple(
        GpuInfo(
            index=g.index,
            uuid=g.uuid,
            model=g.name,
            memory_mib=g.memory_mib,
            compute_capability=g.compute_capability,
            max_clients=client_limit(
                g.compute_capability,
                budgets.max_clients_per_gpu,
                cuda131=budgets.clients_cuda131,
                # A driver whose version did not read is taken as older (48 stays safe).
                cuda_version=cuda or (0, 0),
            ),
            units=units,
            mps=mps,
            mig=g.mig,
        )
        for g in sorted(discovery.gpus, key=lambda g: g.index)
    )
    pairs = tuple(sorted(labels.items()))
    return NodeInventory(name=node_name, gpus=gpus, labels=pairs)


def cuda_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a CUDA version as discovery writes it ("12.4"); None if not one."""
    major, dot, minor = text.partition(".")
    return (int(major), int(minor)) if dot and major.isdigit() and minor.isdigit() else None


def agent_record(
    discovery: Discovery | None,
    *,
    mps_state: str,
    reason: str,
    device_plugin_gpus: Sequence[str] = (),
) -> str:
    """The `mpsched.io/agent` annotation: canonical JSON of the driver, the CUDA version (empty
    before any discovery succeeded), the MPS daemon's state and why it is not ready (one line,
    empty when it is), and, where kubelet says so, the GPUs pods hold through NVIDIA's device
    plugin (`devicePluginGpus`, only when there are any)."""
    if mps_state not in AGENT_MPS_STATES:
        raise ValueError(f"MPS state {mps_state!r} is not one of {sorted(AGENT_MPS_STATES)}")
    line = " ".join(reason.split())
    if len(line) > MAX_REASON:
        line = line[: MAX_REASON - 3] + "..."
    record: dict[str, object] = {
        "driver": discovery.driver_version if discovery else "",
        "cuda": discovery.cuda_version if discovery else "",
        "mps": mps_state,
        "reason": line,
    }
    if device_plugin_gpus:
        record["devicePluginGpus"] = sorted(set(device_plugin_gpus))
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def node_patch(
    node: Mapping[str, Any], *, annotations: Mapping[str, str], labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """The JSON merge patch `{"metadata": {"annotations": …, "labels": …}}` holding only the
    annotations and labels whose value on `node` differs (or is missing); None when none does,
    so that an unchanged node costs no write."""
    meta = node.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    body: dict[str, Any] = {}
    for section, wanted in (("annotations", annotations), ("labels", labels)):
        have = meta.get(section)
        have = have if isinstance(have, Mapping) else {}
        changed = {k: v for k, v in wanted.items() if have.get(k) != v}
        if changed:
            body[section] = changed
    return {"metadata": body} if body else None


def published_state(daemon_state: str, daemon_reason: str, nvml_problem: str) -> tuple[str, str]:
    """The node's MPS state as published, and why: an NVML that does not answer makes the GPUs
    down whatever the daemon says (nothing new should go where the driver is in trouble); then
    the daemon's own state. Only "ready" lets the extender place shares."""
    if nvml_problem:
        return "down", f"NVML: {nvml_problem}"
    if daemon_state not in AGENT_MPS_STATES:
        return "down", f"unknown daemon state {daemon_state!r}"
    return daemon_state, daemon_reason


def shared_indices(discovery: Discovery, budgets: BudgetSettings) -> tuple[int, ...]:
    """The GPUs MPS will share (the ones to put in EXCLUSIVE_PROCESS): not MIG-enabled, and
    Volta or later unless pre-Volta GPUs are shared too (`budgets.preVolta: share`)."""
    return tuple(
        g.index
        for g in discovery.gpus
        if not g.mig and (g.compute_capability.is_volta_or_later or budgets.pre_volta == "share")
    )


def device_plugin_gpu_ids(devices: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The GPUs device-plugin pods hold, from kubelet's pod → device IDs: each GPU once, sorted.
    NVIDIA's plugin names a shared replica `<uuid>::<n>`; the GPU is the part before `::`."""
    return tuple(sorted({d.split("::", 1)[0] for ids in devices.values() for d in ids}))


# -- the device plugin's slots ------------------------------------------------------------------

#: kubelet's device health values (anything but "Healthy" counts as unhealthy).
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """One `mpsched.io/mps` device the plugin advertises: one MPS client slot of one GPU."""

    id: str
    healthy: bool


def advertised_slots(
    inventory: NodeInventory | None, *, ready: bool, budgets: BudgetSettings
) -> tuple[Slot, ...]:
    """The plugin's devices: `maxClients` slots for every GPU MPS shares (not MIG; Volta or
    later unless pre-Volta GPUs are shared too), healthy while the node's MPS is ready. IDs are
    `<GPU uuid>::<n>`, stable across restarts (kubelet remembers allocations by ID) and at most
    63 characters. Which ID a container gets says nothing about its GPU: the pod's allocation
    does, through NVIDIA_VISIBLE_DEVICES; the slots only bound how many containers hold the
    resource at once."""
    if inventory is None:
        return ()
    slots = []
    for gpu in inventory.gpus:
        shared = gpu.compute_capability.is_volta_or_later or budgets.pre_volta == "share"
        if gpu.mig or not shared:
            continue
        healthy = ready and gpu.mps == "ready"
        slots += [Slot(id=f"{gpu.uuid}::{n}", healthy=healthy) for n in range(gpu.max_clients)]
    return tuple(slots)
