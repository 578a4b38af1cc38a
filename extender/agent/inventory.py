"""What the agent publishes on its Node (DESIGN §6), decided without I/O: the GPU inventory
built from an NVML discovery, the `mpsched.io/agent` record, and the one merge patch that brings
the Node's metadata up to date (or None: nothing to write).

Owns the agent record's form and the rule "write only what differs"; the inventory's wire form is
`extender.packing.codec`'s, so the extender reads exactly what the agent wrote. Also holds what
NVML finds (`Discovery`, `GpuSample`, ...) as plain data: `extender.agent.nvml` produces it and
re-exports it, and the pure modules (this one, `usage`) may not import that module.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.packing.model import ComputeCapability

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
