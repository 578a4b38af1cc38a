"""Prometheus metrics of the extender: request latency and outcomes per verb, bind failures by
reason, the ledger's per-GPU budgets and fragmentation, and the process's health (leadership,
readiness, configuration, watch restarts, Kubernetes API requests by verb and code, build).

Owns metric names, help texts and units; nothing here decides anything. Every metric lives in
the `CollectorRegistry` of one `Metrics` object (never the process-global default registry), so
tests and several apps in one process do not share counters. The ledger gauges are computed at
scrape time from a `LedgerSample` the service takes on the event loop; formatting (the slow
part, O(GPUs)) may then run in a worker thread without touching the live ledger.

Names follow Prometheus conventions: `mpsched_` prefix, base units (`_seconds`, `_bytes`,
`_ratio` for fractions of a GPU), `_total` on counters (added by prometheus-client).
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender import __version__
from extender.build import build

#: Latency buckets (seconds): filter and prioritize live in the 0.2-15 ms range, binds in the
#: API server's 5-500 ms; the top buckets catch the scheduler's 5 s timeout.
LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
MIB_BYTES: Final = 1 << 20
VERBS: Final = ("filter", "prioritize", "bind", "preempt")


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's budgets: thread share in percent of the GPU, memory in MiB, MPS clients."""

    node: str
    index: int
    uuid: str
    model: str
    threads_used: int
    threads_capacity: int
    memory_used_mib: int
    memory_capacity_mib: int
    clients_used: int
    clients_capacity: int
    whole: bool
    #: SMs in use, 0..1: 1 when given out whole (`packing.in_use`, as /status shows it).
    in_use: float = 0.0


@dataclass(frozen=True, slots=True)
class LedgerSample:
    """What the ledger gauges show, taken at one instant."""

    gpus: Sequence[GpuSample] = ()
    nodes: int = 0
    assumed: int = 0
    in_doubt: int = 0
    confirmed: int = 0
    #: GPUs whose running load exceeds a budget (they take nothing new; truth rule 1 of
    #: docs/design.md).
    over_budget_gpus: int = 0
    #: Workload-weighted fragmentation as a fraction of all GPU capacity (FGD's measure).
    fragmentation_ratio: float = 0.0
    #: Nodes holding an allocation whose GPU their inventory does not show (by uuid): they
    #: take nothing new until it does.
    blocked_nodes: int = 0
    config_ok: bool = True
    #: This replica holds the leader Lease (or needs none).
    leading: bool = True
    #: The ledger is built from the cluster (the service answers the verbs).
    ready: bool = True
    #: Notices by kind since start (over_budget, allocation_changed, allocation_unreadable).
    notices: Mapping[str, int] = field(default_factory=dict)
    #: Times the cluster's follow streams started over since start (relists, reconnects).
    watch_restarts: int = 0
    #: Kubernetes API requests since start by (verb, resource, HTTP code or "none").
    api_requests: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    #: Events about pods dropped since start because the queue was full (the API server did
    #: not take them as fast as they came).
    events_dropped: int = 0
    #: Results computed ahead for the filter call forecast next, since start.
    forecast_results: int = 0
    #: Results filter and prioritize calls computed themselves, since start.
    call_results: int = 0
    #: GPUs' worth of SMs in use, Σ GpuSample.in_use (/status summary.threadsUsedGpus).
    gpus_in_use: float = 0.0


