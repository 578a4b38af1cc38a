"""Extender benchmark: drives `mpsched serve` over HTTP as kube-scheduler does, on a cluster of
5,000 nodes x 8 GPUs, and compares it with a floor: a minimal aiohttp + orjson server in its own
process that does what any extender must (parse the JSON body, echo the node names, scores of 0,
and for bind create the Binding) and nothing more.

Where the cluster lives (`--api`, realistic mode): by default in a Kubernetes API server in its
own process (the project's fake, tests/kube/fake_apiserver.py), which serve lists, watches and
binds through with `--kubeconfig`, as in production; the floor POSTs its Bindings to a second
copy of it, so that both bind the same pods. `--api embedded` keeps the earlier shape: serve's
embedded cluster (`--cluster-file`), the API server's work inside serve's process, and a floor
whose bind only answers. The classic mode always uses the embedded cluster.

Two modes (`--mode`):

realistic (the default): the cluster starts empty and 3,000 distinct pending pods of production
size and variety (~3.3 KB: a ReplicaSet owner, one or two containers, env, volumes, tolerations,
sometimes a nodeSelector; asks mixing threads and memory, units, whole GPUs, two clients) are
scheduled one by one, each new to the extender (its parse is never cached), over candidate
windows of 500 nodes that rotate over the zone-interleaved node list as kube-scheduler's
numFeasibleNodesToFind / nextStartNodeIndex make them; each pod's bind is handed to a worker
and overlaps the next pod's filter, so filters see the nodes binds just changed. The servers
alternate in blocks of pods (`--block`); p50/p99 per verb, pods/s, CPU per pod, the ratios to
the floor and PASS/MISS per target of issue #11 are printed with the machine.

classic (issue #3's bench), described below: a half-full cluster, the same ten shapes warmed
before measuring, random candidate samples, all binds after all filters.

What it measures (loopback only, bounded loops only):
  1. serial filter+prioritize pairs with the scheduler's adaptive candidate count (500 at
     5,000 nodes; reference/extender-protocol.md §4.3), then with every node as a candidate;
  2. concurrent binds (16 in flight) of those pods to the node prioritize ranked first;
  3. the same traffic against the floor, interleaved with the extender's in short blocks of
     pods (`--block`, 50 by default: a tenth of a second or so) so that load from elsewhere on
     a shared machine falls on both alike, while each server runs a block as a dedicated
     process would. Pod-by-pod interleaving (`--block 1`) puts a whole request of the other
     server between any two calls, and each call then starts with the other's data in the CPU
     caches, which a production extender never sees; it costs the extender (a 460 MB heap)
     much more than the floor, so it is kept only as an option;
  4. the serve process's peak RSS (VmHWM) and each server's CPU per pod;
  5. for the record (no target), 20 pods whose shapes no pod in the cluster has: serve warms
     the shapes of pending pods before the scheduler asks, so only these show what a shape
     seen for the first time costs.
Measuring starts once serve is ready and idle (it may warm caches after /readyz). It prints
p50/p99 per verb and per pair, pods/s, the ratio to the floor, the machine, and PASS or MISS per
target. Run `scripts/bench-extender --help`; `--nodes 200 --pods 50` is a smoke run.

The cluster is generated through the packing core itself (`parse_pod` → `fit_node` →
`allocate` → `Ledger.assume`), so every running pod's `mpsched.io/allocation` annotation is one
the extender could have written, and no GPU is over any budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.client
import importlib
import math
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

from extender.http.wire import field as wire_field
from extender.packing.codec import allocation_annotations, encode_inventory
from extender.packing.fit import Fit, allocate, fit_node
from extender.packing.ledger import Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory, client_limit
from extender.packing.podspec import parse_pod
from extender.packing.request import ShareRequest
from extender.packing.settings import BudgetSettings

Json = dict[str, Any]
T = TypeVar("T")

# -- targets (issue #3) ------------------------------------------------------------------------

TARGET_PAIR_P99_MS_ADAPTIVE = 3.0
TARGET_PAIR_P99_MS_ALL = 15.0
TARGET_PODS_PER_S = 700.0
TARGET_FLOOR_RATIO = 2.0
TARGET_RSS_MB = 600.0

BIND_CONCURRENCY = 16
#: Pods of never-seen shapes sent after the serial phases (reported, no target).
NEW_SHAPES = 20
#: Pairs sent before measuring: connection set-up and first-call caches are not what a
#: scheduler that has been running for hours sees.
WARMUP_PAIRS = 20

# -- the cluster ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """One node type of the generated cluster: 8 identical GPUs (mps-and-nvml.md §5)."""

    key: str
    nvml_name: str
    memory_mib: int
    cc: str
    weight: float
    instance_type: str
    cpu: int
    memory_gi: int


MODELS: tuple[GpuModel, ...] = (
    GpuModel("h100", "NVIDIA H100 80GB HBM3", 81559, "9.0", 0.25, "p5.48xlarge", 192, 2048),
    GpuModel("a100-80", "NVIDIA A100-SXM4-80GB", 81920, "8.0", 0.20, "p4de.24xlarge", 96, 1152),
    GpuModel("a100-40", "NVIDIA A100-SXM4-40GB", 40960, "8.0", 0.20, "p4d.24xlarge", 96, 1152),
    GpuModel("l4", "NVIDIA L4", 23034, "8.9", 0.15, "g6.48xlarge", 192, 768),
    GpuModel("v100", "Tesla V100-SXM2-16GB", 16160, "7.0", 0.10, "p3.16xlarge", 64, 488),
    GpuModel("t4", "Tesla T4", 15360, "7.5", 0.10, "g4dn.metal", 96, 384),
)
GPUS_PER_NODE = 8
UNITS_PER_GPU = 4
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
NAMESPACES = ("ml-train", "ml-infer", "research", "batch", "recsys", "vision")
APPS = ("llm-serve", "embedder", "trainer", "notebook", "etl", "ranker", "detector", "asr")
IMAGES = (
    "nvcr.io/nvidia/pytorch:24.05-py3",
    "nvcr.io/nvidia/tritonserver:24.05-py3",
    "nvcr.io/nvidia/tensorflow:24.03-tf2-py3",
    "ghcr.io/example/llm-serve:1.8.2",
    "registry.example.com/research/notebook:2026.11",
)
#: Effective runAsUser of GPU pods: mostly one platform UID, some teams run their own.
USERS: tuple[tuple[int | None, float], ...] = ((1000, 0.7), (2000, 0.2), (None, 0.1))
#: Share shapes of running pods: (threads %, memory as a fraction of the GPU or None, weight).
SHARE_SHAPES: tuple[tuple[int | None, float | None, float], ...] = (
    (5, None, 0.15),
    (10, None, 0.20),
    (20, 0.15, 0.20),
    (25, None, 0.15),
    (30, 0.25, 0.10),
    (50, 0.45, 0.08),
    (None, 0.10, 0.07),  # memory-only: threads follow proportionally
    (None, None, 0.05),  # one share unit (units-style ask)
)
WHOLE_SIZES = (1, 2, 4, 8)


def _pick(rng: random.Random, items: Sequence[tuple[T, float]]) -> T:
    return rng.choices([i for i, _ in items], weights=[w for _, w in items])[0]


def _gpu_uuid(rng: random.Random) -> str:
    return f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


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
            "uid": _uid(rng),
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


def make_pod(
    rng: random.Random,
    *,
    serial: int,
    gpu_ask: dict[str, str],
    model: GpuModel | None,
    run_as_user: int | None,
    node: str | None = None,
    host_ip: str | None = None,
) -> Json:
    """A Deployment-style pod with the bulk of a real one: labels, owner, env, probes, volumes,
    tolerations, affinity (pinned to a GPU product for about half of them), resources."""
    app = APPS[serial % len(APPS)]
    ns = NAMESPACES[(serial // len(APPS)) % len(NAMESPACES)]
    rs_hash = f"{(serial // 7) & 0xFFFFFFF:07x}"
    name = f"{app}-{rs_hash}-{serial:06d}"
    cpu = rng.choice((1, 2, 4, 8))
    main: Json = {
        "name": "main",
        "image": rng.choice(IMAGES),
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", f"{app.replace('-', '_')}.main"],
        "args": ["--port=8000", f"--batch-size={rng.choice((8, 16, 32, 64))}"],
        "env": [
            {"name": "MODEL_NAME", "value": f"{app}-v{rng.randint(1, 9)}"},
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "OMP_NUM_THREADS", "value": str(cpu)},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
        ],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "resources": {
            "limits": {"cpu": str(cpu), "memory": f"{cpu * 4}Gi", **gpu_ask},
            "requests": {"cpu": str(cpu), "memory": f"{cpu * 4}Gi", **gpu_ask},
        },
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": 8000, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
        },
        "volumeMounts": [
            {"name": "cache", "mountPath": "/cache"},
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }
    containers = [main]
    if serial % 4 == 0:
        # A log shipper sidecar that asks for no GPU: common, and must not change the demand.
        containers.append(
            {
                "name": "log-shipper",
                "image": "fluent/fluent-bit:3.1",
                "resources": {"limits": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "cache", "mountPath": "/cache", "readOnly": True}],
            }
        )
    spec: Json = {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "enableServiceLinks": False,
        "securityContext": {"fsGroup": 1000}
        | ({"runAsUser": run_as_user, "runAsNonRoot": True} if run_as_user is not None else {}),
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "volumes": [
            {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}},
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
                    ]
                },
            },
        ],
    }
    if model is not None and serial % 2 == 0:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": [model.nvml_name.replace(" ", "-")],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    status: Json = {"phase": "Pending", "qosClass": "Guaranteed"}
    if node is not None:
        spec["nodeName"] = node
        status = {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "hostIP": host_ip,
            "podIP": f"172.{16 + serial % 16}.{(serial >> 8) & 255}.{serial & 255}",
            "startTime": "2026-11-30T06:00:00Z",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": _uid(rng),
            "labels": {
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/part-of": ns,
                "pod-template-hash": rs_hash,
            },
            "annotations": {"kubectl.kubernetes.io/default-container": "main"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-{rs_hash}",
                    "uid": _uid(rng),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "creationTimestamp": "2026-11-30T06:00:00Z",
        },
        "spec": spec,
        "status": status,
    }


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
        if place(node_i, gpu_resources(rng, node_model[node_i], whole=size), _pick(rng, USERS)):
            stats.whole_pods += 1
    # Shares until the pod count is reached: each try draws a node and a shape, and a shape
    # that does not fit that node is skipped. Bounded: at most 8 tries per wanted pod in all.
    attempts = 0
    while serial < running_pods and attempts < running_pods * 8:
        attempts += 1
        node_i = rng.randrange(nodes)
        place(node_i, gpu_resources(rng, node_model[node_i]), _pick(rng, USERS))
    stats.running_pods = serial
    used = 0
    for name in ledger.node_names():
        for g in ledger.node(name).gpus:
            used += 100 if g.owner is not None else g.threads
    stats.threads_used_pct = 100.0 * used / max(1, stats.gpus * 100)
    doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    return doc, stats


# -- pending pods --------------------------------------------------------------------------------


def pending_pods(count: int, seed: int, *, first_serial: int = 900_000) -> list[Json]:
    """Pods waiting to be scheduled, in a mix of the shapes users ask for."""
    rng = random.Random(seed)
    pods: list[Json] = []
    asks: tuple[tuple[dict[str, str], float], ...] = (
        ({"mpsched.io/threads": "10"}, 0.20),
        ({"mpsched.io/threads": "25", "mpsched.io/memory": "10Gi"}, 0.20),
        ({"mpsched.io/threads": "50"}, 0.10),
        ({"mpsched.io/memory": "6Gi"}, 0.10),
        ({"mpsched.io/units": "1"}, 0.10),
        ({"mpsched.io/units": "2"}, 0.05),
        ({"mpsched.io/threads": "20", "mpsched.io/clients": "4"}, 0.05),
        ({"mpsched.io/gpus": "1"}, 0.10),
        ({"mpsched.io/gpus": "2"}, 0.05),
        ({"mpsched.io/gpus": "4"}, 0.05),
    )
    for k in range(count):
        ask = _pick(rng, asks)
        pod = make_pod(
            rng,
            serial=first_serial + k,
            gpu_ask=dict(ask),
            model=None,
            run_as_user=_pick(rng, USERS),
        )
        pods.append(pod)
    return pods


def new_shape_pods(count: int, seed: int, *, first_serial: int = 800_000) -> list[Json]:
    """Pods with GPU asks no pod in the cluster has (thread percentages that are not multiples
    of 5, which the pending and running mixes never use): what a first-seen shape costs, since
    serve cannot have warmed its caches for them."""
    rng = random.Random(seed)
    threads = [t for t in range(11, 100) if t % 5][:count]
    return [
        make_pod(
            rng,
            serial=first_serial + k,
            gpu_ask={"mpsched.io/threads": str(t)},
            model=None,
            run_as_user=_pick(rng, USERS),
        )
        for k, t in enumerate(threads)
    ]


def adaptive_candidates(num_nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with percentageOfNodesToScore unset (§4.3)."""
    if num_nodes < 100:
        return num_nodes
    pct = max(5, 50 - num_nodes // 125)
    return max(100, num_nodes * pct // 100)


# -- the floor server ----------------------------------------------------------------------------


def _lower_keys(doc: Any) -> dict[str, Any]:
    return {k.lower(): v for k, v in doc.items()} if isinstance(doc, dict) else {}


#: Seconds the floor's Binding POST may take (every network call has a timeout).
FLOOR_BIND_TIMEOUT_S = 10.0


def binding_body(name: str, namespace: str, uid: str, node: str) -> bytes:
    """The Binding an extender that binds must POST (reference/extender-protocol.md §5.1)."""
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


def floor_app(api_url: str | None = None, token: str = "") -> web.Application:
    """The least an extender can do over HTTP: parse the request, accept every candidate, and
    for bind create the Binding at the API server at `api_url` with the bearer `token`
    (kube-scheduler leaves that to a binding extender); with no API server, bind only answers."""
    api = web.AppKey("api", aiohttp.ClientSession)

    async def client(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=FLOOR_BIND_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            app[api] = session
            yield

    async def filter_(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        body: Json = {
            "NodeNames": args.get("nodenames") or [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def prioritize(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        body = [{"Host": n, "Score": 0} for n in args.get("nodenames") or []]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def bind(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        error = ""
        if api_url is not None:
            name, namespace = str(args.get("podname")), str(args.get("podnamespace"))
            body = binding_body(name, namespace, str(args.get("poduid")), str(args.get("node")))
            url = f"{api_url}/api/v1/namespaces/{namespace}/pods/{name}/binding"
            try:
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
                async with request.app[api].post(url, data=body, headers=headers) as resp:
                    answer = await resp.read()
                    if resp.status != 201:
                        error = f"binding answered {resp.status}: {answer[:200]!r}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"binding failed: {exc!r}"
        return web.Response(body=orjson.dumps({"Error": error}), content_type="application/json")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    # The same body limit as serve's default (8 MiB); aiohttp's own default is 1 MiB.
    app = web.Application(client_max_size=8 << 20)
    if api_url is not None:
        app.cleanup_ctx.append(client)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_get("/readyz", readyz)
    return app


async def _forever(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # until the bench terminates this process


def _run(main: Coroutine[Any, Any, None]) -> int:
    """Run a server on the same event loop `mpsched serve --loop auto` picks: uvloop when it
    is installed, asyncio otherwise, so that the comparison is of the servers, not the loops."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
    return 0


def serve_floor(port: int, api_url: str | None) -> int:
    token = _fake_apiserver().TOKEN if api_url is not None else ""
    return _run(_forever(floor_app(api_url, token), port))


# -- the API server ------------------------------------------------------------------------------


def _fake_apiserver() -> Any:
    """The project's fake API server module (tests/kube/fake_apiserver.py), from the checkout
    this script is in: the bench's API server and its kubeconfig."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)  # after the installed build, which must stay the one imported
    return importlib.import_module("tests.kube.fake_apiserver")


def serve_api(port: int, cluster_file: Path) -> int:
    """A Kubernetes API server in its own process, holding the cluster dump: the project's
    fake (tests/kube/fake_apiserver.py: resourceVersions, paged lists, watches, the Binding
    subresource's answers), as production has the API server outside the extender's process.
    /readyz answers once the dump is loaded."""
    FakeApiServer = _fake_apiserver().FakeApiServer  # noqa: N806 (a class)
    items = orjson.loads(cluster_file.read_bytes())["items"]

    async def main() -> None:
        fake = FakeApiServer()
        for item in items:
            fake.put(item)
        app = fake.app()

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/readyz", readyz)
        await _forever(app, port)

    return _run(main())


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_ready(server: Server, timeout_s: float) -> None:
    """Poll /readyz until 200; fail with the server's last log lines if it exits or stalls."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with status {server.proc.returncode}:\n{server.tail()}"
            )
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout_s:.0f}s:\n{server.tail()}")


@contextlib.contextmanager
def started(
    name: str, argv: list[str], port: int, workdir: Path, ready_s: float
) -> Iterator[Server]:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        # Run from the work directory, not the checkout: with an installed build (the
        # compiled one), the checkout's sources on sys.path would shadow it.
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir
        )
    server = Server(name, proc, port, log)
    try:
        wait_ready(server, ready_s)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def rss_mb(pid: int, field: str = "VmHWM") -> float | None:
    """A memory figure of a live process from /proc/<pid>/status, in MB: VmHWM (peak resident
    set) by default, or VmRSS (now). None where /proc has no answer."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def wait_idle(pid: int, timeout_s: float, *, busy_below: float = 0.05) -> float:
    """Wait until the process has used less than `busy_below` of a core for two seconds in a
    row (an extender may keep warming caches after /readyz says yes; measuring the floor or the
    extender while it does would measure the warm-up). Returns the seconds waited."""
    t0 = time.monotonic()
    calm = 0
    last = cpu_seconds(pid)
    while last is not None and time.monotonic() - t0 < timeout_s and calm < 2:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now is None:
            break
        calm = calm + 1 if now - last < busy_below else 0
        last = now
    return time.monotonic() - t0


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def runtime(python: str, workdir: Path) -> dict[str, str]:
    """What serve and the floor run on: the interpreter, its Python, mpsched's build (mypyc:
    the decision core compiled, as the image ships; python: the sources) and the event loop
    `serve --loop auto` and the floor pick (uvloop when installed)."""
    probe = (
        "import importlib.util, platform, extender.build as b; "
        "print(platform.python_version(), b.build(), "
        "'uvloop' if importlib.util.find_spec('uvloop') else 'asyncio')"
    )
    done = subprocess.run(
        [python, "-c", probe], cwd=workdir, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot run {python}: {done.stderr.strip()[-500:]}")
    version, build, loop = done.stdout.split()
    return {"interpreter": python, "python": version, "build": build, "loop": loop}


def _runtime_line(r: dict[str, str]) -> str:
    return (
        f"serve and floor: Python {r['python']}, mpsched build {r['build']}, loop {r['loop']} "
        f"({r['interpreter']})"
    )


# -- the driver ----------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule (no interpolation): a p99 that really occurred."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class PhaseResult:
    candidates: int
    pods: int
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    #: CPU seconds the server process used over the measured pods (user + system).
    server_cpu_s: float | None = None
    feasible: int = 0
    unschedulable: int = 0
    picks: list[tuple[Json, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def stats(v: list[float]) -> dict[str, float]:
            return {"p50": round(pct(v, 0.5), 3), "p99": round(pct(v, 0.99), 3), "n": len(v)}

        return {
            "candidates": self.candidates,
            "pods": self.pods,
            "filter_ms": stats(self.filter_ms),
            "prioritize_ms": stats(self.prioritize_ms),
            "pair_ms": stats(self.pair_ms),
            # What the extender caps a serial scheduler at (extender-protocol.md §2.9): pods over
            # the time spent inside filter+prioritize calls. The harness's own wall-clock rate
            # also pays for Python-side JSON encoding that kube-scheduler does in Go.
            "pods_per_s": round(self.pods / (sum(self.pair_ms) / 1000), 1)
            if self.pair_ms
            else None,
            "harness_pods_per_s": round(self.pods / self.wall_s, 1) if self.wall_s else None,
            # The server's own CPU per pod, filter and prioritize together: on a shared, noisy
            # machine the steadiest figure of what a server costs (latency adds the wake-ups
            # and the loopback, which both servers pay alike).
            "server_cpu_ms_per_pod": round(self.server_cpu_s * 1000 / self.pods, 3)
            if self.server_cpu_s is not None and self.pods
            else None,
            "placed": self.feasible,
            "unschedulable": self.unschedulable,
        }


class Client:
    """One keep-alive HTTP/1.1 connection, as kube-scheduler's serial loop uses, written on a
    bare socket: http.client's header parsing costs more than a floor request itself, and the
    harness must not hide the extender's latency under its own. Blocking on purpose: the serial
    phase runs no event loop."""

    def __init__(self, port: int, prefix: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.prefix = prefix.rstrip("/")
        self.buf = b""

    def post(self, verb: str, body: bytes) -> tuple[float, bytes]:
        head = (
            f"POST {self.prefix}/{verb} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        self.sock.sendall(head + body)
        status, data = self._response()
        ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            raise RuntimeError(f"{verb} answered HTTP {status}: {data[:200]!r}")
        return ms, data

    def _read_until(self, mark: bytes) -> bytes:
        while (i := self.buf.find(mark)) < 0:
            self._fill()
        out, self.buf = self.buf[:i], self.buf[i + len(mark) :]
        return out

    def _read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _response(self) -> tuple[int, bytes]:
        lines = self._read_until(b"\r\n\r\n").split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            headers[key.strip().lower()] = value.strip()
        if b"content-length" in headers:
            return status, self._read_exact(int(headers[b"content-length"]))
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            while size := int(self._read_until(b"\r\n").split(b";")[0], 16):
                parts.append(self._read_exact(size))
                self._read_exact(2)
            self._read_until(b"\r\n")
            return status, b"".join(parts)
        raise RuntimeError("response has neither Content-Length nor chunked encoding")

    def close(self) -> None:
        self.sock.close()


def schedule_one(
    client: Client, pod: Json, names: list[str], result: PhaseResult | None
) -> str | None:
    """One scheduling cycle as kube-scheduler runs it against a nodeCacheCapable extender:
    filter; prioritize only if more than one node is left; highest score, ties to the first
    name. Returns the chosen node (None: unschedulable)."""
    f_ms, raw = client.post("filter", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
    reply = orjson.loads(raw)
    if wire_field(reply, "Error"):
        raise RuntimeError(f"filter returned Error: {wire_field(reply, 'Error')}")
    feasible: list[str] = wire_field(reply, "NodeNames") or []
    p_ms = 0.0
    chosen: str | None = feasible[0] if feasible else None
    if len(feasible) > 1:
        p_ms, raw = client.post(
            "prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": feasible})
        )
        scores = {wire_field(h, "Host"): int(wire_field(h, "Score")) for h in orjson.loads(raw)}
        chosen = min(feasible, key=lambda n: (-scores.get(n, 0), n))
    if result is not None:
        result.filter_ms.append(f_ms)
        if len(feasible) > 1:
            result.prioritize_ms.append(p_ms)
        result.pair_ms.append(f_ms + p_ms)
        if chosen is None:
            result.unschedulable += 1
        else:
            result.feasible += 1
            result.picks.append((pod, chosen))
    return chosen


@dataclass(frozen=True)
class Target:
    """One server under test."""

    name: str
    port: int
    prefix: str = ""
    #: The server's process, for its CPU time (None: not measured).
    pid: int | None = None


def run_phase(
    targets: Sequence[Target],
    pods: list[Json],
    node_names: list[str],
    candidates: int,
    seed: int,
    *,
    block: int = 1,
) -> dict[str, PhaseResult]:
    """Every pod's cycle against every target, interleaved in blocks of `block` pods (in
    alternating order), so that load from elsewhere on a shared machine falls on all alike."""
    rng = random.Random(seed)
    results = {t.name: PhaseResult(candidates, len(pods)) for t in targets}
    clients = [Client(t.port, t.prefix) for t in targets]
    try:
        for pod in pods[:WARMUP_PAIRS]:
            names = rng.sample(node_names, min(candidates, len(node_names)))
            for client in clients:
                schedule_one(client, pod, names, None)
        # Candidate lists are drawn before the clock starts: the scheduler's own filtering is
        # not what is measured here.
        lists = [
            node_names if candidates >= len(node_names) else rng.sample(node_names, candidates)
            for _ in pods
        ]
        cpu_before = {t.name: cpu_seconds(t.pid) if t.pid else None for t in targets}
        work = list(zip(pods, lists, strict=True))
        order = list(zip(targets, clients, strict=True))
        for i, start in enumerate(range(0, len(work), block)):
            for target, client in order if i % 2 == 0 else reversed(order):
                result = results[target.name]
                for pod, names in work[start : start + block]:
                    t0 = time.perf_counter()
                    schedule_one(client, pod, names, result)
                    result.wall_s += time.perf_counter() - t0
        for t in targets:
            before, after = cpu_before[t.name], cpu_seconds(t.pid) if t.pid else None
            if before is not None and after is not None:
                results[t.name].server_cpu_s = after - before
    finally:
        for client in clients:
            client.close()
    return results


def run_new_shapes(
    target: Target, pods: list[Json], node_names: list[str], candidates: int, seed: int
) -> PhaseResult:
    """One cycle per pod, no warm-up: each pod's shape is new to the server."""
    rng = random.Random(seed)
    result = PhaseResult(candidates, len(pods))
    client = Client(target.port, target.prefix)
    try:
        for pod in pods:
            names = rng.sample(node_names, min(candidates, len(node_names)))
            t0 = time.perf_counter()
            schedule_one(client, pod, names, result)
            result.wall_s += time.perf_counter() - t0
    finally:
        client.close()
    return result


@dataclass
class BindResult:
    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    refused: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "binds": len(self.latencies_ms),
            "ok": self.ok,
            "refused": self.refused,
            "concurrency": BIND_CONCURRENCY,
            "p50_ms": round(pct(self.latencies_ms, 0.5), 3),
            "p99_ms": round(pct(self.latencies_ms, 0.99), 3),
            "binds_per_s": round(len(self.latencies_ms) / self.wall_s, 1) if self.wall_s else None,
            "sample_errors": self.errors[:3],
        }


async def bind_all(port: int, prefix: str, picks: list[tuple[Json, str]]) -> BindResult:
    """Bind every pod to its picked node, BIND_CONCURRENCY in flight, as the scheduler's
    per-pod binding goroutines do. A refusal (the node filled up since filter) is counted."""
    result = BindResult()
    sem = asyncio.Semaphore(BIND_CONCURRENCY)
    url = f"http://127.0.0.1:{port}{prefix.rstrip('/')}/bind"
    connector = aiohttp.TCPConnector(limit=BIND_CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(pod: Json, node: str) -> None:
            meta = pod["metadata"]
            body = orjson.dumps(
                {
                    "PodName": meta["name"],
                    "PodNamespace": meta["namespace"],
                    "PodUID": meta["uid"],
                    "Node": node,
                }
            )
            async with sem:
                t0 = time.perf_counter()
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    raw = await resp.read()
                result.latencies_ms.append((time.perf_counter() - t0) * 1000)
            error = wire_field(orjson.loads(raw), "Error") if resp.status == 200 else raw[:200]
            if error:
                result.refused += 1
                result.errors.append(str(error))
            else:
                result.ok += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p, n) for p, n in picks))
        result.wall_s = time.perf_counter() - t0
    return result


def measure(
    targets: Sequence[Target],
    node_names: list[str],
    pods_a: list[Json],
    pods_b: list[Json],
    candidates: int,
    seed: int,
    *,
    block: int = 1,
    new_shapes: Sequence[Json] = (),
) -> dict[str, dict[str, Any]]:
    """Both serial phases, the pods of never-seen shapes, then, target by target, the binds of
    every pod that found a node."""
    adaptive = run_phase(targets, pods_a, node_names, candidates, seed, block=block)
    everything = run_phase(targets, pods_b, node_names, len(node_names), seed + 1, block=block)
    out = {}
    for t in targets:
        fresh = run_new_shapes(t, list(new_shapes), node_names, candidates, seed + 2)
        picks = adaptive[t.name].picks + everything[t.name].picks
        binds = asyncio.run(bind_all(t.port, t.prefix, picks))
        out[t.name] = {
            "adaptive": adaptive[t.name].summary(),
            "all": everything[t.name].summary(),
            "new_shapes": fresh.summary(),
            "bind": binds.summary(),
        }
    return out


# -- realistic mode ------------------------------------------------------------------------------
#
# What the classic mode leaves out, each of which makes it easier than production:
#   - its pending pods are in the cluster dump under the very resourceVersion the filter bodies
#     carry, so serve parsed every one of them (and warmed every shape) before the clock started:
#     a filter never pays for parsing its pod;
#   - its pods come in ten shapes: the result arrays of every shape are warm for every node;
#   - its candidate lists are random samples, never kube-scheduler's rotating windows;
#   - its binds all run after every filter, so no filter ever sees a node changed by a bind
#     (every node state is one the caches hold), and binds never overlap a filter;
#   - its pods are ~2.3 KB, a production pod with a ReplicaSet owner, env and volumes ~3.3 KB.
# The realistic mode drives serve as kube-scheduler drives an extender in a busy cluster.

#: Mixes of the realistic pods' GPU asks (weights): threads with and without memory, units,
#: whole GPUs, memory alone, two MPS clients.
REAL_ASKS: tuple[tuple[str, float], ...] = (
    ("threads", 0.30),
    ("threads+memory", 0.25),
    ("units", 0.12),
    ("memory", 0.08),
    ("whole", 0.15),
    ("clients", 0.10),
)
BIND_WORKERS = 4
#: Pods each server schedules before the measured ones (connections, first-call caches).
REAL_WARMUP = 20


def realistic_ask(rng: random.Random) -> dict[str, str]:
    kind = _pick(rng, REAL_ASKS)
    if kind == "whole":
        return {"mpsched.io/gpus": str(rng.choice((1, 1, 1, 2, 2, 4)))}
    if kind == "units":
        return {"mpsched.io/units": str(rng.choice((1, 1, 2, 3)))}
    if kind == "memory":
        return {"mpsched.io/memory": rng.choice(("2Gi", "4Gi", "6Gi", "8Gi", "4096Mi", "12Gi"))}
    threads = str(rng.choice((5, 10, 10, 15, 20, 20, 25, 30, 40, 50)))
    ask = {"mpsched.io/threads": threads}
    if kind == "threads+memory":
        ask["mpsched.io/memory"] = rng.choice(("1Gi", "2Gi", "3Gi", "4Gi", "8Gi", "1536Mi"))
    elif kind == "clients":
        ask["mpsched.io/clients"] = "2"
    return ask


def realistic_pods(count: int, seed: int, *, first_serial: int = 500_000) -> list[Json]:
    """Distinct pending pods of production size and variety (~3.3 KB each): Deployment pods
    with a ReplicaSet owner, one or two containers, env, volumes, tolerations, sometimes a
    nodeSelector, and asks mixing threads, memory, units, whole GPUs and clients."""
    rng = random.Random(seed)
    pods = []
    for k in range(count):
        serial = first_serial + k
        pod = make_pod(
            rng,
            serial=serial,
            gpu_ask=realistic_ask(rng),
            model=None,
            run_as_user=_pick(rng, USERS),
        )
        meta, spec = pod["metadata"], pod["spec"]
        app = meta["labels"]["app.kubernetes.io/name"]
        meta["generateName"] = meta["name"].rsplit("-", 1)[0] + "-"
        meta["labels"] |= {
            "app.kubernetes.io/instance": f"{app}-{serial % 13}",
            "app.kubernetes.io/version": f"1.{serial % 9}.{serial % 17}",
            "team": meta["namespace"],
        }
        meta["annotations"] |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "8000",
            "prometheus.io/path": "/metrics",
        }
        main = spec["containers"][0]
        main["env"] += [
            {"name": "HF_HOME", "value": "/cache/huggingface"},
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "TRACE_ENDPOINT", "value": "http://otel-collector.observability:4317"},
            {
                "name": "API_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": f"{app}-secrets", "key": "token"}},
            },
        ]
        main["livenessProbe"] = {
            "httpGet": {"path": "/livez", "port": 8000, "scheme": "HTTP"},
            "initialDelaySeconds": 30,
            "periodSeconds": 20,
            "failureThreshold": 3,
        }
        main["volumeMounts"].append({"name": "config", "mountPath": "/etc/app", "readOnly": True})
        spec["volumes"].append({"name": "config", "configMap": {"name": f"{app}-config"}})
        spec["nodeName"] = None
        spec.pop("nodeName")
        if rng.random() < 0.15:
            spec["nodeSelector"] = (
                {"topology.kubernetes.io/zone": rng.choice(ZONES)}
                if rng.random() < 0.5
                else {"mpsched.io/pool": "shared"}
            )
        pod["status"] = {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": "2026-11-30T06:00:01Z",
                }
            ],
        }
        pods.append(pod)
    return pods


def zone_interleaved(nodes: list[Json]) -> list[str]:
    """kube-scheduler's node order (its node tree): one node of each zone in turn."""
    zones: dict[str, list[str]] = {}
    for n in nodes:
        meta = n["metadata"]
        zones.setdefault(meta["labels"].get("topology.kubernetes.io/zone", ""), []).append(
            meta["name"]
        )
    lists = list(zones.values())
    out: list[str] = []
    for i in range(max(map(len, lists), default=0)):
        out.extend(z[i] for z in lists if i < len(z))
    return out


@dataclass
class Scheduler:
    """One kube-scheduler's view of the nodes for one target: the zone-interleaved node list,
    each node's labels, and nextStartNodeIndex."""

    order: list[str]
    labels: dict[str, dict[str, str]]
    to_find: int
    start: int = 0

    def window(self, pod: Json) -> list[str]:
        """findNodesThatPassFilters: from nextStartNodeIndex, the first `to_find` nodes that
        pass the scheduler's own filters (here nodeSelector; the GPU check is the extender's),
        and the start index moves past every node looked at."""
        selector = pod["spec"].get("nodeSelector") or {}
        n = len(self.order)
        found: list[str] = []
        looked = 0
        while looked < n and len(found) < self.to_find:
            name = self.order[(self.start + looked) % n]
            looked += 1
            labels = self.labels[name]
            if all(labels.get(k) == v for k, v in selector.items()):
                found.append(name)
        self.start = (self.start + looked) % n
        return found


@dataclass
class RealResult:
    pods: int = 0
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    #: Wall-clock seconds of the scheduling loop (filter, prioritize, pick, bind handed off),
    #: binds of the block's last pods waited for: what a serial scheduler's rate is made of.
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    placed: int = 0
    unschedulable: int = 0
    bind_ok: int = 0
    bind_refused: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def stats(v: list[float]) -> dict[str, float]:
            return {"p50": round(pct(v, 0.5), 3), "p99": round(pct(v, 0.99), 3), "n": len(v)}

        return {
            "pods": self.pods,
            "filter_ms": stats(self.filter_ms),
            "prioritize_ms": stats(self.prioritize_ms),
            "pair_ms": stats(self.pair_ms),
            "bind_ms": stats(self.bind_ms),
            "pods_per_s": round(self.pods / self.wall_s, 1) if self.wall_s else None,
            "pods_per_s_in_calls": round(self.pods / (sum(self.pair_ms) / 1000), 1)
            if self.pair_ms
            else None,
            "server_cpu_ms_per_pod": round(self.server_cpu_s * 1000 / self.pods, 3)
            if self.pods
            else None,
            "placed": self.placed,
            "unschedulable": self.unschedulable,
            "bind_ok": self.bind_ok,
            "bind_refused": self.bind_refused,
            "sample_errors": self.errors[:3],
        }


class Binder:
    """kube-scheduler's binding cycles: each chosen pod's bind is handed to a worker thread and
    runs while the next pod's scheduling cycle does (its own keep-alive connections)."""

    def __init__(self, port: int, prefix: str, workers: int = BIND_WORKERS) -> None:
        import queue
        import threading

        self._queue: queue.Queue[tuple[bytes, RealResult | None] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(Client(port, prefix),), daemon=True)
            for _ in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, pod: Json, node: str, result: RealResult | None) -> None:
        meta = pod["metadata"]
        body = orjson.dumps(
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": node,
            }
        )
        self._queue.put((body, result))

    def drain(self) -> None:
        self._queue.join()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)

    def _work(self, client: Client) -> None:
        try:
            while (item := self._queue.get()) is not None:
                body, result = item
                try:
                    ms, raw = client.post("bind", body)
                    error = wire_field(orjson.loads(raw), "Error")
                except (RuntimeError, OSError) as exc:
                    ms, error = math.nan, str(exc)
                if result is not None:
                    with self._lock:
                        if not math.isnan(ms):
                            result.bind_ms.append(ms)
                        if error:
                            result.bind_refused += 1
                            result.errors.append(str(error))
                        else:
                            result.bind_ok += 1
                self._queue.task_done()
            self._queue.task_done()
        finally:
            client.close()


def schedule_real(
    client: Client,
    binder: Binder,
    sched: Scheduler,
    pod: Json,
    rng: random.Random,
    result: RealResult | None,
) -> None:
    """One scheduling cycle: the window, filter, prioritize if more than one node is left, the
    highest score with ties broken at random (selectHost), then the bind handed off."""
    names = sched.window(pod)
    f_ms, raw = client.post("filter", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
    reply = orjson.loads(raw)
    if wire_field(reply, "Error"):
        raise RuntimeError(f"filter returned Error: {wire_field(reply, 'Error')}")
    feasible: list[str] = wire_field(reply, "NodeNames") or []
    p_ms = 0.0
    chosen = feasible[0] if feasible else None
    if len(feasible) > 1:
        p_ms, raw = client.post(
            "prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": feasible})
        )
        best, ties = -1, []
        for h in orjson.loads(raw):
            score = int(wire_field(h, "Score"))
            if score > best:
                best, ties = score, [wire_field(h, "Host")]
            elif score == best:
                ties.append(wire_field(h, "Host"))
        chosen = rng.choice(ties)
    if result is not None:
        result.filter_ms.append(f_ms)
        if len(feasible) > 1:
            result.prioritize_ms.append(p_ms)
        result.pair_ms.append(f_ms + p_ms)
        result.pods += 1
        if chosen is None:
            result.unschedulable += 1
        else:
            result.placed += 1
    if chosen is not None:
        binder.submit(pod, chosen, result)


