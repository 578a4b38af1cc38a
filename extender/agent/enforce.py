"""The agent's check of every MPS client against its pod's share, as an adapter: gathers what
`clients.check` judges (the control daemon's servers and their clients, NVML's MPS clients by
GPU with their memory, each process's pod from its cgroup, its limits from
`/proc/<pid>/environ`, its start time from `/proc/<pid>/stat`), reports each finding once per
episode (a Warning Event on the pod, the metrics, the agent's /status), and with
`agent.enforce: terminate` ends the client through the control daemon
(`terminate_client <server pid> <client pid>`: its GPU work stops, the server and the other
clients go on), saying why in the Event. An honest client is never touched: only findings act.

Every file read runs in a worker thread; every daemon command is bounded by the daemon's
command timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from extender.agent.clients import (
    FINDING_KINDS,
    Client,
    Finding,
    check,
    container_id_of,
    limits_of,
)
from extender.agent.inventory import GpuSample
from extender.agent.mps import ControlCommandFailed, ControlDaemon
from extender.agent.procfs import owners_of
from extender.cluster import ClusterError, NodeAgentCluster
from extender.config_agent import AgentSettings
from extender.packing.ledger import Allocation

log = logging.getLogger("mpsched.agent.enforce")

#: Event reasons, stable for alerting.
REASON_OUTSIDE: Final = "MpsClientOutsideShare"
REASON_TERMINATED: Final = "MpsClientTerminated"
#: Bytes read of one environ file: CUDA reads its variables from the first few KiB anyway, and
#: a larger one is not worth a worker's time.
MAX_ENVIRON_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessFacts:
    """What /proc says of one pid: its environment (None: not readable), start time and
    container ID (from its cgroup)."""

    environ: Mapping[str, str] | None
    started: int
    container_id: str | None = None


def _read_process(root: Path, pid: int) -> ProcessFacts | None:
    try:
        with (root / str(pid) / "environ").open("rb") as f:
            data = f.read(MAX_ENVIRON_BYTES)
        stat = (root / str(pid) / "stat").read_text(errors="replace")
        cgroup = (root / str(pid) / "cgroup").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None  # exited
    except PermissionError:
        return ProcessFacts(environ=None, started=0)
    environ: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq:
            environ[name.decode(errors="replace")] = value.decode(errors="replace")
    # Field 22 (starttime), counted after the command's closing parenthesis: the command
    # itself may hold spaces and parentheses.
    fields = stat.rpartition(")")[2].split()
    started = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0
    return ProcessFacts(environ=environ, started=started, container_id=container_id_of(cgroup))


def _read_processes(root: Path, pids: Sequence[int]) -> dict[int, ProcessFacts | None]:
    return {pid: _read_process(root, pid) for pid in pids}


def _pids(text: str) -> list[int]:
    return [int(word) for word in text.split() if word.isdigit()]


@dataclass(slots=True)
class CheckState:
    """What the checks remember between samples, and what /status and the metrics show."""

    findings: tuple[Finding, ...] = ()
    open: set[tuple[str, ...]] = field(default_factory=set)
    terminated: set[int] = field(default_factory=set)
    episodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINDING_KINDS, 0))
    terminations: int = 0
    clients: int = 0


class ClientChecks:
    """The checks of one node's MPS clients; `run()` once per usage sample."""

    def __init__(
        self,
        *,
        node_name: str,
        settings: AgentSettings,
        cluster: NodeAgentCluster,
        control: ControlDaemon,
    ) -> None:
        self._node = node_name
        self._settings = settings
        self._cluster = cluster
        self._control = control
        self.state = CheckState()

    async def servers(self) -> dict[int, int]:
        """Client pid → its server's pid, from the control daemon; empty where it does not
        answer (then no client can be ended, and findings say so)."""
        try:
            servers = _pids(await self._control.command("get_server_list"))
            out: dict[int, int] = {}
            for server in servers:
                for client in _pids(await self._control.command(f"get_client_list {server}")):
                    out[client] = server
        except ControlCommandFailed as exc:
            log.debug("the MPS control daemon's client list is not available: %s", exc)
            return {}
        return out

    async def gather(
        self, samples: Sequence[GpuSample], containers: Mapping[str, str] | None = None
    ) -> tuple[Client, ...]:
        """Every MPS client the daemon or NVML knows, with what the checks need. `containers`:
        container ID → name (`clients.container_names` of the node's pods)."""
        servers = await self.servers()
        on_gpu: dict[int, tuple[int, str, int | None]] = {}
        for gpu in samples:
            for proc in gpu.mps_clients:
                on_gpu[proc.pid] = (gpu.index, gpu.uuid, proc.used_memory_mib)
        pids = sorted(set(servers) | set(on_gpu))
        if not pids:
            return ()
        root = Path(self._settings.proc_root)
        owners = await owners_of(pids, proc_root=str(root))
        facts = await asyncio.to_thread(_read_processes, root, pids)
        clients = []
        for pid in pids:
            seen = facts[pid]
            if seen is None:
                continue  # exited meanwhile
            index, uuid, used = on_gpu.get(pid, (None, None, None))
            clients.append(
                Client(
                    pid=pid,
                    server_pid=servers.get(pid),
                    gpu_index=index,
                    gpu_uuid=uuid,
                    used_mib=used,
                    pod_uid=owners.get(pid),
                    limits=None if seen.environ is None else limits_of(seen.environ),
                    started=seen.started,
                    container=(containers or {}).get(seen.container_id or ""),
                )
            )
        return tuple(clients)

    async def run(
        self,
        samples: Sequence[GpuSample],
        allocations: Mapping[str, Allocation],
        pods: Mapping[str, tuple[str, str]],
        containers: Mapping[str, str] | None = None,
    ) -> tuple[Finding, ...]:
        """One round: gather, judge, report what is new, end what must be ended."""
        clients = await self.gather(samples, containers)
        findings = check(
            clients,
            allocations,
            pods=pods,
            tolerance_mib=self._settings.over_share_tolerance_mib,
        )
        state = self.state
        state.clients = len(clients)
        state.findings = findings
        live = {c.pid for c in clients}
        state.terminated &= live  # a pid gone is a pid the system may hand out again
        keys = {f.key for f in findings}
        terminate = self._settings.enforce == "terminate"
        for finding in findings:
            if finding.key not in state.open:
                state.episodes[finding.kind] += 1
                await self._report(finding, terminate=terminate)
            if terminate and finding.pid not in state.terminated:
                await self._terminate(finding)
        state.open = keys
        return findings

    async def _report(self, finding: Finding, *, terminate: bool) -> None:
        action = ""
        if terminate and finding.server_pid is not None:
            action = "; ending it"
        elif terminate:
            action = "; its MPS server is not known, so it cannot be ended"
        message = f"on node {self._node}: {finding.text}{action}"
        log.warning(
            "pod %s/%s: %s",
            finding.namespace,
            finding.name,
            message,
            extra={"pod": f"{finding.namespace}/{finding.name}", "outcome": finding.kind},
        )
        await self._event(finding, REASON_OUTSIDE, message)

    async def _terminate(self, finding: Finding) -> None:
        if finding.server_pid is None:
            return
        command = f"terminate_client {finding.server_pid} {finding.pid}"
        try:
            answer = await self._control.command(command)
        except ControlCommandFailed as exc:
            log.warning("could not end MPS client %d: %s", finding.pid, exc)
            return
        self.state.terminated.add(finding.pid)
        self.state.terminations += 1
        said = f" (the daemon said: {answer})" if answer else ""
        message = (
            f"on node {self._node}: ended MPS client pid {finding.pid} of server "
            f"{finding.server_pid}: it {finding.reason}{said}"
        )
        log.warning("pod %s/%s: %s", finding.namespace, finding.name, message)
        await self._event(finding, REASON_TERMINATED, message)

    async def _event(self, finding: Finding, reason: str, message: str) -> None:
        try:
            await self._cluster.record_event(
                namespace=finding.namespace,
                name=finding.name,
                uid=finding.pod_uid,
                reason=reason,
                message=message,
                warning=True,
            )
        except ClusterError as exc:
            log.warning("recording a %s Event failed: %s", reason, exc)

    def status(self) -> dict[str, object]:
        """The checks' part of the agent's /status."""
        s = self.state
        return {
            "enforce": self._settings.enforce,
            "clients": s.clients,
            "episodes": dict(s.episodes),
            "terminated": s.terminations,
            "outsideShare": [
                {
                    "kind": f.kind,
                    "pod": f"{f.namespace}/{f.name}",
                    "pid": f.pid,
                    "server": f.server_pid,
                    "gpu": f.gpu_index,
                    "reason": f.text,
                }
                for f in s.findings
            ],
        }


def pod_names(pods: Iterable[Mapping[str, object]]) -> dict[str, tuple[str, str]]:
    """Pod UID → (namespace, name) of the listed pods (malformed entries skipped)."""
    out: dict[str, tuple[str, str]] = {}
    for pod in pods:
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            continue
        uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str):
            out[uid] = (ns, name)
    return out
