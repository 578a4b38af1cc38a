"""The node agent's runtime: one `NodeAgent` per node ties discovery, the MPS daemon, the Node's
published facts and the usage samples together.

It decides nothing itself: what to publish and what to write come from `inventory`, who is over
their share from `usage`. It owns the order of things at start (discover, set compute modes,
then start the daemon), the two loops (publish on every daemon change and every sample
interval; sample usage every interval), the Events it records on state changes, and the
snapshot it hands the metrics. An API server that does not answer only delays a write: the loop
keeps its state and writes at the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.agent.clients import FINDING_KINDS, container_names
from extender.agent.deviceplugin import DevicePlugin
from extender.agent.enforce import ClientChecks, pod_names
from extender.agent.inventory import (
    AGENT_KEY,
    MPS_READY_LABEL,
    advertised_slots,
    agent_record,
    device_plugin_gpu_ids,
    inventory_from_discovery,
    node_patch,
    published_state,
    shared_indices,
)
from extender.agent.metrics import AgentMetrics, AgentSnapshot, GpuSnapshot, PodSnapshot
from extender.agent.mps import ControlCommandFailed, ControlDaemon, DaemonHealth
from extender.agent.nvml import EXCLUSIVE_PROCESS, Discovery, GpuSample, Nvml, NvmlError
from extender.agent.podresources import PodResourcesError, device_plugin_gpus
from extender.agent.procfs import owners_of
from extender.agent.usage import UsageReport, allocations_of, assess
from extender.cluster import ClusterError, JsonObject, NodeAgentCluster
from extender.config import Config
from extender.packing.codec import INVENTORY_KEY, encode_inventory
from extender.packing.model import NodeInventory

log = logging.getLogger("mpsched.agent")

#: Event reasons, stable for alerting (`kubectl get events --field-selector reason=...`).
REASON_MPS_DOWN = "MpsDown"
REASON_MPS_READY = "MpsReady"
REASON_FOREIGN = "ForeignMpsDaemon"
REASON_NVML = "NvmlFailing"
REASON_OVER_SHARE = "GpuShareExceeded"


class NodeMissing(Exception):
    """The Node named by --node-name does not exist."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """What one publishing round found and did."""

    inventory: NodeInventory | None
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    #: True when the Node differed and was patched.
    wrote: bool


@dataclass(slots=True)
class _Seen:
    """What the loops remember between rounds (owned by the one NodeAgent)."""

    discovery: Discovery | None = None
    nvml_problem: str = ""
    nvml_errors: int = 0
    state: str = ""
    over_share: set[str] = field(default_factory=set)
    usage: UsageReport | None = None
    samples: tuple[GpuSample, ...] = ()
    #: GPUs pods hold through NVIDIA's device plugin, as kubelet last said (empty: none, or
    #: kubelet's socket is not mounted).
    device_plugin: tuple[str, ...] = ()


class NodeAgent:
    """The agent of one node. `run()` until cancelled; `publish()` for one round (`--once`)."""

    def __init__(
        self,
        *,
        node_name: str,
        config: Config,
        nvml: Nvml,
        cluster: NodeAgentCluster,
        daemon: ControlDaemon | None,
        metrics: AgentMetrics | None = None,
        plugin: DevicePlugin | None = None,
    ) -> None:
        self.node_name = node_name
        self.plugin = plugin
        self._config = config
        self._nvml = nvml
        self._cluster = cluster
        self._daemon = daemon
        self.metrics = metrics or AgentMetrics()
        self._seen = _Seen()
        # Commands go through our daemon's supervisor, or one that only talks to the pipe.
        self._control = daemon or ControlDaemon(
            config.agent.mps, pipe_directory=config.webhook.pipe_directory, multi_user=False
        )
        self.checks = ClientChecks(
            node_name=node_name, settings=config.agent, cluster=cluster, control=self._control
        )
        #: Set once a round has published (readiness of the agent's own pod).
        self.published = asyncio.Event()

    @property
    def nvml_problem(self) -> str:
        """Why the last discovery failed (empty when it did not)."""
        return self._seen.nvml_problem

    # -- one round ------------------------------------------------------------------------

    async def discover(self) -> Discovery | None:
        """Discover the GPUs; on an NVML failure keep the last good discovery and remember the
        problem, so that the round publishes the GPUs as down rather than nothing."""
        try:
            discovery = await self._nvml.discover()
        except NvmlError as exc:
            if str(exc) != self._seen.nvml_problem:
                log.warning("NVML: %s", exc)
            self._seen.nvml_problem = str(exc)
            self._seen.nvml_errors += 1
            return self._seen.discovery
        if self._seen.nvml_problem:
            log.info("NVML answers again")
        self._seen.nvml_problem = ""
        self._seen.discovery = discovery
        return discovery

    async def daemon_health(self) -> DaemonHealth:
        """The daemon's health: the supervisor's latest, or one probe when there is none."""
        if self._daemon is not None:
            return self._daemon.health()
        try:
            await self._control.command("get_server_list")
        except ControlCommandFailed as exc:
            return DaemonHealth(state="down", reason=str(exc), pid=None, restarts=0)
        return DaemonHealth(state="ready", reason="", pid=None, restarts=0)

    async def publish(self) -> Published:
        """One round: discover, read the Node, write what differs (nothing when nothing does)."""
        discovery = await self.discover()
        node = await self._node()
        labels = _labels(node)
        health = await self.daemon_health()
        state, reason = published_state(health.state, health.reason, self._seen.nvml_problem)
        annotations: dict[str, str] = {}
        inventory = None
        if discovery is not None:
            inventory = inventory_from_discovery(
                self.node_name,
                discovery,
                labels=labels,
                budgets=self._config.budgets,
                mps="ready" if state == "ready" else "down",
            )
            annotations[INVENTORY_KEY] = encode_inventory(inventory)
        annotations[AGENT_KEY] = agent_record(
            discovery,
            mps_state=state,
            reason=reason,
            device_plugin_gpus=self._seen.device_plugin,
        )
        wanted_labels = {MPS_READY_LABEL: "true" if state == "ready" else "false"}
        patch = node_patch(node, annotations=annotations, labels=wanted_labels)
        if patch is not None:
            await self._cluster.patch_node_metadata(self.node_name, patch)
        await self._note_state(state, reason)
        if self.plugin is not None:
            slots = advertised_slots(
                inventory, ready=state == "ready", budgets=self._config.budgets
            )
            await self.plugin.update(slots)
        self.published.set()
        self._update_metrics(inventory, health)
        return Published(
            inventory=inventory, annotations=annotations, labels=wanted_labels, wrote=bool(patch)
        )

    async def sample(self) -> UsageReport | None:
        """One usage sample: what each pod's MPS clients use against its share. A pod over its
        share gets one Warning Event when it goes over (not one per sample)."""
        try:
            samples = await self._nvml.sample()
        except NvmlError as exc:
            self._seen.nvml_errors += 1
            log.warning("NVML sample failed: %s", exc)
            return None
        pids = {c.pid for s in samples for c in s.mps_clients}
        owners = await owners_of(pids, proc_root=self._config.agent.proc_root)
        try:
            pods = await self._cluster.list_node_pods(self.node_name)
        except ClusterError as exc:
            log.warning("cannot list the pods of node %s: %s", self.node_name, exc)
            return None
        allocations = allocations_of(pods, self.node_name)
        for bad in allocations.unreadable:
            log.debug("pod %s/%s: allocation unreadable: %s", bad.namespace, bad.name, bad.reason)
        report = assess(
            samples,
            owners,
            allocations.by_uid,
            tolerance_mib=self._config.agent.over_share_tolerance_mib,
        )
        over = {p.pod_uid for p in report.pods if p.over_share}
        for usage in report.pods:
            if usage.over_share and usage.pod_uid not in self._seen.over_share:
                log.warning(
                    "pod %s/%s over its share: %s",
                    usage.namespace,
                    usage.name,
                    usage.reason,
                    extra={
                        "pod": f"{usage.namespace}/{usage.name}",
                        "node": self.node_name,
                        "outcome": "over_share",
                    },
                )
                await self._cluster.record_event(
                    namespace=usage.namespace,
                    name=usage.name,
                    uid=usage.pod_uid,
                    reason=REASON_OVER_SHARE,
                    message=f"on node {self.node_name} GPU {usage.gpu_index}: {usage.reason}",
                    warning=True,
                )
        self._seen.over_share = over
        names = pod_names(pods)
        for bad in allocations.unreadable:  # mpsched's pods, but nothing to judge them by
            names.pop(bad.pod_uid, None)
        await self.checks.run(samples, allocations.by_uid, names, container_names(pods))
        self._seen.usage = report
        self._seen.samples = samples
        await self._read_device_plugin()
        return report

    async def _read_device_plugin(self) -> None:
        """Which GPUs pods hold through NVIDIA's device plugin, from kubelet's PodResources
        API where its socket is mounted; published in the agent record."""
        try:
            held = await device_plugin_gpus(
                self._config.agent.pod_resources_socket,
                timeout_s=self._config.agent.nvml_timeout_seconds,
            )
        except PodResourcesError as exc:
            log.warning("kubelet PodResources: %s", exc)
            return
        self._seen.device_plugin = device_plugin_gpu_ids(held or {})

    # -- the loops ------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before the daemon starts: put every GPU MPS will share in EXCLUSIVE_PROCESS (where
        configured), so that the MPS server is the one process holding it."""
        discovery = await self.discover()
        if (
            discovery is None
            or not self._config.agent.mps.exclusive_process
            or self._daemon is None
        ):
            return
        for index in shared_indices(discovery, self._config.budgets):
            gpu = discovery.gpus[index]
            if gpu.compute_mode == EXCLUSIVE_PROCESS:
                continue
            try:
                await self._nvml.set_compute_mode(index, EXCLUSIVE_PROCESS)
            except NvmlError as exc:
                # Not fatal: MPS works in DEFAULT mode too, only without the guarantee that
                # nothing bypasses it.
                log.warning(
                    "GPU %d stays in compute mode %s: %s",
                    index,
                    gpu.compute_mode,
                    exc,
                    extra={"node": self.node_name, "gpu": index},
                )

    async def run(self) -> None:
        """Until cancelled: the daemon's supervision, publishing and sampling, side by side."""
        await self.prepare()
        async with asyncio.TaskGroup() as group:
            if self._daemon is not None:
                group.create_task(self._daemon.run(), name="mps-daemon")
            if self.plugin is not None:
                group.create_task(self.plugin.run(), name="device-plugin")
            group.create_task(self._publish_loop(), name="publish")
            group.create_task(self._sample_loop(), name="sample")

    async def _publish_loop(self) -> None:
        interval = self._config.agent.sample_interval_seconds
        while True:
            try:
                await self.publish()
            except (ClusterError, NodeMissing) as exc:
                log.warning("publishing node %s failed, retrying: %s", self.node_name, exc)
            except Exception:
                # A bug must not end the agent: its exit ends the MPS daemon and with it every
                # client on the node. Logged in full, and tried again next round.
                log.exception("publishing node %s failed unexpectedly", self.node_name)
            await self._next_change(interval)

    async def _sample_loop(self) -> None:
        interval = self._config.agent.sample_interval_seconds
        while True:
            try:
                await self.sample()
            except ClusterError as exc:
                log.warning("recording a usage Event failed: %s", exc)
            except Exception:
                log.exception("sampling usage failed unexpectedly")  # as in _publish_loop
            await asyncio.sleep(interval)

    async def _next_change(self, timeout_s: float) -> None:
        """Wait for the daemon's next state change, or `timeout_s`, whichever comes first."""
        if self._daemon is None:
            await asyncio.sleep(timeout_s)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._daemon.changed()

    # -- helpers --------------------------------------------------------------------------

    async def _node(self) -> JsonObject:
        node = await self._cluster.get_node(self.node_name)
        if node is None:
            raise NodeMissing(f"node {self.node_name!r} does not exist")
        return node

    async def _note_state(self, state: str, reason: str) -> None:
        """Log and record an Event on the Node when the published state changes."""
        before, self._seen.state = self._seen.state, state
        # "off": the daemon is not started yet (or stopped): not news, an agent starting.
        if state == before or state == "off":
            return
        if state == "ready":
            event, warning, text = REASON_MPS_READY, False, "MPS is ready"
        elif state == "foreign":
            event, warning, text = REASON_FOREIGN, True, f"another MPS daemon runs: {reason}"
        elif self._seen.nvml_problem:
            event, warning, text = REASON_NVML, True, f"GPUs published down: {reason}"
        else:
            event, warning, text = REASON_MPS_DOWN, True, f"MPS is down: {reason}"
        if before or state != "ready":
            (log.warning if warning else log.info)("node %s: %s", self.node_name, text)
            await self._cluster.record_node_event(
                node=self.node_name, reason=event, message=text, warning=warning
            )

    def _update_metrics(self, inventory: NodeInventory | None, health: DaemonHealth) -> None:
        samples = {s.index: s for s in self._seen.samples}
        gpus = tuple(
            GpuSnapshot(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                mps=g.mps,
                utilization_percent=s.utilization_percent if s is not None else None,
                memory_used_mib=s.memory_used_mib if s is not None else None,
                memory_total_mib=g.memory_mib,
                mps_clients=len(s.mps_clients) if s is not None else 0,
            )
            for g in (inventory.gpus if inventory else ())
            for s in [samples.get(g.index)]
        )
        usage = self._seen.usage
        pods = tuple(PodSnapshot.of(p) for p in (usage.pods if usage else ()))
        self.metrics.update(
            AgentSnapshot(
                node=self.node_name,
                gpus=gpus,
                pods=pods,
                daemon_up=health.state == "ready",
                daemon_restarts=health.restarts,
                nvml_errors=self._seen.nvml_errors,
                unknown_clients=len(usage.unknown_clients) if usage else 0,
                **self._check_figures(),
            )
        )

    def _check_figures(self) -> dict[str, Any]:
        state = self.checks.state
        now = dict.fromkeys(FINDING_KINDS, 0)
        for finding in state.findings:
            now[finding.kind] += 1
        return {
            "outside_share": now,
            "outside_share_episodes": dict(state.episodes),
            "clients_terminated": state.terminations,
        }


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    meta = node.get("metadata")
    raw = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
