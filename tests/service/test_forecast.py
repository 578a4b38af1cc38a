"""Forecasting kube-scheduler's next filter call: the node order learned from its rotating
windows (`NodeOrder`), and the warmer computing the forecast call ahead (`Warmer.forecast`,
`Warmer.prefetch`) on a service over an embedded cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.metrics import Metrics
from extender.service import ExtenderService
from extender.service.forecast import NodeOrder
from tests.http.kube_objects import gpu_node, pod

pytestmark = pytest.mark.accelerator("forecast")

Json = dict[str, Any]


async def _started(objects: list[Json]) -> tuple[EmbeddedCluster, ExtenderService]:
    cluster = EmbeddedCluster.from_objects(objects)
    service = ExtenderService(cluster=cluster, config=Config.default())
    await service.start()
    return cluster, service


def _fresh(names: list[str]) -> list[str]:
    """The names as new string objects, as a decoded request body carries them."""
    return [name.encode().decode() for name in names]


def _windows(order: list[str], size: int, count: int, *, start: int = 0) -> list[list[str]]:
    """kube-scheduler's windows over `order`: each starts where the last one stopped."""
    out = []
    for k in range(count):
        at = start + k * size
        out.append([order[(at + j) % len(order)] for j in range(size)])
    return out


def test_the_next_window_is_forecast_once_the_order_has_been_seen() -> None:
    order = [f"node-{i}" for i in range(23)]
    windows = _windows(order, 5, 20)
    learned = NodeOrder()
    assert learned.following(5) == []
    for k, window in enumerate(windows):
        if k * 5 >= len(order) + 5:  # a whole turn, and the window after it, seen
            assert learned.following(5) == window
        learned.observe(_fresh(window))
    assert len(learned) == len(order)


def test_a_walk_past_every_node_stops_where_it_began() -> None:
    order = [f"n{i}" for i in range(6)]
    learned = NodeOrder()
    for window in _windows(order, 3, 5):
        learned.observe(window)
    # The last window ended at n2: every other node, once.
    assert learned.following(50) == ["n3", "n4", "n5", "n0", "n1"]


def test_a_window_with_gaps_does_not_drop_the_nodes_it_skipped() -> None:
    """A pod with a nodeSelector gets a window with gaps; the order keeps what it knew."""
    order = [f"n{i}" for i in range(12)]
    learned = NodeOrder()
    for window in _windows(order, 4, 6):  # two whole turns: n0 .. n11, twice
        learned.observe(window)
    learned.observe(["n0", "n2", "n4", "n6"])  # the selector's pod: every other node
    assert learned.following(4) == ["n7", "n8", "n9", "n10"]
    learned.observe(["n7", "n8", "n9", "n10"])
    assert learned.following(5) == ["n11", "n0", "n1", "n2", "n3"]


def test_links_first_learned_from_a_window_with_gaps_are_corrected() -> None:
    """The first windows after the order is (re)learned may be a nodeSelector pod's: its links
    jump over nodes, and the windows that follow show them; the order takes their links."""
    order = [f"n{i}" for i in range(12)]
    learned = NodeOrder()
    learned.observe(["n0", "n3", "n6", "n9"])  # a selector's window, before anything else
    for window in _windows(order, 4, 6, start=10):  # n10 .. n9, twice: whole turns
        learned.observe(_fresh(window))
    # The last window ended at n9: the walk goes on over n10 .. n8 with nothing jumped over.
    assert learned.following(12) == [*order[10:], *order[:9]]


def test_a_node_added_between_two_known_ones_joins_the_order() -> None:
    order = [f"n{i}" for i in range(8)]
    learned = NodeOrder()
    for window in _windows(order, 4, 4):
        learned.observe(window)
    grown = [*order[:3], "new", *order[3:]]  # a node joins the scheduler's tree after n2
    for window in _windows(grown, 3, 6):
        learned.observe(_fresh(window))
    # 18 names observed: the last window ended at grown[17 % 9] = n7.
    assert learned.following(9) == grown[:8]


def test_the_order_is_bounded_and_learned_afresh_past_its_bound() -> None:
    learned = NodeOrder(max_names=10)
    learned.observe([f"a{i}" for i in range(8)])
    learned.observe([f"b{i}" for i in range(8)])
    assert len(learned) <= 10
    assert learned.following(3) == []  # nothing known after b7 yet


