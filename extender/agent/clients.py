"""Every MPS client against its pod's allocation: which clients run outside their share, and
why. Pure (no I/O): the client list comes from the control daemon, GPU and memory from NVML,
the pod from the process's cgroup and the limits from its environment, all read by the
adapters (`enforce`), which also act on the findings.

A client is outside its share when it:
- runs without the limits its container was given: its environment's
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where the container
  has a memory budget) is missing or looser than its container's share, or it runs in a
  container that was given none. Its container is known where its cgroup names a container ID
  the pod's status lists; otherwise any container of the pod counts. The daemon's default is
  100 % and no memory limit, so a missing variable means the whole GPU;
- runs on a GPU its pod was not given;
- is one more than its pod's declared client count on that GPU (the newest ones are);
- makes its pod use more memory on the GPU than its share (largest users first, until the
  rest fits);
- is a client of the agent's own daemon but belongs to a pod that has no mpsched allocation
  (clients of another MPS daemon, NVIDIA's device plugin's say, are not mpsched's to judge).

The environment is the one the process started with (`/proc/<pid>/environ`); a process can
change its own before CUDA reads it, so the limits check catches mistakes and careless images,
not a determined tenant. The memory and count checks rest on what NVML and the daemon see.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from extender.agent.usage import holds
from extender.packing.ledger import Allocation
from extender.packing.request import ContainerDemand

THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

FindingKind = Literal["no-limits", "wrong-gpu", "too-many-clients", "over-memory", "no-allocation"]
FINDING_KINDS: Final[tuple[FindingKind, ...]] = (
    "no-limits",
    "wrong-gpu",
    "too-many-clients",
    "over-memory",
    "no-allocation",
)

#: A container's ID as the runtimes name its cgroup: `cri-containerd-<id>.scope`,
#: `crio-<id>.scope`, `docker-<id>.scope` (systemd driver) or `<id>` (cgroupfs driver).
_CONTAINER_ID: Final = re.compile(r"(?:[a-z]+-)*([0-9a-f]{64})(?:\.scope)?")
#: One entry of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: `<device ordinal or uuid>=<n><unit>`.
_PINNED: Final = re.compile(r"\s*([^=,\s]+)\s*=\s*(\d+)\s*([MG])B?\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a client's environment sets: its thread percentage (None: unset) and its pinned
    memory limit in MiB (None: unset; the largest entry where several devices are named)."""

    threads: float | None
    memory_mib: int | None
    #: A variable set but not readable as MPS reads it (counts as unset).
    malformed: tuple[str, ...] = ()


def limits_of(environ: Mapping[str, str]) -> Limits:
    """The MPS limits a process's environment sets."""
    malformed: list[str] = []
    threads: float | None = None
    raw = environ.get(THREADS_ENV)
    if raw is not None:
        try:
            threads = float(raw)
        except ValueError:
            malformed.append(THREADS_ENV)
        else:
            if not 0 < threads <= 100:
                threads = None
                malformed.append(THREADS_ENV)
    memory: int | None = None
    raw = environ.get(MEMORY_ENV)
    if raw is not None:
        memory = pinned_mib(raw)
        if memory is None:
            malformed.append(MEMORY_ENV)
    return Limits(threads=threads, memory_mib=memory, malformed=tuple(malformed))


def pinned_mib(text: str) -> int | None:
    """The largest limit, in MiB, of a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value ("0=4096M",
    "0=1G,1=512M"); None when an entry does not read."""
    values = []
    for entry in text.split(","):
        m = _PINNED.fullmatch(entry)
        if m is None:
            return None
        values.append(int(m.group(2)) * (1024 if m.group(3).upper() == "G" else 1))
    return max(values) if values else None


def container_id_of(cgroup: str) -> str | None:
    """The container ID a `/proc/<pid>/cgroup` text ends in (the last path segment of its
    hierarchies, which agree), or None."""
    found = set()
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1].strip().rstrip("/")
        m = _CONTAINER_ID.fullmatch(path.rsplit("/", 1)[-1])
        if m is not None:
            found.add(m.group(1))
    return found.pop() if len(found) == 1 else None


