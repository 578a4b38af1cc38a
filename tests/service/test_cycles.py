"""The scheduling cycle as an object: filter opens one per pod, prioritize finds it by the pod's
uid and reuses its scores only while the request is the one filter answered (same pod version,
same decision state, the same names by value, none of them changed since); bind ends it. Two
scheduler profiles interleave their pods' cycles, and each finds its own."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod
from tests.service.test_service import _settle, count_recomputations

Json = dict[str, Any]

NODES = [gpu_node(name, gpus=2) for name in ("a", "b", "c", "d")]


@pytest.fixture
async def svc() -> AsyncIterator[ExtenderService]:
    objects = [*NODES, pod("p25", threads=25), pod("p40", threads=40), pod("other", threads=50)]
    service = ExtenderService(
        cluster=EmbeddedCluster.from_objects(objects), config=Config.default()
    )
    await service.start()
    yield service
    await service.close()


def _pod(service: ExtenderService, name: str) -> Json:
    cluster = service.cluster
    assert isinstance(cluster, EmbeddedCluster)
    found = cluster.pod("default", name)
    assert found is not None
    return found


async def test_prioritize_reuses_the_cycle_for_a_copy_of_the_passed_names(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b", "c"])
    calls = count_recomputations(svc, monkeypatch)
    copied = [str(name) for name in out.passed]
    assert copied == out.passed and copied is not out.passed
    scores = svc.scores(p, copied)
    assert calls == []  # the filter's scores, not a second sweep
    assert len(scores) == 3 and max(scores) == 10


async def test_interleaved_cycles_of_two_pods_each_reuse_their_own(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two scheduler profiles: pod A's filter, pod B's filter, then A's prioritize and B's."""
    a, b = _pod(svc, "p25"), _pod(svc, "p40")
    out_a = svc.filter(a, ["a", "b", "c"])
    out_b = svc.filter(b, ["b", "c", "d"])
    calls = count_recomputations(svc, monkeypatch)
    assert svc.scores(a, list(out_a.passed)) is not None
    assert svc.scores(b, list(out_b.passed)) is not None
    assert calls == []


async def test_a_bind_on_a_passed_node_in_between_recomputes(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    calls = count_recomputations(svc, monkeypatch)
    await svc.bind(name="other", namespace="default", uid="uid-default-other", node="a")
    await _settle()
    svc.scores(p, list(out.passed))
    assert calls == [2]


async def test_a_bind_on_another_node_keeps_the_cycle(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    calls = count_recomputations(svc, monkeypatch)
    await svc.bind(name="other", namespace="default", uid="uid-default-other", node="d")
    await _settle()
    svc.scores(p, list(out.passed))
    assert calls == []


async def test_another_resource_version_recomputes(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    calls = count_recomputations(svc, monkeypatch)
    newer = copy.deepcopy(p)
    newer["metadata"]["resourceVersion"] = str(int(p["metadata"]["resourceVersion"]) + 100)
    svc.scores(newer, list(out.passed))
    assert calls == [2]


async def test_other_names_recompute(svc: ExtenderService, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _pod(svc, "p25")
    svc.filter(p, ["a", "b", "c"])
    calls = count_recomputations(svc, monkeypatch)
    svc.scores(p, ["a", "b"])
    svc.scores(p, ["c", "b", "a"])
    assert calls == [2, 3]


async def test_a_state_swapped_by_reconfiguration_recomputes(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    calls = count_recomputations(svc, monkeypatch)
    config = Config.default()
    changed = dataclasses.replace(
        config, budgets=dataclasses.replace(config.budgets, memory_reserve_mib=512)
    )
    done = await svc.reconfigure(changed)
    assert done.rebuilt
    svc.scores(p, list(out.passed))
    assert calls == [2]


async def test_bind_ends_the_pods_cycle(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="c")
    await _settle()
    assert svc.cycles.find("uid-default-p25") is None
    calls = count_recomputations(svc, monkeypatch)
    svc.scores(p, list(out.passed))
    assert calls == [2]


async def test_the_registry_keeps_the_latest_cycles_only(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = svc.cluster
    assert isinstance(cluster, EmbeddedCluster)
    pods = [pod(f"q{i:03d}", threads=10) for i in range(65)]
    for q in pods:
        cluster.apply(q)
    await _settle()
    for q in pods:
        svc.filter(q, ["a", "b"])
    calls = count_recomputations(svc, monkeypatch)
    svc.scores(pods[1], ["a", "b"])  # the second oldest is still there
    assert calls == []
    svc.scores(pods[0], ["a", "b"])  # the oldest went out when the last came
    assert calls == [2]
    assert len(svc.cycles) == 64
