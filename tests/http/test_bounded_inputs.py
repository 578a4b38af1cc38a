"""Numbers read from the cluster outside their documented range: the record is refused and
reported, `/status` stays one whole JSON document and `/metrics` shows nothing absurd."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import orjson
import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.packing.codec import ALLOCATION_KEY, INVENTORY_KEY
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod

Json = dict[str, Any]
HUGE = 18446744073709551616  # 2**64


def _allocation(node: str, threads: int) -> str:
    return json.dumps(
        {
            "v": 1,
            "node": node,
            "kind": "share",
            "gpus": [{"index": 0, "uuid": f"GPU-{node}-0"}],
            "threads": threads,
            "memoryMiB": 0,
            "clients": 1,
            "containers": [{"name": "main", "threads": 30, "memoryMiB": 0, "clients": 1}],
            "uid": 1000,
        }
    )


def _objects() -> list[Json]:
    huge = gpu_node("huge", gpus=1)
    inventory = json.loads(huge["metadata"]["annotations"][INVENTORY_KEY])
    inventory[0]["memoryMiB"] = HUGE
    huge["metadata"]["annotations"][INVENTORY_KEY] = json.dumps(inventory)
    return [
        gpu_node("good", gpus=1),
        huge,
        pod("runs", threads=30, node="good", phase="Running",
            annotations={ALLOCATION_KEY: _allocation("good", 30)}),
        pod("absurd", threads=30, node="good", phase="Running",
            annotations={ALLOCATION_KEY: _allocation("good", 10**30)}),
    ]  # fmt: skip


async def test_out_of_range_numbers_are_refused_and_reported(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cluster = EmbeddedCluster.from_objects(_objects())
    service = ExtenderService(cluster=cluster, config=Config.default())
    client = await aiohttp_client(make_app(service, HttpSettings()))
    await asyncio.wait_for(service.wait_ready(), 10)

    resp = await client.get("/status")
    assert resp.status == 200
    doc = orjson.loads(await resp.read())  # before: the body stopped at {"nodes":[
    assert [n["name"] for n in doc["nodes"]] == ["good"]
    [refused] = doc["summary"]["refusedNodes"]
    assert refused["name"] == "huge"
    assert "memoryMiB" in refused["reason"] and "4194304" in refused["reason"]
    # The readable allocation counts; the absurd one is refused and reported, not counted.
    [gpu] = doc["nodes"][0]["gpus"]
    assert [p["name"] for p in gpu["pods"]] == ["runs"]
    assert gpu["threads"]["used"] == 30

    text = (await (await client.get("/metrics")).read()).decode()
    capacities = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mpsched_gpu_pinned_memory_capacity_bytes{")
    ]
    assert capacities and max(capacities) < 2**42  # before: 1.2e27 bytes
    assert 'mpsched_notices_total{kind="inventory_refused"} 1.0' in text
    assert 'mpsched_notices_total{kind="allocation_unreadable"} 1.0' in text
    await asyncio.sleep(0.1)  # Events are sent by a task of their own
    [event] = [e for e in cluster.recorded_events if e["involvedObject"]["kind"] == "Node"]
    assert event["involvedObject"]["name"] == "huge" and event["reason"] == "GpuInventoryRefused"
    assert event["type"] == "Warning" and event["source"] == {"component": "mpsched"}
    said = caplog.text
    assert "node huge takes no GPU pods" in said and "memoryMiB" in said
    assert "default/absurd" in said and "threads" in said


async def test_device_plugin_pods_asking_absurd_counts_do_not_break_status(
    aiohttp_client: Any,
) -> None:
    """Before: three bound pods asking nvidia.com/gpu 9E18 summed past 2**64 on their node, and
    /status stopped mid-stream (orjson: Integer exceeds 64-bit range)."""
    hogs = []
    for i in range(3):
        hog = pod(f"hog{i}", node="good", phase="Running")
        hog["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9E18"
        hogs.append(hog)
    cluster = EmbeddedCluster.from_objects([gpu_node("good", gpus=2), *hogs])
    service = ExtenderService(cluster=cluster, config=Config.default())
    client = await aiohttp_client(make_app(service, HttpSettings()))
    await asyncio.wait_for(service.wait_ready(), 10)
    doc = orjson.loads(await (await client.get("/status")).read())
    [node] = doc["nodes"]
    assert node["heldByDevicePlugin"] == 3 * 64  # each holds all of its node's GPUs