def container_names(pods: Iterable[Mapping[str, object]]) -> dict[str, str]:
    """Container ID → container name, from the pods' `status.containerStatuses` (and init and
    ephemeral containers'), whose `containerID` reads `<runtime>://<id>`."""
    out: dict[str, str] = {}
    for pod in pods:
        status = pod.get("status")
        if not isinstance(status, Mapping):
            continue
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            statuses = status.get(key)
            for item in statuses if isinstance(statuses, list) else ():
                if not isinstance(item, Mapping):
                    continue
                cid, name = item.get("containerID"), item.get("name")
                if isinstance(cid, str) and isinstance(name, str) and "://" in cid:
                    out[cid.split("://", 1)[1]] = name
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """One MPS client process as the adapters found it."""

    pid: int
    #: The MPS server it is a client of (the daemon's client list); None where only NVML saw it.
    server_pid: int | None
    #: The GPU NVML lists it on (index, uuid); None where NVML does not (yet) show it.
    gpu_index: int | None
    gpu_uuid: str | None
    #: MiB NVML reports it uses there; None where NVML cannot tell.
    used_mib: int | None
    #: Its pod's UID from its cgroup; None: no pod (a host process).
    pod_uid: str | None
    #: Its environment's limits; None where it could not be read.
    limits: Limits | None
    #: When it started (clock ticks since boot, /proc/<pid>/stat): the newest go first.
    started: int = 0
    #: Its container's name, where its cgroup and the pod's status tell; None: any container
    #: of the pod may be its own.
    container: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One client outside its share. `key` names the episode: reported once while it lasts."""

    kind: FindingKind
    pid: int
    server_pid: int | None
    pod_uid: str
    namespace: str
    name: str
    gpu_index: int | None
    #: Why, as a clause: "started without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: ...".
    reason: str

    @property
    def text(self) -> str:
        return f"MPS client pid {self.pid} {self.reason}"

    @property
    def key(self) -> tuple[str, ...]:
        if self.kind in ("too-many-clients", "over-memory"):
            # A pod-wide excess: one episode per pod and GPU, whichever clients make it.
            return (self.kind, self.pod_uid, str(self.gpu_index))
        return (self.kind, self.pod_uid, str(self.pid))


def check(
    clients: Iterable[Client],
    allocations: Mapping[str, Allocation],
    *,
    pods: Mapping[str, tuple[str, str]],
    tolerance_mib: int,
) -> tuple[Finding, ...]:
    """Every finding about `clients`, sorted by pod, GPU, kind and pid. `allocations`: pod UID
    → its decoded allocation; `pods`: pod UID → (namespace, name) of every pod on the node
    (so that a pod without an allocation can be named). Clients of no pod, and of a pod not on
    the node, are not judged: nothing says what they were given."""
    found: list[Finding] = []
    per_gpu: dict[tuple[str, int], list[Client]] = {}
    for client in clients:
        uid = client.pod_uid
        if uid is None:
            continue
        alloc = allocations.get(uid)
        if alloc is None:
            if uid in pods and client.server_pid is not None:
                namespace, name = pods[uid]
                found.append(
                    _finding("no-allocation", client, uid, namespace, name, _no_allocation(client))
                )
            continue
        if client.gpu_index is not None:
            if not any(holds(r, client.gpu_index, client.gpu_uuid) for r in alloc.gpus):
                where = ", ".join(str(r.index) for r in alloc.gpus)
                reason = f"runs on GPU {client.gpu_index}; its pod was given GPU {where}"
                found.append(
                    _finding("wrong-gpu", client, uid, alloc.namespace, alloc.name, reason)
                )
                continue
            per_gpu.setdefault((uid, client.gpu_index), []).append(client)
        if alloc.kind == "share":
            problem = _limits_problem(client, alloc)
            if problem:
                found.append(
                    _finding("no-limits", client, uid, alloc.namespace, alloc.name, problem)
                )
    for (uid, index), group in per_gpu.items():
        alloc = allocations[uid]
        if alloc.kind != "share":
            continue
        found += _too_many(alloc, index, group)
        found += _over_memory(alloc, index, group, tolerance_mib)
    order = {kind: i for i, kind in enumerate(FINDING_KINDS)}
    found.sort(
        key=lambda f: (f.namespace, f.name, f.gpu_index or -1, order[f.kind], f.pid)  # stable
    )
    return tuple(found)


def _finding(
    kind: FindingKind, client: Client, uid: str, namespace: str, name: str, reason: str
) -> Finding:
    return Finding(
        kind=kind,
        pid=client.pid,
        server_pid=client.server_pid,
        pod_uid=uid,
        namespace=namespace,
        name=name,
        gpu_index=client.gpu_index,
        reason=reason,
    )


def _no_allocation(client: Client) -> str:
    where = f" on GPU {client.gpu_index}" if client.gpu_index is not None else ""
    return f"runs{where}, but its pod has no mpsched allocation"


def _limits_problem(client: Client, alloc: Allocation) -> str:
    """Why the client's environment is looser than every container's share ("" if it is not).
    An unreadable environment is no finding: nothing was seen."""
    everyone: Sequence[ContainerDemand] = alloc.containers
    if not everyone:
        return ""  # a record that names no containers: nothing to hold the client to
    own = [d for d in everyone if d.name == client.container]
    if client.container is not None and not own:
        # A container of the pod that was given no share reached MPS.
        return f"runs in container {client.container!r}, which was given no GPU share"
    demands = own or everyone
    limits = client.limits
    if limits is None:
        return ""
    if limits.threads is None:
        bad = " (malformed)" if THREADS_ENV in limits.malformed else ""
        return f"started without {THREADS_ENV}{bad}: it may use every SM of the GPU"
    for d in demands:
        threads_ok = limits.threads <= d.threads
        memory_ok = d.memory_mib <= 0 or (
            limits.memory_mib is not None and limits.memory_mib <= d.memory_mib
        )
        if threads_ok and memory_ok:
            return ""
    most_threads = max(d.threads for d in demands)
    budgets = [d.memory_mib for d in demands if d.memory_mib > 0]
    if limits.threads > most_threads:
        return (
            f"started with {THREADS_ENV}={limits.threads:g}, its pod's containers were given "
            f"at most {most_threads}"
        )
    if limits.memory_mib is None:
        bad = " (malformed)" if MEMORY_ENV in limits.malformed else ""
        return f"started without {MEMORY_ENV}{bad}: no memory limit"
    return (
        f"started with {MEMORY_ENV} of {limits.memory_mib} MiB, its pod's containers were "
        f"given at most {max(budgets)} MiB"
    )


def _too_many(alloc: Allocation, index: int, group: Sequence[Client]) -> list[Finding]:
    extra = len(group) - alloc.clients
    if extra <= 0:
        return []
    newest = sorted(group, key=lambda c: (c.started, c.pid), reverse=True)[:extra]
    reason = (
        f"is one of {len(group)} MPS clients of its pod on GPU {index}, allowed {alloc.clients}"
    )
    return [
        _finding("too-many-clients", c, alloc.pod_uid, alloc.namespace, alloc.name, reason)
        for c in sorted(newest, key=lambda c: c.pid)
    ]


def _over_memory(
    alloc: Allocation, index: int, group: Sequence[Client], tolerance_mib: int
) -> list[Finding]:
    allowed = alloc.memory_mib
    used = sum(c.used_mib or 0 for c in group)
    if allowed <= 0 or used <= allowed + tolerance_mib:
        return []
    out = []
    left = used
    reason = f"makes its pod use {used} MiB on GPU {index}, allowed {allowed} MiB"
    for c in sorted(group, key=lambda c: (-(c.used_mib or 0), c.pid)):
        if left <= allowed + tolerance_mib or not c.used_mib:
            break
        out.append(_finding("over-memory", c, alloc.pod_uid, alloc.namespace, alloc.name, reason))
        left -= c.used_mib
    return out
