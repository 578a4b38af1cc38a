"""The generated cluster: Node objects of 8 GPUs of one model each, and running pods placed
through the packing core itself (`parse_pod` → `fit_node` → `allocate` → `Ledger.assume`), so
that every `mpsched.io/allocation` annotation is one the extender could have written and no GPU
is over any budget; a `v1/List`, as `serve --cluster-file` and the API server load it."""

from __future__ import annotations

import dataclasses
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from extender.packing.codec import allocation_annotations, encode_inventory
from extender.packing.fit import Fit, allocate, fit_node
from extender.packing.ledger import Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory, client_limit
from extender.packing.podspec import parse_pod
from extender.packing.request import ShareRequest
from extender.packing.settings import BudgetSettings
from extender_bench.catalog import (
    GPUS_PER_NODE,
    MODELS,
    SHARE_SHAPES,
    UNITS_PER_GPU,
    USERS,
    WHOLE_SIZES,
    ZONES,
    GpuModel,
    random_uid,
    weighted_pick,
)
from extender_bench.pods import make_pod

Json = dict[str, Any]


def _gpu_uuid(rng: random.Random) -> str:
    return f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _node(rng: random.Random, i: int, model: GpuModel) -> tuple[Json, NodeInventory]:
    name = f"node-{i:05d}"
    gpus = tuple(
        GpuInfo(
            index=g,
            uuid=_gpu_uuid(rng),
            model=model.nvml_name,
            memory_mib=model.memory_mib,
            compute_capability=ComputeCapability.parse(model.cc),
            max_clients=client_limit(ComputeCapability.parse(model.cc)),
            units=UNITS_PER_GPU,
        )
        for g in range(GPUS_PER_NODE)
    )
    zone = ZONES[i % len(ZONES)]
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": model.instance_type,
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": zone,
        "nvidia.com/gpu.product": model.nvml_name.replace(" ", "-"),
        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
        "nvidia.com/gpu.memory": str(model.memory_mib),
        "nvidia.com/mps.capable": "true",
        "mpsched.io/pool": "shared" if i % 5 else "training",
    }
    inventory = NodeInventory(
        name=name,
        gpus=gpus,
        cpu_milli=model.cpu * 1000 - 500,
        memory_mib=(model.memory_gi - 8) * 1024,
        labels=tuple(sorted(labels.items())),
    )
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    resources = {
        "cpu": str(model.cpu),
        "memory": f"{model.memory_gi}Gi",
        "ephemeral-storage": "3840Gi",
        "pods": "110",
        "hugepages-2Mi": "0",
    }
    allocatable = dict(
        resources, cpu=f"{model.cpu * 1000 - 500}m", memory=f"{model.memory_gi - 8}Gi"
    )
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": random_uid(rng),
            "labels": labels,
            "annotations": {
                "mpsched.io/gpus": encode_inventory(inventory),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "creationTimestamp": "2026-11-01T00:00:00Z",
        },
        "spec": {
            "providerID": f"aws:///{zone}/i-{rng.getrandbits(64):016x}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": resources,
            "allocatable": allocatable,
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientMemory",
                },
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.31.4",
                "containerRuntimeVersion": "containerd://1.7.23",
                "kernelVersion": "6.1.0-27-cloud-amd64",
                "osImage": "Ubuntu 22.04.5 LTS",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
        },
    }
    return node, inventory


def gpu_resources(rng: random.Random, model: GpuModel, *, whole: int = 0) -> dict[str, str]:
    """A realistic `mpsched.io/*` ask for a pod meant for `model` (whole > 0: that many GPUs)."""
    if whole:
        return {"mpsched.io/gpus": str(whole)}
    threads, mem_frac, _ = rng.choices(SHARE_SHAPES, weights=[w for *_, w in SHARE_SHAPES])[0]
    ask: dict[str, str] = {}
    if threads is None and mem_frac is None:
        return {"mpsched.io/units": "1"}
    if threads is not None:
        ask["mpsched.io/threads"] = str(threads)
    if mem_frac is not None:
        ask["mpsched.io/memory"] = f"{max(512, int(model.memory_mib * mem_frac) // 512 * 512)}Mi"
    if rng.random() < 0.1:
        ask["mpsched.io/clients"] = "2"
    return ask


