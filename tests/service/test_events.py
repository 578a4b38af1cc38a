"""Events about pods go through one bounded queue and one sender: an API server slow to take
them holds one connection for Events, never one per bind, and what does not fit is dropped
and counted (mpsched_events_dropped_total), as client-go's broadcaster does."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, cast

import pytest

from extender.cluster import Cluster, Unavailable
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.metrics import Metrics
from extender.service import ExtenderService
from extender.service.events import EventSink, PodEvent
from tests.http.kube_objects import gpu_node, pod


class SlowEvents:
    """An API server that takes each Event only when the test lets it (`gate`), and counts how
    many are in flight at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.recorded: list[str] = []
        self.fail_first = 0

    async def record_event(self, **event: Any) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if self.fail_first:
                self.fail_first -= 1
                raise Unavailable("no answer")
            self.recorded.append(event["name"])
        finally:
            self.in_flight -= 1


def _with_allocation_events() -> Config:
    """The default configuration with a GpuShareAllocated Event per fresh allocation."""
    config = Config.default()
    return dataclasses.replace(config, api=dataclasses.replace(config.api, allocation_events=True))


def _event(name: str) -> PodEvent:
    return PodEvent("default", name, f"uid-{name}", "GpuShareAllocated", "GPU 0 on a")


async def _until(check: Any, limit: int = 200) -> None:
    for _ in range(limit):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_events_go_one_at_a_time_in_order() -> None:
    api = SlowEvents()
    sink = EventSink(cast(Cluster, api))
    sender = asyncio.create_task(sink.run())
    try:
        for k in range(50):
            sink.record(_event(f"p{k}"))
        await _until(lambda: api.in_flight == 1)
        assert len(sink) == 49 and api.most_in_flight == 1
        api.gate.set()
        await _until(lambda: len(api.recorded) == 50)
        assert api.recorded == [f"p{k}" for k in range(50)]
        assert api.most_in_flight == 1 and sink.sent == 50 and sink.dropped == 0
    finally:
        sender.cancel()


async def test_a_full_queue_drops_new_events_and_counts_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = SlowEvents()
    sink = EventSink(cast(Cluster, api), capacity=10)
    for k in range(25):
        sink.record(_event(f"p{k}"))
    assert len(sink) == 10 and sink.dropped == 15
    # Logged at the first drop and then once per `capacity` drops, not once per Event.
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 2
    api.gate.set()
    await sink.flush(timeout_s=5)
    assert api.recorded == [f"p{k}" for k in range(10)]  # the oldest were kept


async def test_a_lost_event_does_not_stop_the_sender() -> None:
    api = SlowEvents()
    api.fail_first = 1
    api.gate.set()
    sink = EventSink(cast(Cluster, api))
    sender = asyncio.create_task(sink.run())
    try:
        sink.record(_event("lost"))
        sink.record(_event("kept"))
        await _until(lambda: api.recorded == ["kept"])
        assert not sender.done()
    finally:
        sender.cancel()


async def test_flush_is_bounded_when_the_api_server_takes_nothing() -> None:
    api = SlowEvents()  # the gate never opens
    sink = EventSink(cast(Cluster, api))
    sink.record(_event("p0"))
    sink.record(_event("p1"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sink.flush(timeout_s=0.05)
    assert loop.time() - started < 1.0
    assert api.recorded == [] and len(sink) == 1


class _SlowEmbedded(EmbeddedCluster):
    """The embedded cluster whose Events wait for `gate` (after `arm`)."""

    def arm(self) -> None:
        self.gate = asyncio.Event()
        self.events_in_flight = 0
        self.most_events_in_flight = 0

    async def record_event(self, **event: Any) -> None:
        self.events_in_flight += 1
        self.most_events_in_flight = max(self.most_events_in_flight, self.events_in_flight)
        try:
            await self.gate.wait()
            await super().record_event(**event)
        finally:
            self.events_in_flight -= 1


async def test_binds_do_not_wait_for_events_an_api_server_is_slow_to_take() -> None:
    """The defect: each bind's GpuShareAllocated Event was a task of its own, so an API server
    slow to take Events held one request (and one connection of the writes client, which
    Bindings share) per bind. Now one Event is in flight at most, the binds finish meanwhile,
    and every Event is recorded once the API server takes them."""
    pods = [pod(f"p{k}", threads=10) for k in range(12)]
    cluster = _SlowEmbedded.from_objects([gpu_node("a", gpus=2), *pods])
    assert isinstance(cluster, _SlowEmbedded)
    cluster.arm()
    service = ExtenderService(cluster=cluster, config=_with_allocation_events())
    await service.start()
    try:
        binds = [
            service.bind(name=f"p{k}", namespace="default", uid=f"uid-default-p{k}", node="a")
            for k in range(12)
        ]
        done = await asyncio.wait_for(asyncio.gather(*binds), timeout=5)
        assert all(alloc is not None for alloc in done)
        await _until(lambda: cluster.events_in_flight == 1)
        assert cluster.most_events_in_flight == 1 and len(service.events) == 11
        cluster.gate.set()
        await _until(lambda: len(service.events) == 0 and cluster.events_in_flight == 0)
        names = {e["involvedObject"]["name"] for e in cluster.recorded_events}
        assert names == {f"p{k}" for k in range(12)}
    finally:
        await service.close()


async def test_close_records_what_is_still_queued() -> None:
    cluster = EmbeddedCluster.from_objects([gpu_node("a", gpus=1), pod("p0", threads=10)])
    service = ExtenderService(cluster=cluster, config=_with_allocation_events())
    await service.start()
    alloc = await service.bind(name="p0", namespace="default", uid="uid-default-p0", node="a")
    assert alloc is not None
    # The sender has not run yet (no await since the bind returned): close sends it.
    await service.close()
    assert [e["reason"] for e in cluster.recorded_events] == ["GpuShareAllocated"]


def test_dropped_events_are_exported() -> None:
    from extender.metrics import LedgerSample

    text = Metrics().render(LedgerSample(events_dropped=7)).decode()
    assert "mpsched_events_dropped_total 7.0" in text
