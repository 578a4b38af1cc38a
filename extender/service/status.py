"""The `/status` document and the metrics sample: read-only views of the ledger.

Owns the `/status` JSON schema (documented on `status_document`; `mpsched status` and the demo
print it) and the per-GPU figures the metrics collector exposes; both also come in a form built
a few nodes at a time (`stream_status`, `sample_metrics`), because at 5,000 nodes either takes
a few hundred milliseconds that must not stall filter calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import orjson

from extender.metrics import GpuSample, LedgerSample
from extender.packing.evaluate import Evaluator
from extender.packing.in_use import ClusterInUse, gpu_in_use
from extender.packing.ledger import GpuUsage, Ledger, NodeUsage
from extender.packing.policies import NodeState
from extender.packing.policies.frag import Fragmentation

#: Nodes handled between two yields to the loop by /status and /metrics (~2 ms of work).
STATUS_BATCH: Final = 16


def _gpu_document(g: GpuUsage, ledger: Ledger, *, multi_user: bool) -> dict[str, Any]:
    in_use = gpu_in_use(g, oversubscription=ledger.budgets.oversubscription)
    owner = None
    if g.owner is not None:
        alloc = ledger.allocation(g.owner)
        owner = alloc.key if alloc is not None else g.owner
    pods = [
        {
            "namespace": a.namespace,
            "name": a.name,
            "uid": a.pod_uid,
            "threads": a.threads,
            "memoryMiB": a.memory_mib,
            "clients": a.clients,
            "state": ledger.state(a.pod_uid) or "assumed",
        }
        for a in sorted(g.shares.values(), key=lambda a: (a.namespace, a.name))
    ]
    info = g.info
    return {
        "index": info.index,
        "uuid": info.uuid,
        "model": info.model,
        "memoryMiB": info.memory_mib,
        "computeCapability": str(info.compute_capability),
        "mps": info.mps,
        "threads": {"used": g.threads, "capacity": g.capacity.threads},
        "inUsePct": round(100 * in_use, 3),
        "memory": {
            "usedMiB": g.memory_mib + g.clients * g.capacity.client_overhead_mib,
            "capacityMiB": g.capacity.memory_mib,
        },
        "clients": {"used": g.clients, "capacity": g.capacity.clients},
        "wholeOwner": owner,
        "pods": pods,
        "overBudget": g.over_budget(
            multi_user=multi_user, uid_isolation=ledger.budgets.uid_isolation
        ),
    }


@dataclass(slots=True)
class Tally:
    """The `summary` of /status, accumulated node by node."""

    oversubscription: float
    frag: Fragmentation
    nodes: int = 0
    fragmentation: float = 0.0
    #: GPUs in use, by the one definition (`packing.in_use`) the metrics use too.
    in_use: ClusterInUse = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.in_use = ClusterInUse(self.oversubscription)

    def add(self, usage: NodeUsage, state: NodeState | None) -> None:
        self.nodes += 1
        for g in usage.gpus:
            self.in_use.add(g)
        if state is not None:
            self.fragmentation += self.frag(state)

    def summary(self, pods: int) -> dict[str, Any]:
        gpus = self.in_use.gpus
        return {
            "nodes": self.nodes,
            "gpus": gpus,
            "pods": pods,
            "threadsUsedPct": round(self.in_use.percent, 3),
            "threadsUsedGpus": round(self.in_use.used, 3),
            # FGD's fragmentation amount: Σ F_n(M) over all GPU capacity (100 % per GPU).
            "fragmentationPct": round(self.fragmentation / gpus, 3) if gpus else 0.0,
        }


def node_document(name: str, usage: NodeUsage, ledger: Ledger) -> dict[str, Any]:
    multi = usage.inventory.multi_user
    return {
        "name": name,
        "gpus": [_gpu_document(g, ledger, multi_user=multi) for g in usage.gpus],
        "heldByDevicePlugin": usage.held_elsewhere,
        "unplacedPods": len(usage.unplaced),
    }


def _summary(tally: Tally, ledger: Ledger) -> dict[str, Any]:
    out = tally.summary(sum(1 for _ in ledger.allocations()))
    out["overBudgetGpus"] = sum(1 for _ in ledger.over_budget())
    out["inDoubt"] = sum(1 for a in ledger.allocations() if ledger.state(a.pod_uid) == "in_doubt")
    out["unplaced"] = [
        {"namespace": a.namespace, "name": a.name, "uid": a.pod_uid, "node": a.node}
        for a in ledger.unplaced()
    ]
    return out


def refused_nodes(refused: Mapping[str, str] | None) -> list[dict[str, str]]:
    """`summary.refusedNodes`: the nodes whose GPU inventory was refused, and why."""
    return [{"name": n, "reason": why} for n, why in sorted((refused or {}).items())]


def status_document(
    ledger: Ledger,
    *,
    states: Mapping[str, NodeState],
    frag: Fragmentation,
    config: Mapping[str, Any],
    node: str | None = None,
    refused: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The `/status` document::

        {"nodes": [{"name": str,
                    "heldByDevicePlugin": int,  # GPUs nvidia.com/gpu pods hold (which: unknown)
                    "unplacedPods": int,  # pods on GPUs the inventory lacks: takes nothing new
                    "gpus": [{"index": int, "uuid": str, "model": str,
                              "memoryMiB": int,                 # the GPU's total memory
                              "computeCapability": "9.0",
                              "mps": "ready" | "down" | "off",
                              "threads": {"used": int, "capacity": int},   # percent of one GPU
                              "inUsePct": float,  # SMs in use: 100 when given out whole
                              "memory": {"usedMiB": int, "capacityMiB": int},  # pinned budget
                              "clients": {"used": int, "capacity": int},   # MPS clients
                              "wholeOwner": "namespace/name" | null,
                              "pods": [{"namespace": str, "name": str, "uid": str,
                                        "threads": int, "memoryMiB": int, "clients": int,
                                        "state": "assumed" | "in_doubt" | "confirmed"}],
                              "overBudget": str | null}]}],  # why what runs exceeds a budget
         "summary": {"nodes": int, "gpus": int, "pods": int,
                     "threadsUsedPct": float,      # SMs in use, over all GPUs
                     "threadsUsedGpus": float,     # the same in GPUs (Σ inUsePct / 100)
                     "fragmentationPct": float,    # FGD fragmentation amount, over all GPUs
                     "overBudgetGpus": int,        # GPUs that take nothing new (rule 1)
                     "inDoubt": int,               # binds the API has not answered yet
                     "unplaced": [{"namespace", "name", "uid", "node"}],  # counted, GPU not
                                                   # in the node's inventory now
                     "refusedNodes": [{"name", "reason"}]},  # inventory malformed or out of
                                                   # its documented range: no GPU pods there
         "config": {"policy": str, "source": str | null, "error": str | null}}

    Nodes are sorted by name and GPUs by index; `pods` lists the shares on a GPU (a GPU given
    out whole shows its owner in `wholeOwner` instead). `memory.usedMiB` includes the
    per-client overhead. `summary` always covers the whole cluster; `node` limits `nodes` to
    that one node (empty list if unknown). `ExtenderService.status_stream` writes the same
    document in pieces, for large clusters.
    """
    tally = Tally(ledger.budgets.oversubscription, frag)
    nodes = []
    for name in sorted(ledger.node_names()):
        usage = ledger.node(name)
        tally.add(usage, states.get(name))
        if node is None or name == node:
            nodes.append(node_document(name, usage, ledger))
    summary = _summary(tally, ledger)
    summary["refusedNodes"] = refused_nodes(refused)
    return {"nodes": nodes, "summary": summary, "config": dict(config)}