def measure_realistic(
    targets: Sequence[Target],
    nodes: list[Json],
    warmup: list[Json],
    pods: list[Json],
    candidates: int,
    seed: int,
    *,
    block: int,
) -> dict[str, dict[str, Any]]:
    """Every pod through every target, the targets alternating in blocks of `block` pods (in
    alternating order); a target's binds are waited for before the other's block starts."""
    order = zone_interleaved(nodes)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    results = {t.name: RealResult() for t in targets}
    runs = []
    for i, t in enumerate(targets):
        client = Client(t.port, t.prefix)
        binder = Binder(t.port, t.prefix)
        runs.append(
            (t, client, binder, Scheduler(order, labels, candidates), random.Random(seed + i))
        )
    try:
        for _, client, binder, sched, rng in runs:
            for pod in warmup:
                schedule_real(client, binder, sched, pod, rng, None)
            binder.drain()
        for i, start in enumerate(range(0, len(pods), block)):
            for t, client, binder, sched, rng in runs if i % 2 == 0 else reversed(runs):
                result = results[t.name]
                cpu0 = cpu_seconds(t.pid) if t.pid else None
                t0 = time.perf_counter()
                for pod in pods[start : start + block]:
                    schedule_real(client, binder, sched, pod, rng, result)
                binder.drain()
                result.wall_s += time.perf_counter() - t0
                cpu1 = cpu_seconds(t.pid) if t.pid else None
                if cpu0 is not None and cpu1 is not None:
                    result.server_cpu_s += cpu1 - cpu0
    finally:
        for _, client, binder, _, _ in runs:
            binder.close()
            client.close()
    return {name: r.summary() for name, r in results.items()}


