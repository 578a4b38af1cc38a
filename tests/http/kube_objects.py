"""Small Node and Pod objects in the Kubernetes API's JSON form, for the service and HTTP tests."""

from __future__ import annotations

import json
from typing import Any

from extender.packing.codec import INVENTORY_KEY

Json = dict[str, Any]


def gpu_node(
    name: str,
    *,
    gpus: int = 2,
    memory_mib: int = 40960,
    cc: str = "8.0",
    model: str = "A100",
    units: int = 4,
    cpu: str | None = "64",
    labels: dict[str, str] | None = None,
) -> Json:
    """A Node whose agent published `gpus` identical GPUs in the mpsched.io/gpus annotation."""
    inventory = [
        {
            "index": i,
            "uuid": f"GPU-{name}-{i}",
            "model": model,
            "memoryMiB": memory_mib,
            "computeCapability": cc,
            "units": units,
            "mps": "ready",
        }
        for i in range(gpus)
    ]
    node: Json = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": {INVENTORY_KEY: json.dumps(inventory)},
        },
        "spec": {},
        "status": {},
    }
    if cpu is not None:
        node["status"]["allocatable"] = {"cpu": cpu, "memory": "512Gi"}
    return node


def plain_node(name: str) -> Json:
    """A Node without GPUs."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {}}


def pod(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    threads: int | None = None,
    memory: str | None = None,
    units: int | None = None,
    gpus: int | None = None,
    clients: int | None = None,
    cpu: str = "1",
    priority: int | None = None,
    user: int | None = 1000,
    node: str | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
) -> Json:
    """A Pod with one container asking for the given mpsched.io resources."""
    limits: dict[str, str] = {"cpu": cpu}
    for key, value in (
        ("threads", threads),
        ("memory", memory),
        ("units", units),
        ("gpus", gpus),
        ("clients", clients),
    ):
        if value is not None:
            limits[f"mpsched.io/{key}"] = str(value)
    spec: Json = {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
    }
    if user is not None:
        spec["securityContext"] = {"runAsUser": user}
    if priority is not None:
        spec["priority"] = priority
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }
