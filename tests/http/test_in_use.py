"""One definition of "in use" (`packing.in_use`): on the same ledger, `/status` and `/metrics`
give the same figures, per GPU and for the cluster, and a GPU given out whole is fully in use."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson

from extender.cluster.embedded import EmbeddedCluster
from extender.commands.status_table import format_status
from extender.config import load_config_text
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.packing.codec import ALLOCATION_KEY
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod

Json = dict[str, Any]


def _running(name: str, node: str, kind: str, threads: int) -> Json:
    alloc = {
        "v": 1, "node": node, "kind": kind, "gpus": [{"index": 0, "uuid": f"GPU-{node}-0"}],
        "threads": threads, "memoryMiB": 0, "clients": 1 if kind == "share" else 0,
        "containers": [], "uid": 1000,
    }  # fmt: skip
    return pod(
        name,
        threads=threads or None,
        gpus=1 if kind == "whole" else None,
        node=node,
        phase="Running",
        annotations={ALLOCATION_KEY: json.dumps(alloc)},
    )


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    head = f"{name}{{{want}}} " if labels else f"{name} "
    [line] = [x for x in text.splitlines() if x.startswith(head)]
    return float(line.rsplit(" ", 1)[1])


async def test_status_and_metrics_agree_on_what_is_in_use(aiohttp_client: Any) -> None:
    objects = [
        gpu_node("a", gpus=2),
        gpu_node("b", gpus=1),
        _running("s60", "a", "share", 60),
        _running("s100", "a", "share", 100),
        _running("w", "b", "whole", 0),
    ]
    config = load_config_text("budgets: {oversubscription: 2.0}\n")
    service = ExtenderService(cluster=EmbeddedCluster.from_objects(objects), config=config)
    client = await aiohttp_client(make_app(service, HttpSettings()))
    await asyncio.wait_for(service.wait_ready(), 10)
    status = orjson.loads(await (await client.get("/status")).read())
    text = (await (await client.get("/metrics")).read()).decode()

    # 160 % of threads at x2.0 is 0.8 of GPU a/0; a/1 idle; b/0 given out whole: 1.8 of 3.
    per_gpu = {(n["name"], g["index"]): g["inUsePct"] for n in status["nodes"] for g in n["gpus"]}
    assert per_gpu == {("a", 0): 80.0, ("a", 1): 0.0, ("b", 0): 100.0}
    summary = status["summary"]
    assert summary["threadsUsedPct"] == 60.0 and summary["threadsUsedGpus"] == 1.8

    # Before: used 1.6 GPUs (the whole GPU counted 0) of 6 (capacity x2.0): 26.7 %, not 60 %.
    used = _metric(text, "mpsched_cluster_threads_used_gpus")
    capacity = _metric(text, "mpsched_cluster_threads_capacity_gpus")
    assert used == summary["threadsUsedGpus"] and capacity == summary["gpus"] == 3
    assert round(100 * used / capacity, 3) == summary["threadsUsedPct"]
    for (node, index), pct in per_gpu.items():
        ratio = _metric(text, "mpsched_gpu_in_use_ratio", node=node, gpu=str(index))
        assert round(100 * ratio, 3) == pct
    # `mpsched status` prints the same cluster figure.
    assert "threads used 60.0%" in format_status(status)


def test_the_dashboard_plots_the_same_in_use_figures() -> None:
    """Before: the per-GPU panel divided the raw thread share by the capacity ratio, so a GPU
    given out whole showed 0 in use."""
    root = Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "deploy" / "monitoring" / "dashboard.json").read_text())
    panels = {p["title"]: p for p in dashboard["panels"] if p.get("targets")}
    per_gpu = [t["expr"] for t in panels["Per GPU: SMs in use"]["targets"]]
    assert len(per_gpu) == 1 and per_gpu[0].startswith("mpsched_gpu_in_use_ratio{")
    cluster = [t["expr"] for t in panels["Cluster: GPUs in use against GPUs"]["targets"]]
    assert [e.split("(", 1)[1].split("{", 1)[0] for e in cluster] == [
        "mpsched_cluster_threads_used_gpus",
        "mpsched_cluster_threads_capacity_gpus",
    ]
    every = [t["expr"] for p in panels.values() for t in p["targets"]]
    assert not [e for e in every if "mpsched_gpu_threads_used_ratio" in e and "/" in e]