def realistic_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    ext, floor = report["extender"], report["floor"]

    def ratio(key: str) -> float:
        a, b = ext[key]["p50"], floor[key]["p50"]
        return round(a / b, 2) if b else math.nan

    rows = [
        ("filter+prioritize p50 vs floor", ratio("pair_ms"), "<=", 1.5, "x"),
        ("bind p50 vs floor", ratio("bind_ms"), "<=", 1.5, "x"),
        ("pods/s sequential", ext["pods_per_s"], ">=", TARGET_PODS_PER_S, "pods/s"),
        ("peak RSS of serve", report["serve"]["peak_rss_mb"], "<=", TARGET_RSS_MB, "MB"),
    ]
    return _verdicts(rows)


def _target_lines(targets: list[dict[str, Any]]) -> list[str]:
    """One PASS/MISS line per target, as both modes print them."""
    lines = []
    for t in targets:
        v = t["value"]
        shown = "n/a" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
        lines.append(
            f"{t['result']:4}  {t['target']}: {shown} {t['unit']} (target {t['op']} "
            f"{t['limit']:g} {t['unit']})"
        )
    return lines


_API_LINES = {
    "process": "cluster: an API server in its own process per server (serve watches it and "
    "POSTs its Bindings there; the floor POSTs its Bindings to its own)",
    "embedded": "cluster: embedded in serve's process (--cluster-file); the floor's bind only "
    "answers",
}