@dataclass
class ClusterStats:
    nodes: int = 0
    gpus: int = 0
    running_pods: int = 0
    whole_pods: int = 0
    threads_used_pct: float = 0.0
    models: dict[str, int] = field(default_factory=dict)


def generate_cluster(
    nodes: int, running_pods: int, seed: int, budgets: BudgetSettings | None = None
) -> tuple[Json, ClusterStats]:
    """A `v1/List` of `nodes` Node objects (8 GPUs each, mixed models) and about `running_pods`
    running pods holding about half of the GPU capacity. Every allocation went through the
    ledger (budgets checked) before its annotations were written, as a bind writes them."""
    budgets = budgets or BudgetSettings()
    rng = random.Random(seed)
    ledger = Ledger(budgets)
    items: list[Json] = []
    node_model: list[GpuModel] = []
    host_ips: list[str] = []
    stats = ClusterStats()
    for i in range(nodes):
        model = rng.choices(MODELS, weights=[m.weight for m in MODELS])[0]
        node_doc, inventory = _node(rng, i, model)
        ledger.set_node(inventory)
        items.append(node_doc)
        node_model.append(model)
        host_ips.append(node_doc["status"]["addresses"][0]["address"])
        stats.models[model.key] = stats.models.get(model.key, 0) + 1
    stats.nodes, stats.gpus = nodes, nodes * GPUS_PER_NODE

    serial = 0
    shapes: dict[tuple[tuple[tuple[str, str], ...], int | None], ShareRequest] = {}

    def place(node_i: int, gpu_ask: dict[str, str], user: int | None) -> bool:
        nonlocal serial
        name = f"node-{node_i:05d}"
        model = node_model[node_i]
        pod = make_pod(
            rng,
            serial=serial,
            gpu_ask=gpu_ask,
            model=model,
            run_as_user=user,
            node=name,
            host_ip=host_ips[node_i],
        )
        # parse_pod is exact (quantities as fractions) and so the slowest step here; the
        # request depends only on the ask and the UID, so parse each shape once.
        key = (tuple(sorted(gpu_ask.items())), user)
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = parse_pod(pod, budgets)
        meta = pod["metadata"]
        request = dataclasses.replace(
            shape, namespace=meta["namespace"], name=meta["name"], pod_uid=meta["uid"]
        )
        usage = ledger.node(name)
        fit = fit_node(usage, request, budgets)
        if not isinstance(fit, Fit):
            return False
        gpu_index = None
        if request.kind == "share":
            # Prefer a GPU that already has shares (what a packing scheduler converges to),
            # but not always, so that the cluster keeps some partly used GPUs everywhere.
            busy = [g for g in fit.gpus if usage.gpus[g].shares]
            gpu_index = rng.choice(busy if busy and rng.random() < 0.75 else fit.gpus)
        alloc = allocate(usage, request, fit, gpu_index, budgets)
        ledger.assume(alloc, confirmed=True)
        pod["metadata"]["annotations"].update(allocation_annotations(alloc))
        items.append(pod)
        serial += 1
        return True

    # Whole-GPU jobs first (1, 2, 4 or 8 GPUs): about a fifth of all GPUs end up given out whole.
    whole_target = max(0, round(running_pods * 0.045))
    for _ in range(whole_target):
        node_i = rng.randrange(nodes)
        size = rng.choice(WHOLE_SIZES)
        if place(
            node_i, gpu_resources(rng, node_model[node_i], whole=size), weighted_pick(rng, USERS)
        ):
            stats.whole_pods += 1
    # Shares until the pod count is reached: each try draws a node and a shape, and a shape
    # that does not fit that node is skipped. Bounded: at most 8 tries per wanted pod in all.
    attempts = 0
    while serial < running_pods and attempts < running_pods * 8:
        attempts += 1
        node_i = rng.randrange(nodes)
        place(node_i, gpu_resources(rng, node_model[node_i]), weighted_pick(rng, USERS))
    stats.running_pods = serial
    used = 0
    for name in ledger.node_names():
        for g in ledger.node(name).gpus:
            used += 100 if g.owner is not None else g.threads
    stats.threads_used_pct = 100.0 * used / max(1, stats.gpus * 100)
    doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    return doc, stats
