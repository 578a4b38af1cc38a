"""kube-scheduler's filter→prioritize cycle as the service sees it (`SchedulingCycle`): a wait
that returns at once with no cycle open, when the cycle ends, or once it has held background
work for its bound, whichever comes first; and Events recorded and watch changes arriving
meanwhile wait for it."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

import extender.service.cycle as cycle_module
from extender.cluster import Cluster
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.service import ExtenderService
from extender.service.cycle import SchedulingCycle
from extender.service.events import EventSink
from tests.http.kube_objects import gpu_node, pod
from tests.service.test_events import SlowEvents, _event, _until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_no_cycle_open_holds_nothing() -> None:
    cycle = SchedulingCycle()
    assert not cycle.open
    async with asyncio.timeout(0.5):
        await cycle.wait_closed()


async def test_the_wait_ends_with_the_cycle() -> None:
    cycle = SchedulingCycle(max_hold_s=30.0)
    cycle.begin()
    assert cycle.open
    waiter = asyncio.create_task(cycle.wait_closed())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    cycle.end()
    async with asyncio.timeout(0.5):
        await waiter
    assert not cycle.open


async def test_a_cycle_holds_no_longer_than_its_bound() -> None:
    # A prioritize that never comes (another extender's answer, a scheduler restart): the
    # wait gives up after max_hold_s, and the stale cycle holds nothing more.
    cycle = SchedulingCycle(max_hold_s=0.05)
    cycle.begin()
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(1.0):
        await cycle.wait_closed()
    assert 0.04 <= asyncio.get_running_loop().time() - started < 0.5
    assert not cycle.open
    async with asyncio.timeout(0.01):
        await cycle.wait_closed()


def test_open_follows_the_clock() -> None:
    clock = Clock()
    cycle = SchedulingCycle(max_hold_s=0.005, clock=clock)
    cycle.begin()
    clock.now += 0.004
    assert cycle.open
    clock.now += 0.002
    assert not cycle.open
    cycle.begin()  # the next pod's filter opens a new one
    assert cycle.open


async def test_events_wait_while_a_cycle_is_open() -> None:
    api = SlowEvents()
    api.gate.set()
    cycle = SchedulingCycle(max_hold_s=30.0)
    sink = EventSink(cast(Cluster, api), cycle=cycle)
    sender = asyncio.create_task(sink.run())
    try:
        cycle.begin()
        sink.record(_event("a"))
        sink.record(_event("b"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert api.recorded == []
        cycle.end()
        await _until(lambda: api.recorded == ["a", "b"])
        # With no cycle open an Event goes out at once.
        sink.record(_event("c"))
        await _until(lambda: api.recorded == ["a", "b", "c"])
    finally:
        sender.cancel()


async def test_watch_changes_wait_while_a_cycle_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cycle_module, "MAX_HOLD_S", 60.0)
    cluster = EmbeddedCluster.from_objects([gpu_node("node-a", gpus=2)])
    service = ExtenderService(cluster=cluster, config=Config.default())
    await service.start()
    try:
        service.cycle.begin()
        cluster.apply(pod("late", threads=20))
        for _ in range(50):
            await asyncio.sleep(0)
        assert "uid-default-late" not in service.state.pods
        service.cycle.end()
        await _until(lambda: "uid-default-late" in service.state.pods)
    finally:
        await service.close()
        await cluster.close()
