"""Usage against shares: which pod each MPS client belongs to (its cgroup names the pod), and
whether what a pod's clients really use on a GPU stays within the allocation mpsched gave it.

Owns the reading of a `/proc/<pid>/cgroup` text and the over-share decision; pure (no I/O: the
cgroup files are read by `procfs`, the samples taken by `nvml`, the allocations decoded from the
pods the node loop lists). It reads a sample through the small protocols below, so it does not
depend on the NVML adapter.

MPS enforces each client's pinned-memory limit, but only for clients that kept the env var the
webhook injected, and it never bounds how many clients a pod opens; this is where a pod that
escaped its share is noticed and reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from extender.packing.codec import ALLOCATION_KEY, NVML_UUID_PREFIXES, decode_allocation_on
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.objects import mapping, read_placement

# -- what a sample must show -----------------------------------------------------------------


class ClientReading(Protocol):
    """One MPS client process on a GPU, as NVML lists it (host PID namespace)."""

    @property
    def pid(self) -> int: ...

    #: Device memory the client uses there; None where NVML cannot tell.
    @property
    def used_memory_mib(self) -> int | None: ...


class GpuReading(Protocol):
    """One GPU's sample: which GPU, and its MPS clients."""

    @property
    def index(self) -> int: ...

    @property
    def uuid(self) -> str: ...

    @property
    def mps_clients(self) -> Sequence[ClientReading]: ...


# -- cgroup → pod ----------------------------------------------------------------------------


def _uid_pattern(sep: str) -> str:
    """A Kubernetes pod UID: an RFC 4122 UUID in lowercase hex (the API server generates them),
    its groups joined by `sep`."""
    return sep.join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12))


