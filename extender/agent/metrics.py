"""Prometheus metrics of the node agent: per GPU what NVML measures (memory, utilisation, MPS
clients) and the MPS state published for it; per pod and GPU what its MPS clients use against
its share; the MPS control daemon's health; NVML errors; clients that belong to no known share.

Owns metric names, help texts and units; nothing here decides anything. Every family is
computed at scrape time from the latest `AgentSnapshot` the node loop hands to `update` (an
immutable object swapped in whole, so a scrape in a worker thread reads one consistent
snapshot without a lock), in the `CollectorRegistry` of one `AgentMetrics` object, never the
process-global default registry.

Names: `mpsched_agent_` prefix; memory in MiB (`_mib`, NVML's and the shares' own unit, so a
figure reads the same as in an allocation), utilisation in percent (`_percent`, as NVML gives
it); `_total` on counters (added by prometheus-client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.agent.usage import PodUsage
from extender.metrics import CONTENT_TYPE as CONTENT_TYPE

#: The MPS states a GPU's series are written for (each 1 or 0): the published inventory's, and
#: "foreign" (a control daemon the agent did not start).
MPS_STATES: Final = ("ready", "down", "foreign", "off")
_GPU_LABELS: Final = ["node", "gpu"]
_POD_LABELS: Final = ["node", "namespace", "pod", "uid", "gpu"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSnapshot:
    """One GPU as last sampled. None: NVML could not tell (NotSupported on MIG, a failed
    call); the series is then left out rather than shown as 0."""

    index: int
    uuid: str
    model: str
    #: The MPS state published for the GPU (`ready`, `down`, `off`, `foreign`).
    mps: str
    utilization_percent: int | None
    memory_used_mib: int | None
    memory_total_mib: int
    mps_clients: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSnapshot:
    """One pod's MPS clients on one GPU against its share (`usage.PodUsage`). `allowed_mib`
    None: the share has no memory budget."""

    namespace: str
    name: str
    uid: str
    gpu_index: int
    used_mib: int
    allowed_mib: int | None
    over_share: bool
    clients: int = 0

    @classmethod
    def of(cls, usage: PodUsage) -> PodSnapshot:
        return cls(
            namespace=usage.namespace,
            name=usage.name,
            uid=usage.pod_uid,
            gpu_index=usage.gpu_index,
            used_mib=usage.used_mib,
            allowed_mib=usage.allowed_mib,
            over_share=usage.over_share,
            clients=usage.clients,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSnapshot:
    """What the agent's metrics show, taken at one instant by the node loop."""

    node: str
    gpus: tuple[GpuSnapshot, ...] = ()
    pods: tuple[PodSnapshot, ...] = ()
    #: The MPS control daemon answers (state "ready").
    daemon_up: bool = False
    #: Times the agent restarted the control daemon since it started.
    daemon_restarts: int = 0
    #: NVML calls that failed (or hung past the timeout) since the agent started.
    nvml_errors: int = 0
    #: MPS clients in the last sample that belong to no pod with an mpsched allocation.
    unknown_clients: int = 0
    #: Clients outside their share in the last check, by finding kind (`clients.FindingKind`).
    outside_share: Mapping[str, int] = field(default_factory=dict)
    #: Episodes of clients outside their share since the agent started, by kind.
    outside_share_episodes: Mapping[str, int] = field(default_factory=dict)
    #: Clients the agent ended through the control daemon (`agent.enforce: terminate`).
    clients_terminated: int = 0


@dataclass(slots=True, eq=False)  # registries key collectors by identity
class _AgentCollector(Collector):
    #: The latest snapshot and the wall-clock time (Unix seconds) it was handed over, swapped
    #: in as one object so that a scrape never pairs a snapshot with another one's time.
    latest: tuple[AgentSnapshot, float] | None = None

    def collect(self) -> Iterator[Metric]:
        latest = self.latest  # read once: update() may swap it meanwhile
        if latest is None:
            return
        s, updated_at = latest
        node = s.node
        yield _node_gauge(
            "mpsched_agent_snapshot_timestamp_seconds",
            "When the node loop last handed over a sample (Unix time): a stale value means "
            "the loop is stuck.",
            node,
            updated_at,
        )
        yield from _gpu_families(s)
        yield from _pod_families(s)
        yield _node_gauge(
            "mpsched_agent_mps_daemon_up",
            "1 when the MPS control daemon answers (state ready), else 0.",
            node,
            1 if s.daemon_up else 0,
        )
        yield _node_counter(
            "mpsched_agent_mps_daemon_restarts",
            "Times the agent restarted the MPS control daemon.",
            node,
            s.daemon_restarts,
        )
        yield _node_counter(
            "mpsched_agent_nvml_errors",
            "NVML calls that failed or did not return within the timeout.",
            node,
            s.nvml_errors,
        )
        yield _node_gauge(
            "mpsched_agent_unknown_mps_clients",
            "MPS clients in the last sample that belong to no pod with an mpsched allocation "
            "(device-plugin pods, host processes, pods whose allocation does not decode).",
            node,
            s.unknown_clients,
        )
        outside = GaugeMetricFamily(
            "mpsched_agent_mps_clients_outside_share",
            "MPS clients outside their pod's share in the last check, by kind: no-limits, "
            "wrong-gpu, too-many-clients, over-memory, no-allocation.",
            labels=["kind", "node"],
        )
        episodes = CounterMetricFamily(
            "mpsched_agent_mps_client_episodes",
            "Episodes of MPS clients outside their share (each reported once), by kind.",
            labels=["kind", "node"],
        )
        for kind in sorted(set(s.outside_share) | set(s.outside_share_episodes)):
            outside.add_metric([kind, node], s.outside_share.get(kind, 0))
            episodes.add_metric([kind, node], s.outside_share_episodes.get(kind, 0))
        yield outside
        yield episodes
        yield _node_counter(
            "mpsched_agent_mps_clients_terminated",
            "MPS clients the agent ended through the control daemon (agent.enforce: terminate).",
            node,
            s.clients_terminated,
        )


