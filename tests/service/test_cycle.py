"""The registry of scheduling cycles (`CycleRegistry`) as background work sees it: a wait that
returns at once when no prioritize call is expected, when it comes (or the pod's bind, or the
next filter), or once it has held background work for its bound, whichever comes first; and
Events recorded and watch changes arriving meanwhile wait for it. Also its bound on the cycles
it keeps."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

import extender.service.cycle as cycle_module
from extender.cluster import Cluster
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.state import DecisionState
from extender.service import ExtenderService
from extender.service.cycle import Cycle, CycleRegistry
from extender.service.events import EventSink
from tests.http.kube_objects import gpu_node, pod
from tests.service.test_events import SlowEvents, _event, _until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _cycle(uid: str, passed: int = 2) -> Cycle:
    names = [f"n{i}" for i in range(passed)]
    return Cycle((uid, "1"), cast(DecisionState, None), 0, names, [1.0] * passed)


async def test_no_cycle_holds_nothing() -> None:
    cycles = CycleRegistry()
    assert not cycles.holding
    async with asyncio.timeout(0.5):
        await cycles.wait_released()


async def test_the_wait_ends_with_the_prioritize() -> None:
    cycles = CycleRegistry(max_hold_s=30.0)
    cycle = _cycle("a")
    cycles.filtered(cycle)
    assert cycles.holding
    waiter = asyncio.create_task(cycles.wait_released())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    cycles.prioritized(cycle)
    async with asyncio.timeout(0.5):
        await waiter
    assert not cycles.holding
    assert cycles.held == 1


async def test_the_wait_ends_with_the_pods_bind() -> None:
    cycles = CycleRegistry(max_hold_s=30.0)
    cycles.filtered(_cycle("a"))
    waiter = asyncio.create_task(cycles.wait_released())
    await asyncio.sleep(0.01)
    cycles.end("a")
    async with asyncio.timeout(0.5):
        await waiter
    assert cycles.find("a") is None


async def test_a_cycle_holds_no_longer_than_its_bound() -> None:
    # A prioritize that never comes (another extender's answer, a scheduler restart): the
    # wait gives up after max_hold_s, and the stale cycle holds nothing more.
    cycles = CycleRegistry(max_hold_s=0.05)
    cycles.filtered(_cycle("a"))
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(1.0):
        await cycles.wait_released()
    assert 0.04 <= asyncio.get_running_loop().time() - started < 0.5
    assert not cycles.holding
    async with asyncio.timeout(0.01):
        await cycles.wait_released()


def test_holding_follows_the_clock() -> None:
    clock = Clock()
    cycles = CycleRegistry(max_hold_s=0.005, clock=clock)
    cycles.filtered(_cycle("a"))
    clock.now += 0.004
    assert cycles.holding
    clock.now += 0.002
    assert not cycles.holding


def test_a_prioritize_is_expected_for_two_nodes_and_while_they_come() -> None:
    cycles = CycleRegistry()
    one = _cycle("one", passed=1)
    cycles.filtered(one)
    assert not one.awaiting and not cycles.holding  # kube-scheduler skips scoring one node
    a, b, c = _cycle("a"), _cycle("b"), _cycle("c")
    cycles.filtered(a)
    assert a.awaiting
    cycles.filtered(b)  # a's prioritize never came: the scheduler has no prioritize verb
    assert not a.awaiting and not b.awaiting and not cycles.holding
    cycles.prioritized(b)  # it has one after all
    cycles.filtered(c)
    assert c.awaiting and cycles.holding


def test_another_pods_prioritize_does_not_release_the_latest() -> None:
    cycles = CycleRegistry()
    a, b = _cycle("a"), _cycle("b")
    cycles.filtered(a)
    cycles.prioritized(a)
    cycles.filtered(b)
    cycles.prioritized(None)  # a pod the registry does not know
    assert cycles.holding
    cycles.prioritized(b)
    assert not cycles.holding


def test_nothing_holds_with_the_delay_off() -> None:
    cycles = CycleRegistry(hold=False)
    cycle = _cycle("a")
    cycles.filtered(cycle)
    assert cycle.awaiting  # still expected: an answer may be prepared for it
    assert not cycles.holding


def test_the_registry_is_bounded_oldest_out() -> None:
    cycles = CycleRegistry(capacity=3)
    for uid in "abcd":
        cycles.filtered(_cycle(uid))
    assert len(cycles) == 3
    assert cycles.find("a") is None
    cycles.filtered(_cycle("b"))  # filtered again: now the newest
    cycles.filtered(_cycle("e"))
    assert cycles.find("b") is not None and cycles.find("c") is None


async def test_events_wait_while_a_prioritize_is_expected() -> None:
    api = SlowEvents()
    api.gate.set()
    cycles = CycleRegistry(max_hold_s=30.0)
    sink = EventSink(cast(Cluster, api), cycles=cycles)
    sender = asyncio.create_task(sink.run())
    try:
        cycle = _cycle("a")
        cycles.filtered(cycle)
        sink.record(_event("a"))
        sink.record(_event("b"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert api.recorded == []
        cycles.prioritized(cycle)
        await _until(lambda: api.recorded == ["a", "b"])
        # With nothing expected an Event goes out at once.
        sink.record(_event("c"))
        await _until(lambda: api.recorded == ["a", "b", "c"])
    finally:
        sender.cancel()


@pytest.mark.accelerator("cycle_delay")
async def test_watch_changes_wait_while_a_prioritize_is_expected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cycle_module, "MAX_HOLD_S", 60.0)
    cluster = EmbeddedCluster.from_objects([gpu_node("node-a", gpus=2), gpu_node("node-b")])
    probe = pod("probe", threads=20)
    cluster.apply(probe)
    service = ExtenderService(cluster=cluster, config=Config.default())
    await service.start()
    try:
        outcome = service.filter(probe, ["node-a", "node-b"])
        assert outcome.cycle is not None and outcome.cycle.awaiting
        cluster.apply(pod("late", threads=20))
        for _ in range(50):
            await asyncio.sleep(0)
        assert "uid-default-late" not in service.state.pods
        service.rank(probe, ["node-a", "node-b"])
        await _until(lambda: "uid-default-late" in service.state.pods)
    finally:
        await service.close()
        await cluster.close()
