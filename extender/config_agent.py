"""The settings of the two processes beside the extender: the admission webhook (what it injects
into GPU pods, whom it trusts) and the node agent (discovery, the MPS daemon it runs, its device
plugin).

Owns those settings types with their defaults (each with its unit and reason) and the checks of
the `webhook` and `agent` sections, which `extender.config` reads into its `Config`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal

from extender.config_schema import (
    PORT,
    SECONDS,
    Bad,
    Nested,
    absolute_path,
    fields_of,
    integer,
    nested,
    number,
    optional,
    removed,
    string,
)

MIB: Final = 2**20


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


#: The `webhook` section.
WEBHOOK: Final = Nested(
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
        "enabled": ("enabled", removed("the webhook runs as `mpsched webhook`")),
        "port": ("port", removed("the port is `mpsched webhook --port`")),
        "hostIPC": (
            "delivery",
            removed("replaced by webhook.delivery (devicePlugin or hostIPC)"),
        ),
    },
)
#: The `agent` section.
AGENT: Final = nested(
    AgentSettings,
    {
        # Below 0.5 s a healthy driver under load would count as hung.
        "nvml_timeout_seconds": number(low=0.5, high=300.0),
        "sample_interval_seconds": number(low=1.0, high=3600.0),
        "metrics_port": optional(PORT),
        "pod_resources_socket": absolute_path,
        "proc_root": absolute_path,
        "device_plugin": nested(
            DevicePluginSettings,
            {"kubelet_directory": absolute_path, "shm_directory": absolute_path},
        ),
        "mps": nested(
            MpsDaemonSettings,
            {
                "control_binary": string(),
                "log_directory": absolute_path,
                "health_interval_seconds": number(low=0.1, high=3600.0),
                "command_timeout_seconds": number(low=0.1, high=600.0),
                "restart_backoff_seconds": number(low=0.0, low_open=True, high=600.0),
                "restart_backoff_max_seconds": number(low=0.0, low_open=True, high=3600.0),
                "stable_after_seconds": SECONDS,
                "foreign_pipe_directories": _absolute_paths,
            },
        ),
    },
)
