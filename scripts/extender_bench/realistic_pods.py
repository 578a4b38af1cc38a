"""The realistic mode's pending pods: distinct, of production size and variety (~3.3 KB: a
ReplicaSet owner, one or two containers, env, volumes, tolerations, sometimes a nodeSelector),
their asks mixing threads and memory, units, whole GPUs and two clients."""

from __future__ import annotations

import random
from typing import Any

from extender_bench.catalog import USERS, ZONES, weighted_pick
from extender_bench.pods import make_pod

Json = dict[str, Any]


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


def realistic_ask(rng: random.Random) -> dict[str, str]:
    kind = weighted_pick(rng, REAL_ASKS)
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
            run_as_user=weighted_pick(rng, USERS),
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
