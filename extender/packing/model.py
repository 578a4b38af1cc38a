"""GPU inventory model: what a GPU is, what a node holds, and the MPS client-limit rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from extender.packing.errors import InvalidRequest

MpsState = Literal["ready", "down", "off"]
#: How NVML's UUIDs begin (`nvmlDeviceGetUUID`: "GPU-…", MIG instances "MIG-…"). A GPU of an
#: inventory derived from node labels has a stand-in uuid instead, and pods name it by index.
NVML_UUID_PREFIXES = ("GPU-", "MIG-")

#: MPS client contexts per device: Volta (compute capability 7.0) and later serve 48, earlier
#: GPUs 16 (MPS documentation §2.3.5.1; the man page states it by SM version: 7.0 → 48).
VOLTA_CLIENT_LIMIT = 48
PRE_VOLTA_CLIENT_LIMIT = 16
#: Newer drivers are reported to serve 60 client contexts per Volta+ device from CUDA 13.1 on
#: (with the default CUDA_DEVICE_MAX_CONNECTIONS); unverified on a real GPU, so only used where
#: `budgets.clientsCuda131` asks for it.
CUDA131_CLIENT_LIMIT = 60
CUDA131 = (13, 1)


@dataclass(frozen=True, slots=True, order=True)
class ComputeCapability:
    """A CUDA compute capability such as 9.0; ordered by major, then minor."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        """Parse "8.6" (or "8"); raise InvalidRequest naming the bad value otherwise."""
        parts = str(text).strip().split(".")
        # isascii: "²".isdigit() is true, yet int() refuses it; 3 digits are past any range.
        valid = all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts)
        if not 1 <= len(parts) <= 2 or not valid:
            raise InvalidRequest(f"compute capability {text!r} is not of the form MAJOR.MINOR")
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) == 2 else 0
        return cls(major, minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def is_volta_or_later(self) -> bool:
        """Volta (7.0) is where MPS gained execution-resource and memory limits and 48 clients."""
        return (self.major, self.minor) >= (7, 0)


def architecture_client_limit(cc: ComputeCapability) -> int:
    """MPS client contexts one device serves, by architecture: 48 from 7.0 on, 16 before."""
    return VOLTA_CLIENT_LIMIT if cc.is_volta_or_later else PRE_VOLTA_CLIENT_LIMIT


def client_limit(
    cc: ComputeCapability,
    configured: int | None = None,
    *,
    cuda131: bool = False,
    cuda_version: tuple[int, int] | None = None,
) -> int:
    """The client budget of one GPU: the architecture limit, capped by configuration. With
    `cuda131` (budgets.clientsCuda131) a Volta+ GPU whose driver supports CUDA 13.1 or newer
    serves 60; `cuda_version` None means the driver is not known here (the extender reading an
    inventory): the agent that knows it has already applied it, so 60 is the bound then."""
    arch = architecture_client_limit(cc)
    if cuda131 and cc.is_volta_or_later and (cuda_version is None or cuda_version >= CUDA131):
        arch = CUDA131_CLIENT_LIMIT
    return arch if configured is None else max(0, min(arch, configured))


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as the node agent (or feature-discovery labels) reports it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: ComputeCapability
    #: MPS clients this GPU may serve (already capped by the architecture limit).
    max_clients: int
    #: Share units per GPU (U) for `mpsched.io/units` requests.
    units: int
    mps: MpsState = "ready"
    #: MIG is enabled: the GPU is given out only whole. MPS on MIG needs one control daemon per
    #: MIG device, which the agent does not run (NVIDIA's device plugin refuses it as well).
    mig: bool = False

    @property
    def shareable(self) -> bool:
        """Thread and memory limits only exist from Volta on."""
        return self.compute_capability.is_volta_or_later


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """The GPUs of one node, in index order, plus the few node facts packing needs."""

    name: str
    gpus: tuple[GpuInfo, ...]
    #: MPS in multi-user mode lets pods of different UIDs share one server.
    multi_user: bool = False
    #: Allocatable CPU (millicores) and memory (MiB); None where unknown (kube-scheduler
    #: checks them itself; the simulator uses them as NodeResourcesFit does).
    cpu_milli: int | None = None
    memory_mib: int | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def gpu(self, uuid: str) -> GpuInfo | None:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        return None
