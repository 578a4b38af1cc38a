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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

import yaml

from extender.config_agent import AGENT, MIB, WEBHOOK, AgentSettings, WebhookSettings
from extender.config_gpus import DEFAULT_GPU_MODELS, GpuModel, read_gpu_models
from extender.config_schema import (
    MAX_DOCUMENT_BYTES,
    Checks,
    DuplicateKeyLoader,
    Nested,
    Reader,
    document_problem,
    fields_of,
    integer,
    label_map,
    number,
    optional,
    show,
    string,
)
from extender.config_schema import PORT as _PORT
from extender.config_schema import SECONDS as _SECONDS
from extender.config_schema import moved as _moved
from extender.config_schema import nested as _nested
from extender.config_schema import removed as _removed
from extender.packing.model import CUDA131_CLIENT_LIMIT, VOLTA_CLIENT_LIMIT
from extender.packing.policies import POLICY_NAMES, PolicySettings
from extender.packing.settings import BudgetSettings, NodeSelection

API_VERSION: Final = "mpsched.io/v1alpha1"
KIND: Final = "MpschedConfig"


class ConfigError(Exception):
    """The document is not a valid configuration; `problems` lists every reason, one per item."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class ConfigReadError(ConfigError):
    """The configuration file could not be read at all (missing, unreadable, not UTF-8)."""


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
    selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


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
    #: Also record a Normal Event `GpuShareAllocated` on each pod bound with GPUs (which GPU,
    #: what share). Off by default: the pod's `mpsched.io/allocation` annotation already
    #: records the allocation for the pod's whole life, and `kubectl describe pod` shows it (an
    #: Event expires after the API server's `--event-ttl`, an hour by default). On, it is one
    #: more API write per bind, beside kube-scheduler's own `Scheduled` Event, and one more call
    #: on the extender's event loop between the scheduler's calls. Warnings (an over-budget
    #: GPU, a GPU gone from a node, a refused inventory) are recorded either way.
    allocation_events: bool = False


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
#: The accelerators, and those removed because the ablation showed they earned nothing: a
#: document that still sets one is told so rather than "unknown key".
_ACCELERATORS: Final = Nested(
    AcceleratorSettings,
    {
        **fields_of(AcceleratorSettings),
        "cycleDelay": ("cycle_delay", _removed("it earned nothing")),
        "preparedPriorities": ("prepared_priorities", _removed("it earned nothing")),
    },
)
#: The document's sections (all but `gpuModels`, read by `read_gpu_models`).
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
        "webhook": ("webhook", WEBHOOK),
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
        "agent": ("agent", AGENT),
        "accelerators": ("accelerators", _ACCELERATORS),
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
    gpu_models = read_gpu_models(r, doc.get("gpuModels"))
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
