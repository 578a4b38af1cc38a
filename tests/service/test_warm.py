"""Warming the result caches ahead of the scheduler's calls (`Evaluator.warm`, the service's
`Warmer`) on a service over an embedded cluster, and the count of results the calls still
compute themselves (`mpsched_call_results_total`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.metrics import Metrics
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod

Json = dict[str, Any]


async def _started(objects: list[Json]) -> tuple[EmbeddedCluster, ExtenderService]:
    cluster = EmbeddedCluster.from_objects(objects)
    service = ExtenderService(cluster=cluster, config=Config.default())
    await service.start()
    return cluster, service


async def _two_pods_bound() -> tuple[EmbeddedCluster, ExtenderService]:
    """Four nodes, pod b pending; pods a and c bound after start-up on n1 and n3, so that
    their new states have no result yet for b's shape."""
    nodes = [gpu_node(f"n{i}", gpus=2) for i in range(4)]
    cluster, service = await _started([*nodes, pod("a", threads=30), pod("b", threads=45)])
    await service.bind(name="a", namespace="default", uid="uid-default-a", node="n1")
    cluster.apply(pod("c", threads=20))
    await service.bind(name="c", namespace="default", uid="uid-default-c", node="n3")
    return cluster, service


async def test_warm_computes_the_unknown_results_only_and_a_filter_reads_the_same() -> None:
    cluster, service = await _two_pods_bound()
    _, alone = await _two_pods_bound()
    try:
        found = cluster.pod("default", "b")
        assert found is not None
        demand = service.state.parser.parse(found).demand
        assert demand is not None
        ev = service.state.evaluator
        names = ["n0", "ghost", "n1", "n2", "n3"]
        # n0 and n2 were warmed at start-up; a name that is no node is passed over.
        assert ev.warm(demand, names) == 2
        assert ev.warm(demand, names) == 0  # all known now
        # What a filter then reads is what it computes itself where nothing was warmed.
        known = ev.sweep(demand, names)
        computed = alone.state.evaluator.sweep(demand, names)
        assert known.passed == computed.passed == ["n0", "n1", "n2", "n3"]
        assert list(known.scores) == list(computed.scores)
        assert ev.swept_results == 0  # the filter computed nothing itself
    finally:
        await service.close()
        await alone.close()


async def test_the_results_calls_compute_themselves_are_counted_across_states() -> None:
    nodes = [gpu_node(f"n{i}", gpus=2) for i in range(4)]
    pending = [pod(f"p{i}", threads=10 + 5 * i) for i in range(3)]
    cluster, service = await _started([*nodes, *pending])
    try:
        p1 = cluster.pod("default", "p1")
        assert p1 is not None
        # The start-up warm-up computed every pending pod's shape on every node.
        assert service.filter(p1, ["n0", "n1", "n2", "n3"]).passed
        assert service.call_results == 0
        # p0 takes n2: p1's result there is unknown until a call computes it.
        await service.bind(name="p0", namespace="default", uid="uid-default-p0", node="n2")
        assert service.filter(p1, ["n1", "n2", "n3"]).passed == ["n1", "n2", "n3"]
        assert service.call_results == 1
        sample = await service.metrics_sample()
        assert sample.call_results == 1
        text = Metrics().render(sample).decode()
        assert "mpsched_call_results_total 1.0" in text
        # A new decision state (a reconfiguration) keeps what the old one's calls computed.
        cfg = service.config
        budgets = dataclasses.replace(cfg.budgets, oversubscription=2.0)
        await service.reconfigure(dataclasses.replace(cfg, budgets=budgets))
        assert service.state.evaluator.swept_results == 0
        assert service.call_results == 1
    finally:
        await service.close()