def render_realistic(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["cluster"]
    ext, floor = report["extender"], report["floor"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']} ({m['platform']}); "
        f"1-minute load average {m['load_1m'][0]:.2f} before measuring, "
        f"{m['load_1m'][1]:.2f} after",
        _runtime_line(report["runtime"]),
        f"mode realistic: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs starting empty, "
        f"{c['pods']} distinct pending pods of {c['pod_kb']:.1f} KB on average "
        f"(each new to the extender), windows of {c['candidates']} nodes rotating over the "
        f"zone-interleaved node list, binds async ({BIND_WORKERS} workers) overlapping the next "
        f"pod; servers alternate every {report['block']} pods",
        _API_LINES[report.get("api", "embedded")],
        "",
        f"{'':10}{'filter p50/p99':>18}{'prioritize p50/p99':>22}{'pair p50/p99':>18}"
        f"{'bind p50/p99':>18}{'pods/s':>8}{'cpu/pod':>10}{'placed':>12}",
    ]
    for who, r in (("extender", ext), ("floor", floor)):
        lines.append(
            f"{who:10}{_pp(r['filter_ms']):>18}{_pp(r['prioritize_ms']):>22}"
            f"{_pp(r['pair_ms']):>18}{_pp(r['bind_ms']):>18}{r['pods_per_s'] or 0:>8.0f}"
            f"{r['server_cpu_ms_per_pod'] or 0:>7.2f} ms{r['placed']:>6}/{r['pods']}"
        )
    ratios = {
        k: (round(ext[k]["p50"] / floor[k]["p50"], 2) if floor[k]["p50"] else math.nan)
        for k in ("filter_ms", "prioritize_ms", "pair_ms", "bind_ms")
    }
    lines.append(
        "extender / floor, p50: "
        + ", ".join(f"{k[:-3]} {v:.2f}x" for k, v in ratios.items())
        + f"; pods/s {ext['pods_per_s'] or 0:.0f} vs {floor['pods_per_s'] or 0:.0f}"
    )
    lines.append(
        f"extender binds: {ext['bind_ok']} ok, {ext['bind_refused']} refused"
        + (f" (e.g. {ext['sample_errors'][0]})" if ext["bind_refused"] else "")
    )
    sv = report["serve"]
    if sv["peak_rss_mb"]:
        lines.append(f"serve memory: peak RSS (VmHWM) {sv['peak_rss_mb']:.0f} MB")
    lines.append("")
    lines.extend(_target_lines(report["targets"]))
    return "\n".join(lines) + "\n"


# -- report --------------------------------------------------------------------------------------


def _ratio(ext: dict[str, Any], floor: dict[str, Any], phase: str, q: str) -> float:
    a, b = ext[phase]["pair_ms"][q], floor[phase]["pair_ms"][q]
    return round(a / b, 2) if b else math.nan


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    ext, floor = report["extender"], report["floor"]
    rows = [
        (
            f"pair p99 @{ext['adaptive']['candidates']} candidates",
            ext["adaptive"]["pair_ms"]["p99"],
            "<=",
            TARGET_PAIR_P99_MS_ADAPTIVE,
            "ms",
        ),
        (
            f"pair p99 @{ext['all']['candidates']} candidates (all)",
            ext["all"]["pair_ms"]["p99"],
            "<=",
            TARGET_PAIR_P99_MS_ALL,
            "ms",
        ),
        (
            f"pods/s sequential @{ext['adaptive']['candidates']}",
            ext["adaptive"]["pods_per_s"],
            ">=",
            TARGET_PODS_PER_S,
            "pods/s",
        ),
        (
            f"pair p50 vs floor @{ext['adaptive']['candidates']}",
            _ratio(ext, floor, "adaptive", "p50"),
            "<=",
            TARGET_FLOOR_RATIO,
            "x",
        ),
        ("pair p50 vs floor @all", _ratio(ext, floor, "all", "p50"), "<=", TARGET_FLOOR_RATIO, "x"),
        ("peak RSS of serve", report["serve"]["peak_rss_mb"], "<=", TARGET_RSS_MB, "MB"),
    ]
    return _verdicts(rows)


def _verdicts(rows: list[tuple[str, Any, str, float, str]]) -> list[dict[str, Any]]:
    """Each target row (name, value, "<=" or ">=", limit, unit) with PASS or MISS."""
    out = []
    for name, value, op, limit, unit in rows:
        ok = value is not None and not (isinstance(value, float) and math.isnan(value))
        ok = ok and (value <= limit if op == "<=" else value >= limit)
        out.append(
            {
                "target": name,
                "value": value,
                "op": op,
                "limit": limit,
                "unit": unit,
                "result": "PASS" if ok else "MISS",
            }
        )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _pp(s: dict[str, float]) -> str:
    return f"{s['p50']:.2f}/{s['p99']:.2f} ms"


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["cluster"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']} ({m['platform']}); "
        f"1-minute load average {m['load_1m'][0]:.2f} before measuring, "
        f"{m['load_1m'][1]:.2f} after",
        _runtime_line(report["runtime"]),
        f"cluster: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs ({c['models']}), "
        f"{c['running_pods']} running pods ({c['whole_pods']} whole-GPU), "
        f"{c['threads_used_pct']:.1f}% of GPU threads in use; file {c['file_mb']:.1f} MB, "
        f"generated in {c['generate_s']:.1f}s; serve ready in {report['serve']['ready_s']:.1f}s, "
        f"idle {report['serve']['idle_after_s']:.1f}s later",
        f"servers alternate every {report['block']} pods; pods/s = pods / time inside "
        "filter+prioritize calls; cpu/pod = the server's own CPU time per pod",
        "",
        f"{'':28}{'filter p50/p99':>18}{'prioritize p50/p99':>22}{'pair p50/p99':>18}"
        f"{'pods/s':>9}{'cpu/pod':>10}{'placed':>8}",
    ]
    for who in ("extender", "floor"):
        for phase in ("adaptive", "all"):
            r = report[who][phase]
            label = f"{who} @{r['candidates']} candidates"
            lines.append(
                f"{label:28}{_pp(r['filter_ms']):>18}{_pp(r['prioritize_ms']):>22}"
                f"{_pp(r['pair_ms']):>18}{r['pods_per_s'] or 0:>9.0f}"
                f"{r['server_cpu_ms_per_pod'] or 0:>7.2f} ms"
                f"{r['placed']:>5}/{r['pods']}"
            )
    for who in ("extender", "floor"):
        r = report[who]["new_shapes"]
        lines.append(
            f"{who}, {r['pods']} pods of shapes never seen before @{r['candidates']} candidates: "
            f"filter p50/p99 {_pp(r['filter_ms'])}, pair p50/p99 {_pp(r['pair_ms'])} "
            "(no target: serve warms the shapes of pending pods ahead of the scheduler)"
        )
    for who in ("extender", "floor"):
        b = report[who]["bind"]
        lines.append(
            f"{who} bind x{b['binds']} ({b['concurrency']} in flight): p50 {b['p50_ms']:.2f} ms, "
            f"p99 {b['p99_ms']:.2f} ms, {b['binds_per_s'] or 0:.0f} binds/s, {b['ok']} ok, "
            f"{b['refused']} refused" + (f" (e.g. {b['sample_errors'][0]})" if b["refused"] else "")
        )
    if report["extender"]["bind"]["refused"]:
        lines.append(
            "  (refused binds are expected here: every pick was made before any bind, so picks of "
            "the same node collide once earlier binds fill it; kube-scheduler binds right after "
            "each cycle)"
        )
    sv = report["serve"]
    if sv["peak_rss_mb"]:
        lines.append(
            f"serve memory: peak RSS (VmHWM) {sv['peak_rss_mb']:.0f} MB, of which "
            f"{sv['peak_rss_at_ready_mb']:.0f} MB reached by the time /readyz said ready; "
            f"RSS at the end {sv['rss_at_end_mb']:.0f} MB"
        )
    else:
        lines.append("serve memory: unknown (no /proc)")
    lines.append("")
    lines.extend(_target_lines(report["targets"]))
    return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-extender", description=__doc__.splitlines()[0])
    p.add_argument(
        "--mode",
        choices=("realistic", "classic"),
        default="realistic",
        help="realistic (default): an empty cluster filled by distinct pods new to the "
        "extender, rotating windows, async binds; classic: the half-full cluster, warm shapes, "
        "random candidates and binds after all filters (issue #3's bench)",
    )
    p.add_argument("--nodes", type=int, default=5000, help="nodes of 8 GPUs (default 5000)")
    p.add_argument(
        "--running-pods",
        type=int,
        default=None,
        help="classic: pods already running (default 12 per node: 60,000 at 5,000 nodes)",
    )
    p.add_argument(
        "--pods",
        type=int,
        default=None,
        help="pods measured (default: realistic 3000; classic 2000, with the adaptive "
        "candidate count)",
    )
    p.add_argument(
        "--pods-all",
        type=int,
        default=None,
        help="classic: pods scheduled with every node as a candidate (default pods/4)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="candidate NodeNames per call (default: kube-scheduler's adaptive count, "
        "500 at 5,000 nodes)",
    )
    p.add_argument(
        "--block",
        type=int,
        default=50,
        help="pods per server before switching to the other (default 50; 1: pod by pod)",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--prefix", default="", help="URL path prefix of the extender's verbs")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for serve's /readyz (default 300)",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        type=Path,
        default=None,
        help="write the cluster file and logs here and keep them",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the report as JSON ('-' for stdout, replacing the text)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed")
    p.add_argument(
        "--profile-serve",
        metavar="PATH",
        type=Path,
        default=None,
        help="realistic: run serve under cProfile and write its profile here",
    )
    p.add_argument(
        "--serve-config",
        metavar="PATH",
        type=Path,
        default=None,
        help="realistic: serve's configuration file (default: none, the built-in defaults); "
        "e.g. another policy",
    )
    p.add_argument(
        "--serve-python",
        metavar="PATH",
        default=sys.executable,
        help="the interpreter that runs serve and the floor (default: this one); "
        "scripts/bench-extender passes .venv-fast's, the compiled build as the image ships",
    )
    p.add_argument(
        "--api",
        choices=("process", "embedded"),
        default="process",
        help="realistic: where the cluster lives. process (default): a Kubernetes API server "
        "in its own process (the project's fake), which serve watches and binds through as in "
        "production, and where the floor creates its Bindings too (a second one, so that both "
        "bind the same pods); embedded: serve's --cluster-file, the API server inside serve's "
        "process, and a floor whose bind only answers",
    )
    p.add_argument(
        "--floor-server", type=int, metavar="PORT", default=None, help=argparse.SUPPRESS
    )  # internal: run the floor server on PORT
    p.add_argument("--floor-api", default=None, help=argparse.SUPPRESS)  # internal: its API URL
    p.add_argument(
        "--api-server", type=int, metavar="PORT", default=None, help=argparse.SUPPRESS
    )  # internal: run an API server on PORT ...
    p.add_argument("--api-dump", type=Path, default=None, help=argparse.SUPPRESS)  # ... from this
    args = p.parse_args(argv)
    if os.sep in args.serve_python:
        # The servers run from the work directory: a relative path would not be found there.
        args.serve_python = os.path.abspath(args.serve_python)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.floor_server is not None:
        return serve_floor(args.floor_server, args.floor_api)
    if args.api_server is not None:
        return serve_api(args.api_server, args.api_dump)
    if args.pods is None:
        args.pods = 3000 if args.mode == "realistic" else 2000
    if args.mode == "realistic":
        return main_realistic(args)
    if args.nodes < 1 or args.pods < 1 or args.block < 1:
        print("bench-extender: --nodes, --pods and --block must be at least 1", file=sys.stderr)
        return 2
    running = args.running_pods if args.running_pods is not None else 12 * args.nodes
    pods_all = args.pods_all if args.pods_all is not None else max(1, args.pods // 4)
    candidates = min(args.nodes, args.candidates or adaptive_candidates(args.nodes))

    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            workdir = args.keep.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="mpsched-bench-"))
            )
        log = print if args.json != "-" else (lambda *a, **k: print(*a, **k, file=sys.stderr))

        log(f"generating {args.nodes} nodes, {running} running pods ...", flush=True)
        t0 = time.perf_counter()
        doc, stats = generate_cluster(args.nodes, running, args.seed)
        pods = pending_pods(args.pods + pods_all, args.seed + 7)
        pods_a, pods_b = pods[: args.pods], pods[args.pods :]
        # The pending pods are in the dump too: kube-scheduler only schedules pods the API
        # server holds, and a bind of a pod the cluster does not know is refused (404).
        doc["items"].extend(pods)
        cluster_file = workdir / "cluster.json"
        cluster_file.write_bytes(orjson.dumps(doc))
        file_mb = cluster_file.stat().st_size / 1e6
        del doc
        generate_s = time.perf_counter() - t0
        node_names = [f"node-{i:05d}" for i in range(args.nodes)]

        try:
            serve_runtime = runtime(args.serve_python, workdir)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"bench-extender: --serve-python: {exc}", file=sys.stderr)
            return 2
        serve_port, floor_port = free_port(), free_port()
        serve_argv = [
            args.serve_python,
            "-m",
            "extender",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(serve_port),
            "--cluster-file",
            str(cluster_file),
            "--metrics-port",
            "0",  # /status on the verbs' port; nothing fixed to collide with
        ]
        floor_argv = [args.serve_python, __file__, "--floor-server", str(floor_port)]
        log(f"starting mpsched serve on 127.0.0.1:{serve_port} ...", flush=True)
        t0 = time.perf_counter()
        try:
            serve = stack.enter_context(
                started("serve", serve_argv, serve_port, workdir, args.ready_timeout)
            )
        except RuntimeError as exc:
            print(f"bench-extender: {exc}", file=sys.stderr)
            return 1
        ready_s = time.perf_counter() - t0
        rss_ready = rss_mb(serve.proc.pid)
        log("waiting for serve to go idle ...", flush=True)
        settle_s = wait_idle(serve.proc.pid, args.ready_timeout)
        floor = stack.enter_context(started("floor", floor_argv, floor_port, workdir, 30))

        log(f"measuring the extender and the floor ({args.pods} + {pods_all} pods) ...", flush=True)
        # Other work on the machine moves every figure: say how busy it was.
        load_before = os.getloadavg()[0]
        targets_ = [
            Target("extender", serve.port, args.prefix, serve.proc.pid),
            Target("floor", floor.port, pid=floor.proc.pid),
        ]
        try:
            measured = measure(
                targets_,
                node_names,
                pods_a,
                pods_b,
                candidates,
                args.seed,
                block=args.block,
                new_shapes=new_shape_pods(NEW_SHAPES, args.seed + 11),
            )
        except (RuntimeError, OSError) as exc:
            print(f"bench-extender: {exc}\n{serve.tail()}", file=sys.stderr)
            return 1
        load_after = os.getloadavg()[0]
        rss = rss_mb(serve.proc.pid)
        rss_now = rss_mb(serve.proc.pid, "VmRSS")

    report: dict[str, Any] = {
        "machine": machine() | {"load_1m": [round(load_before, 2), round(load_after, 2)]},
        "runtime": serve_runtime,
        "block": args.block,
        "cluster": {
            "nodes": stats.nodes,
            "gpus": stats.gpus,
            "running_pods": stats.running_pods,
            "whole_pods": stats.whole_pods,
            "threads_used_pct": round(stats.threads_used_pct, 1),
            "models": stats.models,
            "file_mb": round(file_mb, 1),
            "generate_s": round(generate_s, 1),
        },
        "serve": {
            "ready_s": round(ready_s, 1),
            "idle_after_s": round(settle_s, 1),
            "peak_rss_mb": _round(rss),
            "peak_rss_at_ready_mb": _round(rss_ready),
            "rss_at_end_mb": _round(rss_now),
        },
        "extender": measured["extender"],
        "floor": measured["floor"],
    }
    report["targets"] = targets(report)
    text = render(report)
    if args.json == "-":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(text)
        if args.json:
            Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    missed = any(t["result"] == "MISS" for t in report["targets"])
    return 1 if args.strict and missed else 0