async def test_the_warmer_computes_the_forecast_call_ahead() -> None:
    nodes = [gpu_node(f"n{i}", gpus=2) for i in range(6)]
    pending = [pod(f"p{i}", threads=10 + 5 * i) for i in range(5)]
    cluster, service = await _started([*nodes, *pending])
    try:
        order = [f"n{i}" for i in range(6)]
        windows = _windows(order, 3, 3)
        # Three cycles: p0, p1, p2 asked about in turn; p0 is bound on n4.
        computed_by_calls = []
        for k, window in enumerate(windows):
            found = cluster.pod("default", f"p{k}")
            assert found is not None
            out = service.filter(found, _fresh(window))
            assert out.passed
            computed_by_calls.append(service.call_results)
            if k == 0:
                await service.bind(name="p0", namespace="default", uid="uid-default-p0", node="n4")
        # The start-up warm-up computed every pending pod on every node; p1's call found n4
        # changed by p0's bind, before any order was learned to forecast it, and computed it.
        assert computed_by_calls == [0, 1, 1]
        # The next call: p3 (the oldest pending pod not asked about), on n3, n4, n5. n4 took a
        # pod since the start-up warm-up computed p3's shape: its result is unknown.
        p3 = cluster.pod("default", "p3")
        assert p3 is not None
        demand = service.state.parser.parse(p3).demand
        assert demand is not None
        ev = service.state.evaluator
        ev.refresh()
        n4 = ev.state_ids()["n4"]
        assert not ev.results(demand).status[n4]
        before = service.warmer.prefetched
        service.moved_on()  # prioritize answered: the scheduler went on
        for _ in range(50):
            await asyncio.sleep(0)
            if service.warmer.prefetched > before:
                break
        assert service.warmer.prefetched > before
        assert ev.results(demand).status[ev.state_ids()["n4"]]
        # Operators see the work: mpsched_forecast_results_total.
        sample = await service.metrics_sample()
        assert sample.forecast_results == service.forecast_results == service.warmer.prefetched
        text = Metrics().render(sample).decode()
        assert f"mpsched_forecast_results_total {float(sample.forecast_results)}" in text
        # The filter call that comes finds it computed (it computes nothing itself), and
        # answers as it would have.
        out = service.filter(p3, _fresh(["n3", "n4", "n5"]))
        assert out.passed == ["n3", "n4", "n5"]
        assert service.call_results == 1
        sample = await service.metrics_sample()
        text = Metrics().render(sample).decode()
        assert "mpsched_call_results_total 1.0" in text
        # A new decision state (a reconfiguration) keeps what the old one computed counted.
        counted = service.forecast_results
        cfg = service.config
        budgets = dataclasses.replace(cfg.budgets, oversubscription=2.0)
        await service.reconfigure(dataclasses.replace(cfg, budgets=budgets))
        assert service.warmer.prefetched == 0
        assert service.forecast_results == counted
        assert service.state.evaluator.swept_results == 0
        assert service.call_results == 1
    finally:
        await service.close()


async def test_pods_asked_about_or_gone_are_not_forecast() -> None:
    nodes = [gpu_node(f"n{i}", gpus=2) for i in range(2)]
    pending = [pod(f"p{i}", threads=10 + 5 * i) for i in range(3)]
    cluster, service = await _started([*nodes, *pending])
    try:
        warmer = service.warmer
        warmer.forget("uid-default-p1")  # bound or deleted
        found = cluster.pod("default", "p0")
        assert found is not None
        service.filter(found, ["n0"])
        forecast = warmer.forecast()
        assert forecast is not None
        demand, _ = forecast
        p2 = cluster.pod("default", "p2")
        assert p2 is not None
        assert demand == service.state.parser.parse(p2).demand
        assert warmer.forecast() is None  # nothing asked since
    finally:
        await service.close()


async def _two_pods_bound() -> tuple[EmbeddedCluster, ExtenderService]:
    """Four nodes, pod b pending; pods a and c bound after start-up on n1 and n3, so that
    their new states have no result yet for b's shape."""
    nodes = [gpu_node(f"n{i}", gpus=2) for i in range(4)]
    cluster, service = await _started([*nodes, pod("a", threads=30), pod("b", threads=45)])
    await service.bind(name="a", namespace="default", uid="uid-default-a", node="n1")
    cluster.apply(pod("c", threads=20))
    await service.bind(name="c", namespace="default", uid="uid-default-c", node="n3")
    return cluster, service


async def test_warm_from_computes_a_bounded_slice_and_says_where_it_stopped() -> None:
    cluster, service = await _two_pods_bound()
    _, alone = await _two_pods_bound()
    try:
        found = cluster.pod("default", "b")
        assert found is not None
        demand = service.state.parser.parse(found).demand
        assert demand is not None
        ev = service.state.evaluator
        names = ["n0", "ghost", "n1", "n2", "n3"]
        assert ev.warm_from(demand, names, 0, 1) == (1, 3)  # n0 known, ghost passed over
        assert ev.warm_from(demand, names, 3, 1) == (1, 5)
        assert ev.warm_from(demand, names, 0, 10) == (0, 5)  # all known now
        # What a filter then reads is what it computes itself where nothing was warmed.
        known = ev.sweep(demand, names)
        computed = alone.state.evaluator.sweep(demand, names)
        assert known.passed == computed.passed == ["n0", "n1", "n2", "n3"]
        assert list(known.scores) == list(computed.scores)
    finally:
        await service.close()
        await alone.close()
