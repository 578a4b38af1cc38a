"""The service over the real Kubernetes adapter, against the fake API server: the ledger is
built from a list, a bind writes the allocation through the Binding and is confirmed by the
watch, a deleted pod gives its share back, and a standby replica refuses to schedule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.kube.api import KubeCluster
from extender.packing.codec import ALLOCATION_KEY, decode_allocation
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod
from tests.kube.fake_apiserver import FakeApiServer, serving


class Switch:
    """A Leadership the test decides (the Lease campaign itself is tested in test_lease)."""

    leader = True

    def is_leader(self) -> bool:
        return self.leader

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def release(self) -> None:
        return None


switch = Switch()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, ExtenderService]]:
    switch.leader = True
    fake = FakeApiServer()
    fake.put(gpu_node("gpu-a", gpus=1))
    fake.put(pod("first", uid="uid-first", threads=60))
    fake.put(pod("second", uid="uid-second", threads=60))
    async with serving(fake, tmp_path) as served:
        cluster = await KubeCluster.connect(kubeconfig=served.kubeconfig, context=None)
        svc = ExtenderService(
            cluster=cluster, config=Config.default(), leadership=switch, warm_budget_s=0
        )
        await svc.start()
        yield fake, svc
        await svc.close()
        await cluster.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll for another task's side effect (the watch), for at most 5 s."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


async def test_bind_through_the_api_is_confirmed_and_released(
    service: tuple[FakeApiServer, ExtenderService],
) -> None:
    fake, svc = service
    first = fake.pods[("default", "first")]
    assert svc.filter(first, ["gpu-a"]).passed == ["gpu-a"]
    alloc = await svc.bind(name="first", namespace="default", uid="uid-first", node="gpu-a")
    assert alloc is not None
    bound = fake.pods[("default", "first")]
    assert bound["spec"]["nodeName"] == "gpu-a"
    record = decode_allocation(
        bound["metadata"]["annotations"][ALLOCATION_KEY],
        pod_uid="uid-first",
        namespace="default",
        name="first",
    )
    assert record.threads == 60
    await until(lambda: svc.state.ledger.state("uid-first") == "confirmed", "watch confirms")
    # 60 % + 60 % does not fit one GPU: the second pod is refused until the first goes.
    outcome = svc.filter(fake.pods[("default", "second")], ["gpu-a"])
    assert outcome.passed == []
    assert "threads" in outcome.failed["gpu-a"]
    fake.delete_pod("default", "first")
    await until(lambda: svc.state.ledger.allocation("uid-first") is None, "watch releases")
    assert svc.filter(fake.pods[("default", "second")], ["gpu-a"]).passed == ["gpu-a"]


async def test_a_standby_replica_is_not_ready_and_schedules_nothing(
    service: tuple[FakeApiServer, ExtenderService],
) -> None:
    fake, svc = service
    switch.leader = False
    async with TestClient(TestServer(make_app(svc, HttpSettings()))) as client:
        ready = await client.get("/readyz")
        assert ready.status == 503
        assert "leader" in await ready.text()
        args = {"Pod": fake.pods[("default", "first")], "Nodes": None, "NodeNames": ["gpu-a"]}
        reply = await (await client.post("/filter", json=args)).json()
        assert "leader" in reply["Error"]
        bind = {
            "PodName": "first",
            "PodNamespace": "default",
            "PodUID": "uid-first",
            "Node": "gpu-a",
        }
        assert "leader" in (await (await client.post("/bind", json=bind)).json())["Error"]
        assert "nodeName" not in fake.pods[("default", "first")]["spec"]
        switch.leader = True
        assert (await client.get("/readyz")).status == 200


async def test_a_bind_whose_answer_is_lost_keeps_its_reservation(
    service: tuple[FakeApiServer, ExtenderService],
) -> None:
    # The API server applied the Binding but the connection broke before it answered: the pod
    # is bound, so giving its share back would let the GPU be handed out twice.
    fake, svc = service
    svc.filter(fake.pods[("default", "first")], ["gpu-a"])
    fake.lose_next_bind_answer = True
    alloc = await svc.bind(name="first", namespace="default", uid="uid-first", node="gpu-a")
    assert alloc is not None
    assert fake.pods[("default", "first")]["spec"]["nodeName"] == "gpu-a"
    assert svc.state.ledger.allocation("uid-first") == alloc
    assert svc.filter(fake.pods[("default", "second")], ["gpu-a"]).passed == []