#: cgroupfs driver: `/kubepods/[burstable|besteffort/]pod<uid>/<container>`.
_CGROUPFS_POD: Final = re.compile(rf"pod({_uid_pattern('-')})")
#: systemd driver: `kubepods[-burstable|-besteffort]-pod<uid with _ for ->.slice`; kubelets
#: with a `--cgroup-root` prefix the slice name (`kubelet-kubepods-...`, as kind does).
_SYSTEMD_POD: Final = re.compile(
    rf"((?:[a-z0-9_]+-)?kubepods(?:-burstable|-besteffort)?)-pod({_uid_pattern('_')})\.slice"
)
_QOS_CLASSES: Final = frozenset({"burstable", "besteffort"})
#: A cgroupfs `--cgroup-root` is one plain directory (`/kubelet`): not a systemd unit (a user's
#: delegated subtree sits below one), and not where a container runtime nests its containers
#: (a kubelet in a container, such as a kind node, has pods of another node's kubelet).
_CGROUP_ROOT: Final = re.compile(r"[a-z0-9][a-z0-9_-]*")
_RUNTIME_PREFIXES: Final = frozenset(
    {"docker", "containerd", "crio", "cri-containerd", "libpod", "podman", "lxc", "machine"}
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The UID (dashed) of the pod whose cgroup a `/proc/<pid>/cgroup` text names, or None for
    a process outside every pod (a host daemon, the MPS server itself) or a text that names no
    single pod. Reads cgroup v1 (one line per hierarchy) and v2 (`0::<path>`), and the paths of
    both kubelet cgroup drivers, for every QoS class (guaranteed pods sit right under
    `kubepods`). A pod's cgroup counts only where kubelet makes it, anchored at the root: a
    process under `/user.slice/...` may create directories named like a pod's in its own
    delegated subtree, and must not be taken for that pod."""
    found: set[str] = set()
    for line in text.splitlines():
        # `hierarchy-ID:controller-list:path`; the path may itself hold colons.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        uid = _uid_of_path(parts[2])
        if uid is not None:
            found.add(uid)
    # v1 hierarchies of one process agree; if they do not, the text names no one pod.
    return found.pop() if len(found) == 1 else None


def _uid_of_path(path: str) -> str | None:
    """The pod of the first pod-like directory on the path, where it sits where kubelet puts
    pods; None otherwise (what lies below a pod's cgroup is that pod's)."""
    parts = [p for p in path.strip().split("/") if p]
    for i, part in enumerate(parts):
        m = _SYSTEMD_POD.fullmatch(part)
        if m is not None:
            return (
                m.group(2).replace("_", "-") if _systemd_parents(m.group(1)) == parts[:i] else None
            )
        m = _CGROUPFS_POD.fullmatch(part)
        if m is not None:
            return m.group(1) if _under_kubepods(parts[:i]) else None
    return None


def _systemd_parents(stem: str) -> list[str]:
    """Where systemd puts the slice `<stem>-pod<uid>.slice`: a slice's name spells its path
    from the root (`a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`)."""
    names = stem.split("-")
    return [f"{'-'.join(names[: k + 1])}.slice" for k in range(len(names))]


def _under_kubepods(parents: list[str]) -> bool:
    """Whether a cgroupfs `pod<uid>` directory sits where kubelet puts pods: `/kubepods`
    (guaranteed) or `/kubepods/<qos>`, below at most a one-directory `--cgroup-root`."""
    if parents[-1:] == ["kubepods"]:
        prefix = parents[:-1]
    elif len(parents) >= 2 and parents[-2] == "kubepods" and parents[-1] in _QOS_CLASSES:
        prefix = parents[:-2]
    else:
        return False
    return not prefix or (
        len(prefix) == 1
        and _CGROUP_ROOT.fullmatch(prefix[0]) is not None
        and prefix[0] not in _RUNTIME_PREFIXES
    )


# -- the allocations of a node's pods ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadableAllocation:
    """A pod on the node whose `mpsched.io/allocation` could not be used; `reason` says why."""

    pod_uid: str
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAllocations:
    """The allocations of the node's running pods, by pod UID, and those that did not decode."""

    by_uid: Mapping[str, Allocation] = field(default_factory=dict)
    unreadable: tuple[UnreadableAllocation, ...] = ()


def allocations_of(pods: Iterable[Mapping[str, Any]], node: str) -> NodeAllocations:
    """Decode the allocation of every non-terminal pod bound to `node` (pods without the
    annotation are not mpsched's and are left out). A record that does not decode, or that
    names another node than the pod runs on, is returned in `unreadable`, not used: a client
    measured against a wrong allocation would be reported for the wrong reason."""
    by_uid: dict[str, Allocation] = {}
    unreadable: list[UnreadableAllocation] = []
    for pod in pods:
        # Objects from the wire are untrusted: anything but a pod object is passed over.
        place = read_placement(pod) if isinstance(pod, Mapping) else None
        if place is None or place.terminal or place.node != node:
            continue
        text = mapping(mapping(pod.get("metadata")).get("annotations")).get(ALLOCATION_KEY)
        if text is None:
            continue
        found = decode_allocation_on(
            text,
            node=node,
            pod_uid=place.uid,
            namespace=place.namespace,
            name=place.name,
            priority=place.priority,
        )
        if not isinstance(found, str):
            by_uid[place.uid] = found
            continue
        reason = found
        unreadable.append(
            UnreadableAllocation(
                pod_uid=place.uid, namespace=place.namespace, name=place.name, reason=reason
            )
        )
    return NodeAllocations(by_uid=by_uid, unreadable=tuple(unreadable))


# -- the assessment ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PodUsage:
    """What one pod's MPS clients use on one GPU, against what its allocation allows there.

    `allowed_mib` is None where the allocation sets no memory budget (a threads-only share, or
    a GPU given out whole): memory is then never over. `allowed_clients` is None on a GPU given
    out whole (no share budget; only the GPU's own client limit applies). On a GPU the pod was
    not allocated both are 0. `used_mib` sums what NVML reports; a client whose memory NVML
    cannot tell counts 0, so it is a lower bound then.
    """

    pod_uid: str
    namespace: str
    name: str
    gpu_index: int
    used_mib: int
    allowed_mib: int | None
    clients: int
    allowed_clients: int | None
    over_share: bool
    #: One line naming the figures when over its share; "" otherwise.
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageReport:
    """Per pod and GPU, usage against share (sorted by namespace, name, GPU index); and the
    clients that belong to no pod with an allocation, as (GPU index, pid), sorted."""

    pods: tuple[PodUsage, ...] = ()
    unknown_clients: tuple[tuple[int, int], ...] = ()

    @property
    def over_share(self) -> tuple[PodUsage, ...]:
        return tuple(p for p in self.pods if p.over_share)


def holds(ref: GpuRef, index: int, uuid: str | None) -> bool:
    """Whether an allocation's GPU reference names the GPU `index` / `uuid`. By uuid; an
    allocation made from a label-derived inventory (before the agent published NVML uuids)
    holds stand-in uuids, and names its GPU by index only."""
    return ref.uuid == uuid if ref.uuid.startswith(NVML_UUID_PREFIXES) else ref.index == index


@dataclass(slots=True)
class _Tally:
    used_mib: int = 0
    clients: int = 0


def assess(
    samples: Sequence[GpuReading],
    owners: Mapping[int, str],
    allocations: Mapping[str, Allocation],
    *,
    tolerance_mib: int,
) -> UsageReport:
    """Compare each pod's MPS clients with its allocation. `owners`: pid → pod UID (from
    `procfs.owners_of`); `allocations`: pod UID → its decoded allocation. A pod gets a row for
    every sampled GPU of its allocation (idle ones too, so its share shows) and for every other
    GPU it has clients on (over its share there: it was given nothing on that GPU)."""
    tallies: dict[tuple[str, int], _Tally] = {}
    unknown: list[tuple[int, int]] = []
    by_index = {gpu.index: gpu for gpu in samples}
    for gpu in samples:
        for client in gpu.mps_clients:
            uid = owners.get(client.pid)
            if uid is None or uid not in allocations:
                unknown.append((gpu.index, client.pid))
                continue
            tally = tallies.setdefault((uid, gpu.index), _Tally())
            tally.used_mib += client.used_memory_mib or 0
            tally.clients += 1
    for uid, alloc in allocations.items():
        for gpu in samples:
            if any(holds(ref, gpu.index, gpu.uuid) for ref in alloc.gpus):
                tallies.setdefault((uid, gpu.index), _Tally())
    rows = [
        _judge(allocations[uid], by_index[index], tally, tolerance_mib)
        for (uid, index), tally in tallies.items()
    ]
    rows.sort(key=lambda r: (r.namespace, r.name, r.gpu_index, r.pod_uid))
    return UsageReport(pods=tuple(rows), unknown_clients=tuple(sorted(unknown)))


def _judge(alloc: Allocation, gpu: GpuReading, tally: _Tally, tolerance_mib: int) -> PodUsage:
    used, clients = tally.used_mib, tally.clients
    allowed_mib: int | None
    allowed_clients: int | None
    reasons: list[str] = []
    if not any(holds(ref, gpu.index, gpu.uuid) for ref in alloc.gpus):
        allowed_mib, allowed_clients = 0, 0
        where = ", ".join(str(ref.index) for ref in alloc.gpus)
        reasons.append(
            f"{clients} MPS client{'s' if clients != 1 else ''} ({used} MiB) on GPU "
            f"{gpu.index}, but its allocation is on GPU {where}"
        )
    elif alloc.kind == "whole":
        allowed_mib, allowed_clients = None, None
    else:
        allowed_mib = alloc.memory_mib if alloc.memory_mib > 0 else None
        allowed_clients = alloc.clients
        if allowed_mib is not None and used > allowed_mib + tolerance_mib:
            slack = f" + {tolerance_mib} MiB tolerance" if tolerance_mib else ""
            reasons.append(f"uses {used} MiB on GPU {gpu.index}, allowed {allowed_mib} MiB{slack}")
        if clients > allowed_clients:
            reasons.append(f"{clients} MPS clients on GPU {gpu.index}, allowed {allowed_clients}")
    return PodUsage(
        pod_uid=alloc.pod_uid,
        namespace=alloc.namespace,
        name=alloc.name,
        gpu_index=gpu.index,
        used_mib=used,
        allowed_mib=allowed_mib,
        clients=clients,
        allowed_clients=allowed_clients,
        over_share=bool(reasons),
        reason="; ".join(reasons),
    )
