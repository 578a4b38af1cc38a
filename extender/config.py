"""The mpsched configuration (docs/design.md, Configuration): one YAML document → a frozen, typed
`Config`.

Owns the document's schema, its defaults (each with its unit and reason) and validation.
Validation collects every problem at once, each with its dotted path ("budgets.oversubscription:
must be a number ≥ 1.0, got 'x'"), and raises one `ConfigError` listing them all, so that a
ConfigMap is fixed in one round. The packing core's own settings types (`BudgetSettings`,
`PolicySettings`) are reused as they are; `budgets.uid_isolation` is set from `isolation:`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

import yaml

from extender.config_schema import (
    MAX_DOCUMENT_BYTES,
    Bad,
    Check,
    Checks,
    DuplicateKeyLoader,
    Nested,
    Reader,
    absolute_path,
    document_problem,
    fields_of,
    integer,
    label_map,
    number,
    optional,
    show,
    string,
)
from extender.packing.errors import InvalidRequest
from extender.packing.model import CUDA131_CLIENT_LIMIT, VOLTA_CLIENT_LIMIT, ComputeCapability
from extender.packing.policies import POLICY_NAMES, PolicySettings
from extender.packing.settings import BudgetSettings, NodeSelection

API_VERSION: Final = "mpsched.io/v1alpha1"
KIND: Final = "MpschedConfig"
MIB: Final = 2**20


class ConfigError(Exception):
    """The document is not a valid configuration; `problems` lists every reason, one per item."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class ConfigReadError(ConfigError):
    """The configuration file could not be read at all (missing, unreadable, not UTF-8)."""


