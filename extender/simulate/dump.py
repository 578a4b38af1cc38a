"""Reader of an embedded-cluster dump (`kubectl get nodes,pods -A -o json`, or YAML) as a
replayable input: nodes with allocatable CPU/memory and the GPU inventory the extender would
see (annotation `mpsched.io/gpus`, else NVIDIA GFD / GKE labels), and every pod as an arrival
with its `mpsched.io/*` request. Bindings and phases in the dump are ignored: the replay starts
from an empty cluster."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.cluster.loader import ClusterFileError, parse_document
from extender.packing.codec import INVENTORY_KEY, decode_inventory
from extender.packing.codec_labels import inventory_from_labels
from extender.packing.errors import PackingError
from extender.packing.model import GpuInfo, NodeInventory
from extender.packing.podspec import parse_pod
from extender.packing.policies import WHOLE, PodShape
from extender.packing.quantity import parse_quantity, to_mib
from extender.packing.request import ShareRequest, demand_on
from extender.packing.settings import BudgetSettings
from extender.simulate.types import Cluster, SimNode, SimPod, TraceError

#: Allocatable CPU (millicores) and memory (MiB) assumed for a node whose status omits them:
#: large enough never to filter, as kube-scheduler would not know better either.
UNKNOWN_CPU_MILLI = 10**9
UNKNOWN_MEMORY_MIB = 10**9


def _milli(value: object) -> int:
    return math.floor(parse_quantity(value) * 1000)


def _node(item: Mapping[str, Any], budgets: BudgetSettings) -> SimNode:
    meta = item["metadata"]
    name = meta["name"]
    labels = meta.get("labels") or {}
    status = item.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    cpu = _milli(alloc["cpu"]) if "cpu" in alloc else UNKNOWN_CPU_MILLI
    memory = to_mib(alloc["memory"], round_up=False) if "memory" in alloc else UNKNOWN_MEMORY_MIB
    annotation = (meta.get("annotations") or {}).get(INVENTORY_KEY)
    inventory: NodeInventory | None
    if annotation is not None:
        inventory = decode_inventory(name, annotation, budgets=budgets, labels=labels)
    else:
        inventory = inventory_from_labels(
            name, labels, budgets=budgets, capacity=status.get("capacity")
        )
    if inventory is None:
        inventory = NodeInventory(name, ())
    inventory = NodeInventory(
        name,
        inventory.gpus,
        multi_user=inventory.multi_user,
        cpu_milli=cpu,
        memory_mib=memory,
        labels=inventory.labels,
    )
    return SimNode(name, cpu, memory, inventory)


def _requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """CPU (millicores) and memory (MiB) requests by Kubernetes' effective-request rule."""

    def total(containers: object) -> list[tuple[int, int]]:
        out = []
        for c in containers if isinstance(containers, list) else ():
            req = ((c or {}).get("resources") or {}).get("requests") or {}
            cpu = _milli(req["cpu"]) if "cpu" in req else 0
            mem = to_mib(req["memory"], round_up=True) if "memory" in req else 0
            out.append((cpu, mem))
        return out

    app = total(spec.get("containers"))
    init = total(spec.get("initContainers"))
    cpu = max(sum(c for c, _ in app), max((c for c, _ in init), default=0))
    mem = max(sum(m for _, m in app), max((m for _, m in init), default=0))
    return cpu, mem


def _shape(
    request: ShareRequest, cpu: int, probe: GpuInfo | None, budgets: BudgetSettings
) -> PodShape:
    """The policy's view of the pod. A share's thread % is its demand on the cluster's largest
    GPU (asks in memory or units translate differently per GPU; the fit uses the exact one)."""
    if request.kind == "whole":
        return PodShape(cpu, WHOLE, request.whole_gpus)
    if request.kind == "none" or probe is None:
        return PodShape(cpu, 0, 0)
    threads = demand_on(request, probe, budgets).threads
    return PodShape(cpu, min(WHOLE, max(1, threads)), 1)


def read_cluster(path: Path, budgets: BudgetSettings) -> Cluster:
    """Nodes and pods of the dump, each in file order. Raises TraceError naming the object."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    nodes: list[SimNode] = []
    raw_pods: list[Mapping[str, Any]] = []
    try:
        for item in parse_document(text, source=str(path)):
            if item["kind"] == "Node":
                try:
                    nodes.append(_node(item, budgets))
                except (PackingError, KeyError, TypeError, ValueError) as exc:
                    raise TraceError(f"{path}: node {item['metadata']['name']}: {exc}") from None
            else:
                raw_pods.append(item)
    except ClusterFileError as exc:
        raise TraceError(str(exc)) from None
    gpus = [g for n in nodes for g in n.inventory.gpus]
    probe = max(gpus, key=lambda g: g.memory_mib) if gpus else None
    pods: list[SimPod] = []
    for raw in raw_pods:
        meta = raw["metadata"]
        where = f"{path}: pod {meta.get('namespace', 'default')}/{meta['name']}"
        try:
            request = parse_pod(raw, budgets)
            cpu, mem = _requests(raw.get("spec") or {})
        except (PackingError, TypeError, ValueError) as exc:
            raise TraceError(f"{where}: {exc}") from None
        if not request.pod_uid:
            request = ShareRequest(
                request.namespace,
                request.name,
                request.key,
                request.kind,
                containers=request.containers,
                whole_gpus=request.whole_gpus,
                run_as_user=request.run_as_user,
                priority=request.priority,
            )
        pods.append(SimPod(request.key, cpu, mem, _shape(request, cpu, probe, budgets), request))
    if not nodes:
        raise TraceError(f"{path}: no Node objects")
    return Cluster(tuple(nodes), tuple(pods))
