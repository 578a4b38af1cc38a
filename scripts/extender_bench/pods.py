"""Pod documents: `make_pod`, a Deployment-style pod with the bulk of a real one (running on a
node, or pending), and the classic mode's pending pods: the usual mix of asks, and pods of shapes
no pod in the cluster has."""

from __future__ import annotations

import random
from typing import Any

from extender_bench.catalog import (
    APPS,
    IMAGES,
    NAMESPACES,
    USERS,
    GpuModel,
    random_uid,
    weighted_pick,
)

Json = dict[str, Any]


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
            "uid": random_uid(rng),
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
                    "uid": random_uid(rng),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "creationTimestamp": "2026-11-30T06:00:00Z",
        },
        "spec": spec,
        "status": status,
    }


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
        ask = weighted_pick(rng, asks)
        pod = make_pod(
            rng,
            serial=first_serial + k,
            gpu_ask=dict(ask),
            model=None,
            run_as_user=weighted_pick(rng, USERS),
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
            run_as_user=weighted_pick(rng, USERS),
        )
        for k, t in enumerate(threads)
    ]
