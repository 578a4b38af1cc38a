"""The range of every number mpsched reads from the cluster: the node inventory annotation
(`mpsched.io/gpus`), the GPU Feature Discovery and GKE labels read in its place, and the pod
allocation annotation (`mpsched.io/allocation`).

Owns those ranges and nothing else; `codec` and `codec_labels` enforce them on read and
`docs/node-agent.md` lists them. A value outside its range makes its whole record refused, with
a message naming the field: a node's inventory (the node takes no GPU pods and `/status` lists
it under `refusedNodes`), or a pod's allocation (reported like any unreadable allocation).
Nothing absurd reaches the ledger, `/status` or `/metrics`: every figure there stays well
inside a 64-bit integer and a float's exact range.

The ranges are loose on purpose: far wider than any GPU sold, narrow enough that no sum over a
cluster can overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from extender.packing.model import VOLTA_CLIENT_LIMIT


@dataclass(frozen=True, slots=True)
class Bound:
    """An inclusive integer range, with the reason for its limits in `why`."""

    low: int
    high: int
    why: str

    def problem(self, value: int) -> str | None:
        """Why `value` is out of range, or None."""
        if value < self.low:
            return f"{value} is below {self.low}"
        if value > self.high:
            return f"{_short(value)} is above {self.high} ({self.why})"
        return None


def _short(value: int) -> str:
    text = str(value) if value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 24 else f"{text[:20]}..."


#: GPUs on one node, and so positions 0..63: more than any node holds (8 is common, 16 rare).
MAX_GPUS_PER_NODE: Final = 64
GPU_INDEX: Final = Bound(0, MAX_GPUS_PER_NODE - 1, "a node holds at most 64 GPUs")
#: One GPU's memory in MiB: up to 4 TiB, twenty times the largest GPU memory sold.
GPU_MEMORY_MIB: Final = Bound(1, 1 << 22, "no GPU has 4 TiB of memory")
#: Compute capability parts ("9.0"): NVIDIA's majors are single digits so far.
COMPUTE_MAJOR: Final = Bound(1, 99, "compute capability major")
COMPUTE_MINOR: Final = Bound(0, 99, "compute capability minor")
#: An inventory's maxClients: capped to the architecture's MPS limit (48, 16 before Volta)
#: when read, so a larger value is harmless up to a point; beyond it, the record is garbage.
MAX_CLIENTS: Final = Bound(0, 1024, "MPS serves at most 48 clients per GPU")
#: Share units per GPU: each unit is one MPS client at least, so no more than the clients.
UNITS: Final = Bound(1, VOLTA_CLIENT_LIMIT, "a unit needs an MPS client; MPS serves 48")

# --- the pod allocation ----------------------------------------------------------------------

#: A container's thread percentage (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is 0-100).
CONTAINER_THREADS: Final = Bound(0, 100, "a thread percentage")
#: A pod's threads on its GPU: 100 % times the largest oversubscription the config allows.
ALLOCATION_THREADS: Final = Bound(0, 1000, "100 % times the largest oversubscription, 10")
#: Pinned memory of a pod or a container, in MiB: no more than a GPU can have.
ALLOCATION_MEMORY_MIB: Final = Bound(0, GPU_MEMORY_MIB.high, "no GPU has 4 TiB of memory")
#: MPS clients of a pod or a container.
ALLOCATION_CLIENTS: Final = Bound(0, VOLTA_CLIENT_LIMIT, "MPS serves at most 48 clients per GPU")
#: The Unix user a share runs as (Kubernetes validates runAsUser to 0..2^31-1).
RUN_AS_USER: Final = Bound(0, 2**31 - 1, "Kubernetes' runAsUser range")