def _node_gauge(name: str, text: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=["node"])
    family.add_metric([node], value)
    return family


def _node_counter(name: str, text: str, node: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, text, labels=["node"])
    family.add_metric([node], value)
    return family


def _gpu_families(s: AgentSnapshot) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "mpsched_agent_gpu_info",
        "GPU identity (NVML uuid and name); always 1.",
        labels=[*_GPU_LABELS, "uuid", "model"],
    )
    state = GaugeMetricFamily(
        "mpsched_agent_gpu_mps_state",
        "MPS state published for the GPU: 1 for the state it is in, 0 for the others.",
        labels=[*_GPU_LABELS, "state"],
    )
    used = GaugeMetricFamily(
        "mpsched_agent_gpu_memory_used_mib",
        "Device memory in use on the GPU, as NVML reports it, in MiB.",
        labels=_GPU_LABELS,
    )
    total = GaugeMetricFamily(
        "mpsched_agent_gpu_memory_total_mib",
        "Device memory of the GPU, as NVML reports it, in MiB.",
        labels=_GPU_LABELS,
    )
    util = GaugeMetricFamily(
        "mpsched_agent_gpu_utilization_percent",
        "Percent of the last sample period in which a kernel ran on the GPU (NVML; not SM "
        "occupancy). Absent where NVML does not measure it (MIG).",
        labels=_GPU_LABELS,
    )
    clients = GaugeMetricFamily(
        "mpsched_agent_gpu_mps_clients",
        "MPS client processes on the GPU, as NVML lists them.",
        labels=_GPU_LABELS,
    )
    for g in s.gpus:
        key = [s.node, str(g.index)]
        info.add_metric([*key, g.uuid, g.model], 1)
        for known in (*MPS_STATES, *(() if g.mps in MPS_STATES else (g.mps,))):
            state.add_metric([*key, known], 1 if g.mps == known else 0)
        if g.memory_used_mib is not None:
            used.add_metric(key, g.memory_used_mib)
        total.add_metric(key, g.memory_total_mib)
        if g.utilization_percent is not None:
            util.add_metric(key, g.utilization_percent)
        clients.add_metric(key, g.mps_clients)
    yield from (info, state, used, total, util, clients)


def _pod_families(s: AgentSnapshot) -> Iterator[Metric]:
    used = GaugeMetricFamily(
        "mpsched_agent_pod_memory_used_mib",
        "Device memory the pod's MPS clients use on the GPU, in MiB.",
        labels=_POD_LABELS,
    )
    allowed = GaugeMetricFamily(
        "mpsched_agent_pod_memory_allowed_mib",
        "Pinned device memory the pod's share allows on the GPU, in MiB (0 on a GPU it was "
        "not given; absent where the share has no memory budget).",
        labels=_POD_LABELS,
    )
    clients = GaugeMetricFamily(
        "mpsched_agent_pod_mps_clients",
        "MPS client processes of the pod on the GPU.",
        labels=_POD_LABELS,
    )
    over = GaugeMetricFamily(
        "mpsched_agent_pod_over_share",
        "1 when the pod's MPS clients exceed its share on the GPU (memory beyond the "
        "tolerance, more clients than allocated, or a GPU it was not given), else 0.",
        labels=_POD_LABELS,
    )
    for p in s.pods:
        key = [s.node, p.namespace, p.name, p.uid, str(p.gpu_index)]
        used.add_metric(key, p.used_mib)
        if p.allowed_mib is not None:
            allowed.add_metric(key, p.allowed_mib)
        clients.add_metric(key, p.clients)
        over.add_metric(key, 1 if p.over_share else 0)
    yield from (used, allowed, clients, over)


class AgentMetrics:
    """The agent's metrics and their registry. Nothing is exposed before the first `update`
    (an agent that has not sampled yet has nothing true to say)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._clock = clock
        self._collector = _AgentCollector()
        self.registry.register(self._collector)

    @property
    def snapshot(self) -> AgentSnapshot | None:
        latest = self._collector.latest
        return None if latest is None else latest[0]

    def update(self, snapshot: AgentSnapshot) -> None:
        """Show `snapshot` from the next scrape on."""
        self._collector.latest = (snapshot, self._clock())

    def render(self) -> bytes:
        """The text exposition (format 0.0.4, `CONTENT_TYPE`) of the latest snapshot. Safe in
        a worker thread while the loop updates."""
        return generate_latest(self.registry)