def gpu_samples(name: str, usage: NodeUsage, *, oversubscription: float) -> list[GpuSample]:
    """One node's GPUs as the metrics collector shows them."""
    out = []
    for g in usage.gpus:
        cap = g.capacity
        out.append(
            GpuSample(
                node=name,
                index=g.info.index,
                uuid=g.info.uuid,
                model=g.info.model,
                threads_used=g.threads,
                threads_capacity=cap.threads,
                memory_used_mib=g.memory_mib + g.clients * cap.client_overhead_mib,
                memory_capacity_mib=cap.memory_mib,
                clients_used=g.clients,
                clients_capacity=cap.clients,
                whole=g.owner is not None,
                in_use=gpu_in_use(g, oversubscription=oversubscription),
            )
        )
    return out


async def stream_status(
    ledger: Ledger,
    evaluator: Evaluator,
    frag: Fragmentation,
    *,
    config: Mapping[str, Any],
    node: str | None,
    batch: int = STATUS_BATCH,
    refused: Mapping[str, str] | None = None,
) -> AsyncIterator[bytes]:
    """`status_document` as JSON text in pieces, yielding to the loop every `batch` nodes."""
    evaluator.refresh()
    tally = Tally(ledger.budgets.oversubscription, frag)
    names = sorted(ledger.node_names())
    yield b'{"nodes":['
    first = True
    for i in range(0, len(names), batch):
        docs = []
        for name in names[i : i + batch]:
            usage = ledger.get_node(name)
            if usage is None:
                continue
            tally.add(usage, evaluator.node_state(name))
            if node is None or name == node:
                docs.append(node_document(name, usage, ledger))
        if docs:
            piece = b",".join(map(orjson.dumps, docs))
            yield piece if first else b"," + piece
            first = False
        await asyncio.sleep(0)
        evaluator.refresh()
    summary = _summary(tally, ledger)
    summary["refusedNodes"] = refused_nodes(refused)
    tail = {"summary": summary, "config": dict(config)}
    yield b"]," + orjson.dumps(tail)[1:]