def _serve_argv(
    python: str,
    port: int,
    cluster_file: Path,
    profile: Path | None = None,
    config: Path | None = None,
    *,
    kubeconfig: str | None = None,
) -> list[str]:
    # cProfile writes its file when serve exits (SIGTERM: a clean exit) at the end of the run.
    wrap = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    configured = ["--config", str(config)] if config is not None else []
    cluster = (
        ["--kubeconfig", kubeconfig]
        if kubeconfig is not None
        else ["--cluster-file", str(cluster_file)]
    )
    return [
        python,
        *wrap,
        "-m",
        "extender",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *cluster,
        "--metrics-port",
        "0",  # /status on the verbs' port; nothing fixed to collide with
        *configured,
    ]


#: The resourceVersion of the pending pods in the dump; the scheduler's copies carry newer ones.
DUMP_POD_VERSION = "7"


def main_realistic(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.pods < 1 or args.block < 1:
        print("bench-extender: --nodes, --pods and --block must be at least 1", file=sys.stderr)
        return 2
    candidates = min(args.nodes, args.candidates or adaptive_candidates(args.nodes))
    log = print if args.json != "-" else (lambda *a, **k: print(*a, **k, file=sys.stderr))
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            workdir = args.keep.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="mpsched-bench-"))
            )
        log(f"generating {args.nodes} empty nodes and {args.pods} pending pods ...", flush=True)
        doc, _ = generate_cluster(args.nodes, 0, args.seed)
        nodes = [i for i in doc["items"] if i["kind"] == "Node"]
        warmup = realistic_pods(REAL_WARMUP, args.seed + 5, first_serial=400_000)
        pods = realistic_pods(args.pods, args.seed + 7)
        # The API server knows every pending pod (bind reads it from the watch, as in
        # production), but the scheduler's copy in each filter body is a newer version of it
        # (the scheduler's own status update, say): its parse is never cached, so every pod is
        # new to the extender when its first filter arrives, as a pod just created is.
        for k, pod in enumerate([*warmup, *pods]):
            dumped = orjson.loads(orjson.dumps(pod))
            dumped["metadata"]["resourceVersion"] = DUMP_POD_VERSION
            doc["items"].append(dumped)
            pod["metadata"]["resourceVersion"] = str(1_000_000 + k)
        pod_kb = sum(len(orjson.dumps(p)) for p in pods) / len(pods) / 1000
        cluster_file = workdir / "cluster.json"
        cluster_file.write_bytes(orjson.dumps(doc))
        del doc
        try:
            serve_runtime = runtime(args.serve_python, workdir)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"bench-extender: --serve-python: {exc}", file=sys.stderr)
            return 2
        serve_port, floor_port = free_port(), free_port()
        floor_argv = [args.serve_python, __file__, "--floor-server", str(floor_port)]
        kubeconfig = None
        if args.api == "process":
            log("starting an API server for each of serve and the floor ...", flush=True)
            api_argv = [args.serve_python, __file__, "--api-server"]
            try:
                apis = [
                    stack.enter_context(
                        started(
                            f"apiserver-{who}",
                            [*api_argv, str(port), "--api-dump", str(cluster_file)],
                            port,
                            workdir,
                            args.ready_timeout,
                        )
                    )
                    for who, port in (("serve", free_port()), ("floor", free_port()))
                ]
            except RuntimeError as exc:
                print(f"bench-extender: {exc}", file=sys.stderr)
                return 1
            kubeconfig = _fake_apiserver().kubeconfig(workdir, f"http://127.0.0.1:{apis[0].port}")
            floor_argv += ["--floor-api", f"http://127.0.0.1:{apis[1].port}"]
        log(f"starting mpsched serve on 127.0.0.1:{serve_port} ...", flush=True)
        try:
            serve = stack.enter_context(
                started(
                    "serve",
                    _serve_argv(
                        args.serve_python,
                        serve_port,
                        cluster_file,
                        args.profile_serve.resolve() if args.profile_serve else None,
                        args.serve_config.resolve() if args.serve_config else None,
                        kubeconfig=kubeconfig,
                    ),
                    serve_port,
                    workdir,
                    args.ready_timeout,
                )
            )
        except RuntimeError as exc:
            print(f"bench-extender: {exc}", file=sys.stderr)
            return 1
        wait_idle(serve.proc.pid, args.ready_timeout)
        floor = stack.enter_context(started("floor", floor_argv, floor_port, workdir, 30))
        log(f"measuring the extender and the floor ({args.pods} pods each) ...", flush=True)
        load_before = os.getloadavg()[0]
        targets_ = [
            Target("extender", serve.port, args.prefix, serve.proc.pid),
            Target("floor", floor.port, pid=floor.proc.pid),
        ]
        try:
            measured = measure_realistic(
                targets_, nodes, warmup, pods, candidates, args.seed, block=args.block
            )
        except (RuntimeError, OSError) as exc:
            print(f"bench-extender: {exc}\n{serve.tail()}", file=sys.stderr)
            return 1
        load_after = os.getloadavg()[0]
        rss = rss_mb(serve.proc.pid)
    report: dict[str, Any] = {
        "mode": "realistic",
        "api": args.api,
        "machine": machine() | {"load_1m": [round(load_before, 2), round(load_after, 2)]},
        "runtime": serve_runtime,
        "block": args.block,
        "cluster": {
            "nodes": args.nodes,
            "pods": args.pods,
            "pod_kb": round(pod_kb, 2),
            "candidates": candidates,
        },
        "serve": {"peak_rss_mb": _round(rss)},
        "extender": measured["extender"],
        "floor": measured["floor"],
    }
    report["targets"] = realistic_targets(report)
    if args.json == "-":
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_realistic(report))
        if args.json:
            Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    missed = any(t["result"] == "MISS" for t in report["targets"])
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
