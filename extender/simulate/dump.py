"""Reader of an embedded-cluster dump (`kubectl get nodes,pods -A -o json`, or YAML) as a
replayable input: every node as the extender reads it (`packing.objects.read_node`: the
`mpsched.io/gpus` annotation, else NVIDIA GFD / GKE labels, the node selection; a node outside
it takes CPU-only pods only), and every pod as an arrival with its `mpsched.io/*` request and
its effective CPU/memory request by the extender's one rule (`packing.objects.pod_requests`).
Bindings and phases in the dump are ignored: the replay starts from an empty cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.cluster.loader import ClusterFileError, parse_document
from extender.packing.errors import PackingError
from extender.packing.model import GpuInfo, NodeInventory
from extender.packing.objects import (
    NodeReading,
    QuantityMemo,
    mapping,
    pod_requests,
    read_node,
)
from extender.packing.podspec import parse_pod
from extender.packing.request import ShareRequest, demand_on
from extender.packing.settings import BudgetSettings, NodeSelection
from extender.packing.view import pod_shape
from extender.simulate.types import Cluster, SimNode, SimPod, TraceError

#: Allocatable CPU (millicores) and memory (MiB) assumed for a node whose status omits them:
#: large enough never to filter, as kube-scheduler would not know better either.
UNKNOWN_CPU_MILLI = 10**9
UNKNOWN_MEMORY_MIB = 10**9


def _node(reading: NodeReading) -> SimNode:
    cpu = UNKNOWN_CPU_MILLI if reading.cpu_milli is None else reading.cpu_milli
    memory = UNKNOWN_MEMORY_MIB if reading.memory_mib is None else reading.memory_mib
    # Not a GPU node to the extender (no inventory, not selected): CPU-only pods still go there.
    inventory = reading.inventory or NodeInventory(reading.name, ())
    return SimNode(reading.name, cpu, memory, inventory)


def _size(request: ShareRequest, largest: GpuInfo | None, budgets: BudgetSettings) -> int:
    """A share's thread percent for sizing the replay: its demand on the cluster's largest GPU
    (see `view.pod_shape`; scoring takes the demand on each node's own GPU)."""
    if request.kind != "share" or largest is None:
        return 0
    return demand_on(request, largest, budgets).threads


def read_cluster(
    path: Path, budgets: BudgetSettings, *, selection: NodeSelection | None = None
) -> Cluster:
    """Nodes and pods of the dump, each in file order; nodes selected by `selection` (default:
    every node with a GPU inventory). Raises TraceError naming the object."""
    selection = selection or NodeSelection()
    memo = QuantityMemo()
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    nodes: list[SimNode] = []
    raw_pods: list[Mapping[str, Any]] = []
    try:
        for item in parse_document(text, source=str(path)):
            if item["kind"] == "Node":
                reading = read_node(item, budgets, selection, memo)
                if reading is None:
                    raise TraceError(f"{path}: a Node without a name")
                nodes.append(_node(reading))
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
            requests = pod_requests(mapping(raw.get("spec")), memo)
        except (PackingError, TypeError, ValueError) as exc:
            raise TraceError(f"{where}: {exc}") from None
        if not request.pod_uid:
            request = dataclasses.replace(request, pod_uid=request.key)
        cpu = requests.cpu_milli
        shape = pod_shape(request, cpu, threads=_size(request, probe, budgets))
        pods.append(SimPod(request.key, cpu, requests.memory_mib, shape, request))
    if not nodes:
        raise TraceError(f"{path}: no Node objects")
    if not gpus:
        # Every figure is a share of the GPU capacity: with none there is nothing to measure.
        raise TraceError(f"{path}: no Node with a GPU inventory")
    return Cluster(tuple(nodes), tuple(pods))