@runtime_checkable
class CountsApiRequests(Protocol):
    """A cluster that counts its API requests (`extender.kube.api.KubeCluster`; the embedded
    cluster makes none)."""

    api_requests: Mapping[tuple[str, str, str], int]


def api_requests(cluster: object) -> Mapping[tuple[str, str, str], int]:
    """The cluster's API request counts by (verb, resource, code), copied; none for a cluster
    that makes no API requests."""
    return dict(cluster.api_requests) if isinstance(cluster, CountsApiRequests) else {}


@dataclass(frozen=True, slots=True)
class Health:
    """The process figures a metrics sample carries beside the ledger's."""

    config_ok: bool = True
    leading: bool = True
    ready: bool = True
    notices: Mapping[str, int] = dataclasses.field(default_factory=dict)
    watch_restarts: int = 0
    api_requests: Mapping[tuple[str, str, str], int] = dataclasses.field(default_factory=dict)
    events_dropped: int = 0
    forecast_results: int = 0
    call_results: int = 0

    def without_ledger(self) -> LedgerSample:
        """The sample before the ledger is built: these figures, no GPUs."""
        return dataclasses.replace(_health_only(self), ready=False)


def _health_only(health: Health) -> LedgerSample:
    return LedgerSample(
        config_ok=health.config_ok,
        leading=health.leading,
        ready=health.ready,
        notices=dict(health.notices),
        watch_restarts=health.watch_restarts,
        api_requests=dict(health.api_requests),
        events_dropped=health.events_dropped,
        forecast_results=health.forecast_results,
        call_results=health.call_results,
    )


async def sample_metrics(
    ledger: Ledger,
    evaluator: Evaluator,
    frag: Fragmentation,
    *,
    health: Health,
    batch: int = STATUS_BATCH,
) -> LedgerSample:
    """The ledger gauges for one scrape, built `batch` nodes at a time between requests."""
    evaluator.refresh()
    oversubscription = ledger.budgets.oversubscription
    tally = Tally(oversubscription, frag)
    samples: list[GpuSample] = []
    blocked = 0
    names = list(ledger.node_names())
    for i in range(0, len(names), batch):
        for name in names[i : i + batch]:
            usage = ledger.get_node(name)
            if usage is not None:
                tally.add(usage, evaluator.node_state(name))
                samples.extend(gpu_samples(name, usage, oversubscription=oversubscription))
                blocked += bool(usage.unplaced)
        await asyncio.sleep(0)
        evaluator.refresh()
    states = [ledger.state(a.pod_uid) for a in list(ledger.allocations())]
    return dataclasses.replace(
        _health_only(health),
        gpus=samples,
        nodes=tally.nodes,
        assumed=states.count("assumed"),
        in_doubt=states.count("in_doubt"),
        confirmed=states.count("confirmed"),
        over_budget_gpus=sum(1 for _ in ledger.over_budget()),
        blocked_nodes=blocked,
        fragmentation_ratio=tally.summary(len(states))["fragmentationPct"] / 100,
        gpus_in_use=tally.in_use.used,
    )