@dataclass(slots=True, eq=False)  # registries key collectors by identity
class _LedgerCollector(Collector):
    sample: LedgerSample | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.sample
        if s is None:
            return
        yield _gauge("mpsched_nodes", "Nodes with a GPU inventory in the ledger.", s.nodes)
        yield _gauge("mpsched_gpus", "GPUs in the ledger.", len(s.gpus))
        allocs = GaugeMetricFamily(
            "mpsched_allocations",
            "Pods holding GPU allocations, by state (assumed: reserved, not yet seen bound; "
            "in_doubt: its Binding got no answer, held until the API says).",
            labels=["state"],
        )
        allocs.add_metric(["assumed"], s.assumed)
        allocs.add_metric(["in_doubt"], s.in_doubt)
        allocs.add_metric(["confirmed"], s.confirmed)
        yield allocs
        yield _gauge(
            "mpsched_over_budget_gpus",
            "GPUs whose running pods exceed a budget; they take nothing new until back within.",
            s.over_budget_gpus,
        )
        yield _gauge(
            "mpsched_blocked_nodes",
            "Nodes running a pod whose GPU their inventory does not show (by uuid); they take "
            "nothing new until it does or the pod ends.",
            s.blocked_nodes,
        )
        yield _gauge(
            "mpsched_leader",
            "1 when this replica holds the leader Lease (or runs without election).",
            1.0 if s.leading else 0.0,
        )
        yield _gauge(
            "mpsched_ready",
            "1 once the ledger is built from the cluster and the verbs are answered.",
            1.0 if s.ready else 0.0,
        )
        yield CounterMetricFamily(
            "mpsched_watch_restarts",
            "Times following the cluster started over: a watch reconnected after a failure, a "
            "relist after 410 Gone, a failed list retried.",
            value=s.watch_restarts,
        )
        api = CounterMetricFamily(
            "mpsched_api_requests",
            "Kubernetes API requests by verb, resource and HTTP code ('none': no answer).",
            labels=["verb", "resource", "code"],
        )
        for (verb, resource, code), count in sorted(s.api_requests.items()):
            api.add_metric([verb, resource, code], count)
        yield api
        yield CounterMetricFamily(
            "mpsched_events_dropped",
            "Events about pods not recorded because 1,000 were queued already: the API server "
            "did not take them as fast as they came.",
            value=s.events_dropped,
        )
        yield CounterMetricFamily(
            "mpsched_forecast_results",
            "Fit-and-score results computed between kube-scheduler's calls for the filter call "
            "forecast next (the oldest pending pod, on the window after the last one).",
            value=s.forecast_results,
        )
        yield CounterMetricFamily(
            "mpsched_call_results",
            "Fit-and-score results filter and prioritize calls computed themselves, none being "
            "known yet: what the forecast missed or could not know (a node changed since).",
            value=s.call_results,
        )
        notices = CounterMetricFamily(
            "mpsched_notices",
            "Reality the ledger reported: a GPU over budget, an allocation changed or unreadable, "
            "a node's GPU inventory refused.",
            labels=["kind"],
        )
        for kind in (
            "over_budget",
            "allocation_changed",
            "allocation_unreadable",
            "allocation_unplaced",
            "inventory_refused",
        ):
            notices.add_metric([kind], s.notices.get(kind, 0))
        yield notices
        yield _gauge(
            "mpsched_fragmentation_ratio",
            "Idle GPU capacity the typical workload cannot use, as a fraction of all GPU capacity.",
            s.fragmentation_ratio,
        )
        yield _gauge(
            "mpsched_config_valid",
            "1 when the last configuration load succeeded, 0 when the last good one is in force.",
            1.0 if s.config_ok else 0.0,
        )
        # One definition of "in use" with /status (packing.in_use): used / capacity here is
        # its summary.threadsUsedPct / 100.
        totals = (
            (
                "threads_used",
                "GPUs' worth of SMs in use: a GPU given out whole counts 1, a shared GPU its "
                "thread percentages over the oversubscription (at most 1).",
            ),
            ("threads_capacity", "GPUs the in-use figure is out of: every GPU in the ledger."),
        )
        t_used = s.gpus_in_use
        t_cap = float(len(s.gpus))
        for (name, text), value in zip(totals, (t_used, t_cap), strict=True):
            yield _gauge(f"mpsched_cluster_{name}_gpus", text, value)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


#: Per-GPU families: (name, help, value of a sample). Written as text directly (see
#: `per_gpu_text`), not through prometheus-client's objects: at 40,000 GPUs that is 0.3 s of
#: formatting instead of 4 s.
_PER_GPU: Final[tuple[tuple[str, str, Callable[[GpuSample], float]], ...]] = (
    (
        "mpsched_gpu_threads_used_ratio",
        "Thread (SM) share the GPU's shares reserve, as a fraction of the GPU (0 on a GPU "
        "given out whole: mpsched_gpu_in_use_ratio counts it).",
        lambda g: g.threads_used / 100,
    ),
    (
        "mpsched_gpu_threads_capacity_ratio",
        "Thread share the GPU may carry (oversubscription), as a fraction of the GPU.",
        lambda g: g.threads_capacity / 100,
    ),
    (
        "mpsched_gpu_pinned_memory_used_bytes",
        "Pinned device memory reserved on the GPU.",
        lambda g: g.memory_used_mib * MIB_BYTES,
    ),
    (
        "mpsched_gpu_pinned_memory_capacity_bytes",
        "Pinned device memory budget of the GPU (total minus reserve).",
        lambda g: g.memory_capacity_mib * MIB_BYTES,
    ),
    ("mpsched_gpu_mps_clients_used", "MPS client contexts reserved.", lambda g: g.clients_used),
    (
        "mpsched_gpu_mps_clients_capacity",
        "MPS client contexts the GPU serves.",
        lambda g: g.clients_capacity,
    ),
    (
        "mpsched_gpu_in_use_ratio",
        "SMs of the GPU in use, 0-1: 1 when given out whole, else the shares' thread "
        "percentages over the oversubscription (the in-use figure of /status).",
        lambda g: g.in_use,
    ),
    (
        "mpsched_gpu_whole_allocated",
        "1 when the GPU is given out whole to one pod.",
        lambda g: 1 if g.whole else 0,
    ),
)