def _labels(value: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolationSettings:
    """Which pods may share a GPU's MPS server."""

    #: One MPS server serves one Linux UID; clients of another UID wait until it is idle (MPS doc
    #: §2.3.1.1). True keeps pods of different effective runAsUser off each other's GPUs.
    uid_isolation: bool = True
    #: Nodes whose labels include all of these run MPS multi-user (any UID shares). None: none do,
    #: because multi-user mode lets one user's fault kill another user's clients (MPS doc §3.3.1).
    multi_user_node_selector: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """Which nodes the extender considers."""

    #: Only nodes whose labels include all of these are scheduled onto. Empty: every node that
    #: has a GPU inventory (annotation or labels); nodes without one never fit GPU pods anyway.
    selector: Mapping[str, str] = field(default_factory=_labels)


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectSettings:
    """What the admission webhook adds to a container that asks for `mpsched.io/*` (each can be
    turned off for clusters where a device plugin already does it). Whole-GPU containers get
    the visible devices only: they are no MPS clients."""

    #: NVIDIA_VISIBLE_DEVICES through a fieldRef to the allocation's visible-devices annotation.
    visible_devices: bool = True
    #: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per share container (fieldRef to its threads value).
    thread_percentage: bool = True
    #: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per share container that has a memory budget.
    memory_limit: bool = True
    #: The MPS connection: with `delivery: devicePlugin` the `mpsched.io/mps` resource (the node
    #: agent's device plugin mounts the pipe directory and sets CUDA_MPS_PIPE_DIRECTORY); with
    #: `delivery: hostIPC` CUDA_MPS_PIPE_DIRECTORY plus a hostPath mount of the pipe directory.
    pipe_directory: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSettings:
    """The admission webhook (`mpsched webhook`, its own command and Deployment): what it
    injects into GPU pods when they are created, and whom it trusts to write the allocation."""

    #: Host path of the MPS pipe directory, mounted at the same path. /tmp/nvidia-mps is NVIDIA's
    #: default (the `nvidia-mps` folder of the system temp dir) and what GKE's MPS nodes use.
    pipe_directory: str = "/tmp/nvidia-mps"
    #: How a share container reaches the node's MPS daemon. "devicePlugin": the webhook adds one
    #: `mpsched.io/mps` to the container and the node agent's device plugin mounts the pipe
    #: directory and the daemon's /dev/shm, outside the pod spec (Pod Security `baseline` holds).
    #: "hostIPC": the pod gets hostIPC and a hostPath volume of the pipe directory, for clusters
    #: that cannot run the device plugin; every container of such a pod shares the node's IPC
    #: namespace, and namespaces must allow `privileged` pods.
    delivery: Literal["devicePlugin", "hostIPC"] = "devicePlugin"
    #: CUDA_DEVICE_MAX_CONNECTIONS set in share containers that do not set it; a larger value is
    #: refused. 2 is the default of Volta MPS clients: each connection above it takes work queues
    #: from the shared pool, so fewer clients fit on the GPU than the budget counts.
    device_max_connections: int = 2
    #: Taint key of the GPU nodes: GPU pods get a toleration of it (operator Exists, effect
    #: NoSchedule) unless one of theirs already tolerates it. nvidia.com/gpu: what GKE, the NVIDIA
    #: GPU operator's docs and most GPU node pools taint with. None: add none.
    tolerate_taint: str | None = "nvidia.com/gpu"
    #: Scheduler for pods asking for `mpsched.io/*` whose schedulerName is unset or
    #: "default-scheduler" (another scheduler named on purpose is left alone). None: leave it;
    #: set it to mpsched's own kube-scheduler's name where the extender runs beside one.
    scheduler_name: str | None = None
    #: runtimeClassName for such pods when they name none (e.g. "nvidia" where the NVIDIA
    #: container runtime is not the node's default). None: leave it.
    runtime_class_name: str | None = None
    #: The request username (`userInfo.username`) that may write `mpsched.io/` annotations and
    #: preset nodeName: mpsched's own service account, as deploy/base/rbac.yaml creates it.
    service_account: str = "system:serviceaccount:mpsched-system:mpsched"
    #: Bytes. An object is at most ~1.5 MiB (etcd's request limit); an UPDATE review carries two
    #: (object, oldObject): 4 MiB admits that with room and refuses larger bodies unread.
    max_body_bytes: int = 4 * MIB
    inject: InjectSettings = field(default_factory=InjectSettings)


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsDaemonSettings:
    """The MPS control daemon the node agent (`mpsched agent`) runs as its child. Its pipe
    directory is `webhook.pipeDirectory`: the one path the daemon, the webhook's hostPath mount
    and every client must agree on (MPS doc §1.4)."""

    #: False: the agent only watches a daemon that something else runs in the pipe directory
    #: (GKE's node image, for one) and reports its health; it starts and restarts nothing.
    manage: bool = True
    #: The control binary, by name on PATH or absolute. The NVIDIA container toolkit mounts the
    #: driver's utilities, this one included, into containers that ask for them.
    control_binary: str = "nvidia-cuda-mps-control"
    #: Host path of the daemon's logs (control.log, server.log). NVIDIA's default.
    log_directory: str = "/var/log/nvidia-mps"
    #: Put every shared GPU in compute mode EXCLUSIVE_PROCESS before the daemon starts, as
    #: NVIDIA recommends: the MPS server is then the one process holding the GPU, and a
    #: container that bypasses MPS cannot create a context beside it (MPS doc §2.3.1.2).
    exclusive_process: bool = True
    #: Appended to the daemon's command line on nodes that isolation.multiUserNodeSelector
    #: selects, so that the ledger's UID rule and the daemon agree (MPS doc §3.3.1). Elsewhere
    #: the daemon runs one server per UID, which is why the ledger keeps UIDs apart.
    multi_user_flag: str = "-multiuser-server"
    #: Seconds between health probes (`get_server_list` through the control pipe). 5: a dead
    #: daemon is published `mps: down` within seconds, at one short subprocess per probe.
    health_interval_seconds: float = 5.0
    #: Seconds one control command may take before the daemon counts as unhealthy. A healthy
    #: daemon answers in milliseconds; 5 s tolerates a loaded node.
    command_timeout_seconds: float = 5.0
    #: Seconds before the first restart of a daemon that died; doubled per failure in a row.
    restart_backoff_seconds: float = 1.0
    #: Seconds the restart backoff grows to at most: one minute keeps a broken driver from
    #: being hammered, and a fixed one is back within a minute.
    restart_backoff_max_seconds: float = 60.0
    #: Seconds a restarted daemon must stay healthy for the backoff to reset.
    stable_after_seconds: float = 60.0
    #: Other pipe directories where another MPS daemon may live (NVIDIA's device plugin uses
    #: /run/nvidia/mps/<resource>/pipe). A live daemon there, or one in our own directory that
    #: is not our child, is reported (`mps: down`, an Event) and never fought.
    foreign_pipe_directories: tuple[str, ...] = ("/run/nvidia/mps",)


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePluginSettings:
    """The agent's kubelet device plugin for `mpsched.io/mps`, the resource the webhook adds to
    each share-asking container: its Allocate mounts the MPS pipe directory and the daemon's shm
    into the container and sets CUDA_MPS_PIPE_DIRECTORY, so share pods need neither hostIPC
    nor a hostPath volume."""

    #: False: no plugin (clusters on `webhook.delivery: hostIPC`).
    enabled: bool = True
    #: kubelet's device-plugins directory: its registration socket (kubelet.sock) and ours.
    kubelet_directory: str = "/var/lib/kubelet/device-plugins"
    #: Host directory holding the MPS daemon's shared memory (a tmpfs the agent's DaemonSet
    #: mounts there and at the agent's own /dev/shm), given to clients at /dev/shm. Under /run:
    #: a tmpfs on most distributions already, and nothing else's.
    shm_directory: str = "/run/mpsched/shm"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    """The node agent (`mpsched agent`, a DaemonSet on GPU nodes): discovery, the MPS daemon,
    what it publishes on its Node, and what it measures."""

    #: Seconds one NVML call may take before it counts as hung; the agent then reports the
    #: node's GPUs as `mps: down` rather than waiting on a driver in trouble.
    nvml_timeout_seconds: float = 10.0
    #: Seconds between discoveries (a GPU lost, MIG switched) and usage samples.
    sample_interval_seconds: float = 15.0
    #: MiB a pod's MPS clients may use on a GPU beyond its pinned-memory share before it is
    #: reported as over its share. 0: the pinned limit already bounds a well-behaved client.
    over_share_tolerance_mib: int = 0
    #: Port of the agent's /metrics and /healthz listener on the node (all interfaces). 9465:
    #: the port after the extender's metrics port.
    metrics_port: int | None = 9465
    #: kubelet's PodResources socket, read (where mounted) for the GPUs device-plugin pods hold.
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    #: Host /proc as mounted in the agent (hostPID): a client's cgroup names its pod.
    proc_root: str = "/proc"
    #: What the agent does with an MPS client outside its pod's share (no limits in its
    #: environment, a GPU its pod was not given, more clients than declared, over its memory):
    #: "report" (an Event, a metric, /status) or also "terminate" it through the control daemon.
    #: report by default: ending a client ends its GPU work, and the check should first be seen
    #: to judge a cluster's pods right.
    enforce: Literal["report", "terminate"] = "report"
    mps: MpsDaemonSettings = field(default_factory=MpsDaemonSettings)
    device_plugin: DevicePluginSettings = field(default_factory=DevicePluginSettings)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderElectionSettings:
    """The coordination.k8s.io Lease that picks the one serving replica: only the holder
    binds, so that two replicas never promise the same share."""

    #: Off where something else elects the replica: own-scheduler's kube-scheduler holds its
    #: own Lease and calls only the extender beside it.
    enabled: bool = True
    #: Name of the Lease object.
    lease_name: str = "mpsched"
    #: Namespace of the Lease; where the Deployment runs.
    namespace: str = "kube-system"
    #: Seconds. client-go's defaults (15 / 10 / 2): a failover within ~15 s, few API writes.
    lease_duration_seconds: float = 15.0
    #: Seconds the holder keeps trying to renew before it stops serving; below the duration.
    renew_deadline_seconds: float = 10.0
    #: Seconds between tries to take or renew the Lease.
    retry_period_seconds: float = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    """Certificate of the extender listener (`serve`), PEM files; both or neither. The webhook
    takes its own from `mpsched webhook --tls-cert/--tls-key` (a certificate for its Service)."""

    #: The listener's certificate (PEM); with keyFile, the verbs are served over HTTPS.
    cert_file: str | None = None
    #: The certificate's private key (PEM); set both or neither.
    key_file: str | None = None
    #: CA bundle (PEM) that signs kube-scheduler's client certificate (its extender
    #: `tlsConfig.certFile/keyFile`). Set, the verbs listener accepts only clients presenting
    #: such a certificate: required whenever `server.host` is not a loopback address, because
    #: a client that can call /bind decides where pods go.
    client_ca_file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """The extender's HTTP listener (the `serve --host/--port` flags override these)."""

    #: Loopback: the verbs are for kube-scheduler alone, and beside it (mpsched's own scheduler
    #: with the extender as a sidecar) loopback is all it needs. Any other address needs
    #: `tls.clientCaFile`.
    host: str = "127.0.0.1"
    #: 8888: the port deploy/ and the kube-scheduler configurations call `serve` on.
    port: int = 8888
    #: Port of the second listener that serves /metrics and /status (and the probes), so that
    #: Prometheus and operators never need the verbs' port; None serves them on the verbs'
    #: listener. 9464: a free port in Prometheus' exporter range.
    metrics_port: int | None = 9464
    #: Address of that listener. All interfaces: Prometheus scrapes it from another pod. What
    #: it shows (allocations by pod name and uid, per-GPU usage) is documented in
    #: docs/operating.md; restrict it with a NetworkPolicy where that matters.
    metrics_host: str = "0.0.0.0"
    #: Bytes. A filter request with 5,000 node names and a large pod is < 1 MiB; with
    #: nodeCacheCapable=false the full Node objects of 500 nodes reach ~8 MB. 8 MiB admits that
    #: and still stops a runaway body before it costs real memory.
    max_body_bytes: int = 8 * MIB
    #: Seconds a connection may go without a complete request, from its opening or its last
    #: answer; this also bounds a request's headers (a slow loris trickling them). 60 s is well
    #: past the gaps between a scheduler's calls (its client redials at no cost on loopback) and
    #: frees an abandoned connection's file descriptor within a minute.
    idle_timeout_seconds: float = 60.0
    #: Seconds for a request's body once its headers are in. 10 s moves the largest body
    #: (maxBodyBytes) at 7 Mbit/s; kube-scheduler's own httpTimeout defaults to 30 s.
    body_timeout_seconds: float = 10.0
    #: Seconds an answer may wait for a client that stopped reading before the connection is
    #: dropped (it holds the answer's memory and a handler until then).
    send_timeout_seconds: float = 10.0
    #: Open connections past which a new one is closed at once. kube-scheduler needs a handful
    #: (binds run concurrently); 512 stays below the common 1,024 file descriptor limit, and
    #: serve lowers it further to keep 128 descriptors free under whatever the limit is.
    max_connections: int = 512
    #: Bytes. Bodies larger than this take turns and a share of the loop (largeBodyLoopShare):
    #: decoding 1 MiB of JSON holds the loop for ~7 ms; nodeCacheCapable=true bodies stay under
    #: ~200 KB even at 5,000 nodes, nodeCacheCapable=false ones reach ~8 MB.
    large_body_bytes: int = 1 * MIB
    #: The share of the event loop large bodies may use while other requests are waiting, in
    #: (0, 1]. 0.5: other requests get at least half the loop; 1 turns the pacing off (large
    #: bodies still go one at a time).
    large_body_loop_share: float = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSettings:
    """Calls to the Kubernetes API server: every call has a timeout."""

    #: Seconds one API call (a read, a Binding, an Event, a Lease write) may take before it
    #: counts as unanswered. 4: well above a healthy API server's milliseconds, and a read plus
    #: a Binding still fit the bind deadline below.
    request_timeout_seconds: float = 4.0
    #: Seconds a whole /bind may take, API calls included; then the scheduler is answered
    #: Error and a Binding sent but unanswered is held *in doubt* until the API says. Keep it
    #: below kube-scheduler's extender `httpTimeout` (config/kube-scheduler.yaml sets 10s), so
    #: the scheduler hears the outcome instead of giving up first.
    bind_timeout_seconds: float = 8.0
    #: Seconds after a Binding that got no answer during which a pod the API shows unbound may
    #: still be bound by it (the API server finishes a request whose client gave up): its
    #: reservation is held that long, then released. 25: a Binding is one etcd write, done in
    #: milliseconds unless the API server is in trouble, and the reservation is settled within
    #: 30 s of the API answering again.
    in_doubt_seconds: float = 25.0
    #: Record a Normal Event `GpuShareAllocated` on each pod bound with GPUs (which GPU, what
    #: share), for `kubectl describe pod`. It is one more API write per bind, beside
    #: kube-scheduler's own `Scheduled` Event, and one more API call on the extender's event
    #: loop (12 % of serve's CPU samples under scripts/bench-extender, by py-spy); false leaves
    #: the allocation on the pod's `mpsched.io/allocation` annotation only. Warnings are
    #: recorded either way.
    allocation_events: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingSettings:
    """What the commands log, and how."""

    #: The least severe messages written; "debug" adds every decision's details.
    level: Literal["debug", "info", "warning", "error"] = "info"
    #: "text" reads well in a terminal; set "json" in clusters that ship logs to an indexer.
    format: Literal["json", "text"] = "text"


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSettings:
    """Speed-ups that change no answer: each one can be turned off, and then the plain code
    answers the same bytes, more slowly. They exist for the scheduler's speed; turn one off to
    measure what it earns (`scripts/bench-ablation`) or to rule it out when something looks
    wrong. Read at start (a reload says the section needs a restart)."""

    #: The compiled build's C share fit and FGD score (pure build: nothing to turn off).
    native_fit: bool = True
    #: The compiled build's C scaling of prioritize's scores and C writer of its answer.
    native_writer: bool = True
    #: The verbs read and answered on their connection without aiohttp's request machinery.
    fast_path: bool = True
    #: Compute the filter call forecast next between the scheduler's calls.
    forecast: bool = True
    #: Hold watch events and Events while a filter→prioritize cycle is open.
    cycle_delay: bool = True
    #: Write prioritize's answer in the gap after filter's, before it is asked for.
    prepared_priorities: bool = True


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model's facts for traces that name models only (the simulator)."""

    memory_mib: int
    compute_capability: ComputeCapability


def _cc(text: str) -> ComputeCapability:
    return ComputeCapability.parse(text)


#: Models of the FGD benchmark trace (the FGD paper's Alibaba trace) with the memory totals
#: NVML reports for those models (the lowest seen). G2 and G3 are undisclosed Alibaba models:
#: assumed Volta-class with 32 GiB, as config/bench-openb.yaml does; a guess, not a fact.
DEFAULT_GPU_MODELS: Final = MappingProxyType(
    {
        "T4": GpuModel(15109, _cc("7.5")),
        "P100": GpuModel(16280, _cc("6.0")),
        "V100M16": GpuModel(16130, _cc("7.0")),
        "V100M32": GpuModel(32480, _cc("7.0")),
        "A10": GpuModel(23028, _cc("8.6")),
        "G2": GpuModel(32768, _cc("7.0")),
        "G3": GpuModel(32768, _cc("7.0")),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole configuration; every section has a complete default."""

    policy: PolicySettings = field(default_factory=PolicySettings)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    isolation: IsolationSettings = field(default_factory=IsolationSettings)
    nodes: NodeSettings = field(default_factory=NodeSettings)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    accelerators: AcceleratorSettings = field(default_factory=AcceleratorSettings)
    #: Model name → facts; a document's `gpuModels` entries are added to (or replace) these.
    gpu_models: Mapping[str, GpuModel] = field(default_factory=lambda: DEFAULT_GPU_MODELS)

    def node_selection(self) -> NodeSelection:
        """The core's view of `nodes` and `isolation`: which nodes, and which run multi-user."""
        return NodeSelection(
            selector=self.nodes.selector,
            multi_user_selector=self.isolation.multi_user_node_selector,
        )

    @classmethod
    def default(cls) -> Config:
        return cls()

    def summary(self) -> list[str]:
        """A few lines saying what this configuration does, for `check-config`."""
        b = self.budgets
        return [
            f"policy {self.policy.name}",
            f"budgets: threads ×{b.oversubscription:g}, reserve {b.memory_reserve_mib} MiB, "
            f"{b.client_overhead_mib} MiB/client, max clients "
            f"{b.max_clients_per_gpu or 'by architecture'}, {b.default_units} units/GPU default, "
            f"pre-Volta {b.pre_volta}, proportional {'on' if b.proportional else 'off'}",
            f"uid isolation {'on' if self.isolation.uid_isolation else 'off'}",
            f"server {self.server.host}:{self.server.port}, "
            + f"leader election {'on' if self.leader_election.enabled else 'off'}, "
            + f"logging {self.logging.level} as {self.logging.format}",
            f"webhook: pipe directory {self.webhook.pipe_directory} by {self.webhook.delivery}, "
            + f"trusts {self.webhook.service_account}",
            f"{len(self.gpu_models)} GPU models known",
        ]


def _cc_check(v: object) -> ComputeCapability:
    # YAML reads an unquoted 8.6 as a float; accept it, though "8.6" is the safe spelling.
    text = repr(v) if isinstance(v, float) else v
    if isinstance(text, str):
        try:
            return ComputeCapability.parse(text)
        except InvalidRequest:
            pass
    raise Bad('must be a compute capability such as "8.6"')


def _removed(why: str) -> Check:
    def check(v: object) -> None:
        raise Bad(f"no longer exists: {why}")

    return check


def _moved(where: str) -> Check:
    def check(v: object) -> None:
        raise Bad(f"belongs under {where}")

    return check


def _nested(cls: type, overrides: Mapping[str, Check | Nested] | None = None) -> Nested:
    return Nested(cls, fields_of(cls, overrides))


def _absolute_paths(v: object) -> tuple[str, ...]:
    if isinstance(v, list) and all(isinstance(x, str) and x.startswith("/") for x in v):
        return tuple(v)
    raise Bad("must be a list of absolute paths")


#: A path the webhook writes into pod specs and env values: no whitespace, quotes or control
#: characters; no empty segment and none that starts with a dot (so no `.` or `..`).
_PIPE_PATH: Final = re.compile(r"(/[A-Za-z0-9_+@%:-][A-Za-z0-9._+@%:-]*)+")


def _pipe_directory(v: object) -> str:
    if isinstance(v, str) and len(v) <= 256 and _PIPE_PATH.fullmatch(v):
        return v
    raise Bad(
        "must be an absolute directory path of at most 256 letters, digits and . _ + @ % : - "
        "(no whitespace, quotes or control characters; no empty segment or one starting with '.')"
    )


#: A taint key: a label key, an optional DNS-subdomain prefix and a name of at most 63.
_TAINT_KEY: Final = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def _taint_key(v: object) -> str:
    if isinstance(v, str) and _TAINT_KEY.fullmatch(v):
        return v
    raise Bad("must be a taint key such as nvidia.com/gpu, or null")


_PORT: Final = integer(low=1, high=65535)
_SECONDS: Final = number(low=0.0, low_open=True)
_BUDGETS: Final = fields_of(
    BudgetSettings,
    {
        # < 1.0 wastes capacity that is there; > 10 is a percentage typed as a factor.
        "oversubscription": number(low=1.0, high=10.0),
        "max_clients_per_gpu": optional(integer(low=1, high=CUDA131_CLIENT_LIMIT)),
        # A unit-pod is at least one MPS client: more units than clients could never be used.
        "default_units": integer(low=1, high=VOLTA_CLIENT_LIMIT),
        # One switch in one place: isolation.uidIsolation sets it.
        "uid_isolation": _moved("isolation.uidIsolation"),
    },
)
#: The document's sections (all but `gpuModels`, read by `_gpu_models`).
_SECTIONS: Final[Checks] = MappingProxyType(
    {
        "policy": (
            "policy",
            _nested(
                PolicySettings,
                {
                    "name": string(*POLICY_NAMES),
                    "workload_coverage": number(low=0.0, high=1.0, low_open=True),
                    "lookahead": number(low=0.0, high=1.0),
                },
            ),
        ),
        "budgets": ("budgets", Nested(BudgetSettings, _BUDGETS)),
        "isolation": (
            "isolation",
            _nested(IsolationSettings, {"multi_user_node_selector": optional(label_map)}),
        ),
        "nodes": ("nodes", _nested(NodeSettings, {"selector": label_map})),
        "webhook": (
            "webhook",
            Nested(
                WebhookSettings,
                {
                    **fields_of(
                        WebhookSettings,
                        {
                            "pipe_directory": _pipe_directory,
                            # CUDA accepts 1 .. 32 connections per device.
                            "device_max_connections": integer(low=1, high=32),
                            "tolerate_taint": optional(_taint_key),
                            "scheduler_name": optional(string()),
                            "runtime_class_name": optional(string()),
                            # 64 KiB holds the smallest real review; above 64 MiB is a typo.
                            "max_body_bytes": integer(low=64 * 1024, high=64 * MIB),
                        },
                    ),
                    # The webhook is its own command (`mpsched webhook --port`), not a listener
                    # of serve: say so rather than "unknown key" to configs written for 0.1.
                    "enabled": ("enabled", _removed("the webhook runs as `mpsched webhook`")),
                    "port": ("port", _removed("the port is `mpsched webhook --port`")),
                    "hostIPC": (
                        "delivery",
                        _removed("replaced by webhook.delivery (devicePlugin or hostIPC)"),
                    ),
                },
            ),
        ),
        "leaderElection": (
            "leader_election",
            _nested(
                LeaderElectionSettings,
                {
                    "lease_duration_seconds": _SECONDS,
                    "renew_deadline_seconds": _SECONDS,
                    "retry_period_seconds": _SECONDS,
                },
            ),
        ),
        "tls": (
            "tls",
            _nested(
                TlsSettings,
                {
                    "cert_file": optional(string()),
                    "key_file": optional(string()),
                    "client_ca_file": optional(string()),
                },
            ),
        ),
        "server": (
            "server",
            # 64 KiB holds the smallest real request; above 1 GiB is a typo, not a cluster.
            _nested(
                ServerSettings,
                {
                    "port": _PORT,
                    "metrics_port": optional(_PORT),
                    "max_body_bytes": integer(low=64 * 1024, high=1024 * MIB),
                    "idle_timeout_seconds": _SECONDS,
                    "body_timeout_seconds": _SECONDS,
                    "send_timeout_seconds": _SECONDS,
                    # Fewer than a few connections would refuse the scheduler's own binds.
                    "max_connections": integer(low=4),
                    "large_body_bytes": integer(low=64 * 1024, high=1024 * MIB),
                    "large_body_loop_share": number(low=0.0, low_open=True, high=1.0),
                },
            ),
        ),
        "logging": ("logging", _nested(LoggingSettings)),
        "agent": (
            "agent",
            _nested(
                AgentSettings,
                {
                    # Below 0.5 s a healthy driver under load would count as hung.
                    "nvml_timeout_seconds": number(low=0.5, high=300.0),
                    "sample_interval_seconds": number(low=1.0, high=3600.0),
                    "metrics_port": optional(_PORT),
                    "pod_resources_socket": absolute_path,
                    "proc_root": absolute_path,
                    "device_plugin": _nested(
                        DevicePluginSettings,
                        {"kubelet_directory": absolute_path, "shm_directory": absolute_path},
                    ),
                    "mps": _nested(
                        MpsDaemonSettings,
                        {
                            "control_binary": string(),
                            "log_directory": absolute_path,
                            "health_interval_seconds": number(low=0.1, high=3600.0),
                            "command_timeout_seconds": number(low=0.1, high=600.0),
                            "restart_backoff_seconds": number(low=0.0, low_open=True, high=600.0),
                            "restart_backoff_max_seconds": number(
                                low=0.0, low_open=True, high=3600.0
                            ),
                            "stable_after_seconds": _SECONDS,
                            "foreign_pipe_directories": _absolute_paths,
                        },
                    ),
                },
            ),
        ),
        "accelerators": ("accelerators", _nested(AcceleratorSettings)),
        "api": (
            "api",
            _nested(
                ApiSettings,
                {
                    # Below 0.1 s a healthy API server under load would time out; above 60 s
                    # is longer than any scheduler waits.
                    "request_timeout_seconds": number(low=0.1, high=60.0),
                    "bind_timeout_seconds": number(low=0.1, high=120.0),
                    "in_doubt_seconds": number(low=0.0, high=600.0),
                },
            ),
        ),
    }
)
_GPU_MODEL: Final[Checks] = MappingProxyType(
    {
        "memoryMiB": ("memory_mib", integer(low=1)),
        "computeCapability": ("compute_capability", _cc_check),
    }
)


def _gpu_models(r: Reader, doc: object) -> Mapping[str, GpuModel]:
    """`gpuModels`: model name → {memoryMiB, computeCapability}, added to the defaults."""
    models = dict(DEFAULT_GPU_MODELS)
    if doc is not None and not isinstance(doc, dict):
        r.problems.append(f"gpuModels: must be a mapping of model name to facts, got {show(doc)}")
    for name, facts in doc.items() if isinstance(doc, dict) else ():
        path = f"gpuModels.{name}"
        if not isinstance(name, str) or not name:
            r.problems.append(f"gpuModels: model name {show(name)} must be a non-empty string")
            continue
        before = len(r.problems)
        values = r.section(facts, path, _GPU_MODEL)
        if len(r.problems) > before:
            continue
        missing = [k for k, (attr, _) in _GPU_MODEL.items() if attr not in values]
        if missing:
            r.problems.append(f"{path}: missing {', '.join(missing)}")
        else:
            models[name] = GpuModel(**values)
    return MappingProxyType(models)


def _cross_checks(cfg: Config) -> list[str]:
    """Rules between fields, checked once each field is valid on its own."""
    problems = []
    le = cfg.leader_election
    if le.lease_duration_seconds <= le.renew_deadline_seconds:
        problems.append(
            "leaderElection.leaseDurationSeconds: must be greater than renewDeadlineSeconds"
        )
    # client-go's rule: the renew deadline must outlast a jittered retry (jitter factor 1.2).
    if le.renew_deadline_seconds <= 1.2 * le.retry_period_seconds:
        problems.append(
            "leaderElection.renewDeadlineSeconds: must be greater than 1.2 × retryPeriodSeconds"
        )
    if cfg.api.bind_timeout_seconds < cfg.api.request_timeout_seconds:
        problems.append(
            "api.bindTimeoutSeconds: must be at least requestTimeoutSeconds (a bind makes a call)"
        )
    if cfg.tls.client_ca_file is not None and cfg.tls.cert_file is None:
        problems.append("tls.clientCaFile: client certificates need tls.certFile and tls.keyFile")
    if cfg.server.metrics_port is not None and cfg.server.metrics_port == cfg.server.port:
        problems.append(f"server.metricsPort: {cfg.server.metrics_port} is server.port too")
    mps = cfg.agent.mps
    if mps.restart_backoff_max_seconds < mps.restart_backoff_seconds:
        problems.append(
            "agent.mps.restartBackoffMaxSeconds: must be at least restartBackoffSeconds"
        )
    if (cfg.tls.cert_file is None) != (cfg.tls.key_file is None):
        problems.append("tls: certFile and keyFile must be given together")
    return problems


def config_from_document(doc: object) -> Config:
    """A Config from a parsed YAML (or JSON) document; None (an empty file) → all defaults."""
    if doc is None:
        return Config()
    if not isinstance(doc, dict):
        raise ConfigError([f"the document must be a mapping of sections, got {show(doc)}"])
    r = Reader()
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key in doc and doc[key] != want:
            r.problems.append(f"{key}: must be {want!r}, got {show(doc[key])}")
    gpu_models = _gpu_models(r, doc.get("gpuModels"))
    rest = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "gpuModels")}
    sections = r.section(rest, "", _SECTIONS, also=("apiVersion", "kind", "gpuModels"))
    cfg = Config(**sections, gpu_models=gpu_models)
    cfg = dataclasses.replace(
        cfg, budgets=dataclasses.replace(cfg.budgets, uid_isolation=cfg.isolation.uid_isolation)
    )
    problems = r.problems + _cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config_text(text: str) -> Config:
    """A Config from YAML text. Raises ConfigError listing every problem; a document past the
    bounds of `document_problem` (size, nesting, aliases) is refused before it is built."""
    try:
        too_large = document_problem(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {' '.join(str(exc).split())[:500]}"]) from None
    if too_large is not None:
        raise ConfigError([too_large])
    loader = DuplicateKeyLoader(text)
    try:
        doc = loader.get_single_data()
    # ValueError: PyYAML's int() of a scalar of thousands of digits (Python's digit limit).
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError([f"not valid YAML: {' '.join(str(exc).split())[:500]}"]) from None
    finally:
        loader.dispose()
    try:
        cfg = config_from_document(doc)
    except ConfigError as exc:
        raise ConfigError([*loader.duplicates, *exc.problems]) from None
    if loader.duplicates:
        raise ConfigError(loader.duplicates)
    return cfg


def load_config(path: str | Path) -> Config:
    """A Config from a YAML file. Raises ConfigError (also for a file that cannot be read)."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)  # no more than the bound is ever read
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigReadError([f"cannot read {path}: {reason}"]) from None
    return load_config_text(text)
