"""The `/status` document and the metrics sample: read-only views of the ledger.

Owns the `/status` JSON schema (documented on `status_document`; `mpsched status` and the demo
print it) and the per-GPU figures the metrics collector exposes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from extender.metrics import GpuSample, LedgerSample
from extender.packing.ledger import GpuUsage, Ledger
from extender.packing.policies import NodeState
from extender.packing.policies.frag import Fragmentation


def _gpu_document(g: GpuUsage, ledger: Ledger) -> dict[str, Any]:
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
        "memory": {
            "usedMiB": g.memory_mib + g.clients * g.capacity.client_overhead_mib,
            "capacityMiB": g.capacity.memory_mib,
        },
        "clients": {"used": g.clients, "capacity": g.capacity.clients},
        "wholeOwner": owner,
        "pods": pods,
    }


def reserved_percent(g: GpuUsage, oversubscription: float) -> float:
    """Share of the GPU's SMs reserved, 0..100: a whole GPU is 100; shares count their thread
    percentage scaled back by oversubscription (200 % of threads at ×2.0 is one GPU)."""
    if g.owner is not None:
        return 100.0
    return min(100.0, g.threads / max(oversubscription, 1e-9))


def fragmentation_percent(states: Iterable[NodeState], frag: Fragmentation, gpus: int) -> float:
    """FGD's fragmentation amount: Σ_n F_n(M) over all GPU capacity, in percent (thread
    percent per GPU sums to 100 × gpus)."""
    if gpus == 0:
        return 0.0
    return round(sum(frag(s) for s in states) / gpus, 3)


def status_document(
    ledger: Ledger,
    *,
    states: Iterable[NodeState],
    frag: Fragmentation,
    policy: str,
    source: str | None,
    error: str | None,
    node: str | None = None,
) -> dict[str, Any]:
    """The `/status` document::

        {"nodes": [{"name": str,
                    "gpus": [{"index": int, "uuid": str, "model": str,
                              "memoryMiB": int,                 # the GPU's total memory
                              "computeCapability": "9.0",
                              "mps": "ready" | "down" | "off",
                              "threads": {"used": int, "capacity": int},   # percent of one GPU
                              "memory": {"usedMiB": int, "capacityMiB": int},  # pinned budget
                              "clients": {"used": int, "capacity": int},   # MPS clients
                              "wholeOwner": "namespace/name" | null,
                              "pods": [{"namespace": str, "name": str, "uid": str,
                                        "threads": int, "memoryMiB": int, "clients": int,
                                        "state": "assumed" | "confirmed"}]}]}],
         "summary": {"nodes": int, "gpus": int, "pods": int,
                     "threadsUsedPct": float,      # SMs reserved, over all GPUs
                     "fragmentationPct": float},   # FGD fragmentation amount, over all GPUs
         "config": {"policy": str, "source": str | null, "error": str | null}}

    Nodes are sorted by name and GPUs by index; `pods` lists the shares on a GPU (a GPU given
    out whole shows its owner in `wholeOwner` instead). `memory.usedMiB` includes the
    per-client overhead. `summary` always covers the whole cluster; `node` limits `nodes` to
    that one node (empty list if unknown).
    """
    oversub = ledger.budgets.oversubscription
    names = sorted(ledger.node_names())
    gpus = 0
    reserved = 0.0
    for name in names:
        for g in ledger.node(name).gpus:
            gpus += 1
            reserved += reserved_percent(g, oversub)
    shown = [n for n in names if node is None or n == node]
    return {
        "nodes": [
            {"name": n, "gpus": [_gpu_document(g, ledger) for g in ledger.node(n).gpus]}
            for n in shown
        ],
        "summary": {
            "nodes": len(names),
            "gpus": gpus,
            "pods": sum(1 for _ in ledger.allocations()),
            "threadsUsedPct": round(reserved / gpus, 3) if gpus else 0.0,
            "fragmentationPct": fragmentation_percent(states, frag, gpus),
        },
        "config": {"policy": policy, "source": source, "error": error},
    }


def metrics_sample(
    ledger: Ledger, *, states: Iterable[NodeState], frag: Fragmentation, config_ok: bool
) -> LedgerSample:
    """The per-GPU figures and totals for one scrape."""
    samples: list[GpuSample] = []
    for name in ledger.node_names():
        for g in ledger.node(name).gpus:
            cap = g.capacity
            samples.append(
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
                )
            )
    assumed = confirmed = 0
    for a in ledger.allocations():
        if ledger.state(a.pod_uid) == "confirmed":
            confirmed += 1
        else:
            assumed += 1
    return LedgerSample(
        gpus=samples,
        nodes=len(ledger),
        assumed=assumed,
        confirmed=confirmed,
        fragmentation_ratio=fragmentation_percent(states, frag, len(samples)) / 100,
        config_ok=config_ok,
    )