def _label(value: str) -> str:
    """A label value escaped as the text format wants (backslash, quote, newline)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def per_gpu_text(gpus: Sequence[GpuSample]) -> str:
    """The per-GPU families in the Prometheus text format, version 0.0.4."""
    keys = [f'{{node="{_label(g.node)}",gpu="{g.index}"}} ' for g in gpus]
    out: list[str] = []
    for name, text, value in _PER_GPU:
        out.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n")
        out.extend(f"{name}{key}{value(g)}\n" for key, g in zip(keys, gpus, strict=True))
    out.append("# HELP mpsched_gpu_info GPU identity; always 1.\n# TYPE mpsched_gpu_info gauge\n")
    out.extend(
        f'mpsched_gpu_info{{node="{_label(g.node)}",gpu="{g.index}",'
        f'uuid="{_label(g.uuid)}",model="{_label(g.model)}"}} 1\n'
        for g in gpus
    )
    return "".join(out)


@dataclass(slots=True, eq=False)
class Metrics:
    """The extender's metrics and their registry. `per_gpu=False` drops the per-GPU series
    (7 per GPU: about 280k series at 40k GPUs) and keeps the cluster totals."""

    per_gpu: bool = True
    registry: CollectorRegistry = field(init=False)
    request_seconds: Histogram = field(init=False)
    requests: Counter = field(init=False)
    bind_failures: Counter = field(init=False)
    build_info: Gauge = field(init=False)
    _ledger: _LedgerCollector = field(init=False)
    _render_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    #: Labelled children by label values: a dict lookup, where labels() costs far more a call.
    _timers: dict[str, Any] = field(init=False, default_factory=dict)
    _counters: dict[tuple[str, str], Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.request_seconds = Histogram(
            "mpsched_request_duration_seconds",
            "Time to answer one extender call, from request read to response built, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "mpsched_requests",
            "Extender calls by verb and outcome (ok, nofit, error, bad_request, ...).",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "mpsched_bind_failures",
            "Binds answered with an error, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.build_info = Gauge(
            "mpsched_build_info",
            "The running mpsched's version, Python and build (mypyc: the decision core "
            "compiled; python: pure Python; partial: a broken install); always 1.",
            ["version", "python", "build"],
            registry=self.registry,
        )
        self.build_info.labels(__version__, platform.python_version(), build()).set(1)
        self._ledger = _LedgerCollector()
        self.registry.register(self._ledger)
        for verb in VERBS:
            # Create the labelled children up front, so rate() works from the first scrape.
            self.request_seconds.labels(verb)
            self.requests.labels(verb, "ok")

    def observe(self, verb: str, seconds: float, outcome: str) -> None:
        timer = self._timers.get(verb)
        if timer is None:
            timer = self._timers[verb] = self.request_seconds.labels(verb)
        counter = self._counters.get((verb, outcome))
        if counter is None:
            counter = self._counters[(verb, outcome)] = self.requests.labels(verb, outcome)
        timer.observe(seconds)
        counter.inc()

    def bind_failed(self, reason: str) -> None:
        self.bind_failures.labels(reason).inc()

    def render(self, sample: LedgerSample) -> bytes:
        """The text exposition with the ledger gauges from `sample`. Thread-safe: may run in a
        worker thread while the loop keeps serving (the counters have their own locks)."""
        with self._render_lock:
            self._ledger.sample = sample
            try:
                text = generate_latest(self.registry)
            finally:
                self._ledger.sample = None
        if not self.per_gpu or not sample.gpus:
            return text
        return text + per_gpu_text(sample.gpus).encode()


CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
