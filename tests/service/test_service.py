"""The extender service over an embedded cluster: filter outcomes and reasons, score
normalisation and the filter→prioritize reuse, bind (reserve, annotate, confirm, release,
idempotent retry, concurrency), preempt on per-GPU shares, the ledger following the cluster,
/status and the learned workload."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from extender.cluster import JsonObject, Unavailable
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY, decode_allocation
from extender.service import BindError, ExtenderService, NotReady, Victims, normalise
from extender.service.runtime import Reconfigured
from tests.http.kube_objects import gpu_node, plain_node, pod

Json = dict[str, Any]


async def _settle() -> None:
    """Let the service's watch task apply the events queued so far."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _service(objects: Sequence[Json], **kwargs: Any) -> ExtenderService:
    cluster = EmbeddedCluster.from_objects(objects)
    service = ExtenderService(cluster=cluster, config=Config.default(), **kwargs)
    await service.start()
    return service


@pytest.fixture
async def svc() -> AsyncIterator[ExtenderService]:
    service = await _service(
        [
            gpu_node("a", gpus=2),
            gpu_node("b", gpus=2),
            gpu_node("small", gpus=1, memory_mib=16384, model="T4", cc="7.5"),
            plain_node("cpu-only"),
            pod("p25", threads=25),
            pod("p60", threads=60),
            pod("whole2", gpus=2),
        ]
    )
    yield service
    await service.close()


def _cluster(service: ExtenderService) -> EmbeddedCluster:
    cluster = service.cluster
    assert isinstance(cluster, EmbeddedCluster)
    return cluster


def _pod(service: ExtenderService, name: str) -> Json:
    found = _cluster(service).pod("default", name)
    assert found is not None
    return found


async def test_not_ready_before_start() -> None:
    service = ExtenderService(cluster=EmbeddedCluster.from_objects([]), config=Config.default())
    with pytest.raises(NotReady):
        service.filter(pod("x", threads=10), ["a"])


async def test_filter_passes_fitting_nodes_and_explains_the_rest(svc: ExtenderService) -> None:
    out = svc.filter(_pod(svc, "p25"), ["a", "b", "small", "cpu-only", "ghost"])
    assert out.passed == ["a", "b", "small"]
    assert set(out.unresolvable) == {"cpu-only", "ghost"}
    assert "no GPU inventory" in out.unresolvable["cpu-only"]
    assert "unknown" in out.unresolvable["ghost"]
    assert out.failed == {}


async def test_whole_gpu_request_is_unresolvable_on_a_one_gpu_node(svc: ExtenderService) -> None:
    out = svc.filter(_pod(svc, "whole2"), ["a", "small"])
    assert out.passed == ["a"]
    assert "node has 1 GPUs, pod needs 2 whole" in out.unresolvable["small"]


async def test_invalid_request_is_unresolvable_everywhere_with_the_reason(
    svc: ExtenderService,
) -> None:
    bad = pod("bad", threads=101)
    out = svc.filter(bad, ["a", "b"])
    assert out.passed == []
    assert set(out.unresolvable) == {"a", "b"}
    assert "above 100" in out.unresolvable["a"]
    # Larger than any GPU in the cluster (40 GiB here): no node could ever take it.
    huge = pod("huge", memory="100Gi")
    out = svc.filter(huge, ["a"])
    assert "larger than any GPU" in out.unresolvable["a"]


async def test_full_node_is_resolvable_and_bind_fills_it(svc: ExtenderService) -> None:
    cluster = _cluster(svc)
    for i in range(4):
        cluster.apply(pod(f"half{i}", threads=50))
    await _settle()
    for i in range(4):
        await svc.bind(name=f"half{i}", namespace="default", uid=f"uid-default-half{i}", node="a")
    out = svc.filter(_pod(svc, "p25"), ["a", "b"])
    assert out.passed == ["b"]
    assert "no GPU has room" in out.failed["a"]
    svc.state.ledger.check_invariants()


async def test_prioritize_normalises_to_0_10_and_reuses_filter(svc: ExtenderService) -> None:
    cluster = _cluster(svc)
    cluster.apply(pod("seed", threads=50))
    await _settle()
    await svc.bind(name="seed", namespace="default", uid="uid-default-seed", node="a")
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b", "small"])
    scores = dict(zip(out.passed, svc.scores(p, out.passed), strict=True))
    assert set(scores) == {"a", "b", "small"}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert max(scores.values()) == 10
    # The reuse path and a recomputation agree.
    svc.cycles.clear()
    assert dict(zip(out.passed, svc.scores(p, out.passed), strict=True)) == scores
    # A node that does not fit scores 0.
    assert svc.scores(p, ["cpu-only", "a"])[0] == 0


def count_recomputations(svc: ExtenderService, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the recomputations prioritize makes (the service's own step: the evaluator may
    be a compiled class, whose methods cannot be replaced)."""
    calls: list[int] = []
    recompute = svc._raw_scores

    def counted(state: Any, demand: Any, names: Sequence[str]) -> Any:
        calls.append(len(names))
        return recompute(state, demand, names)

    monkeypatch.setattr(svc, "_raw_scores", counted)
    return calls


async def test_prioritize_reuses_filter_across_a_bind_on_another_node(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kube-scheduler binds asynchronously: the previous pod's bind lands between a pod's
    filter and its prioritize. A node outside the candidates changing keeps the reuse."""
    cluster = _cluster(svc)
    cluster.apply(pod("other", threads=50))
    await _settle()
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "small"])
    calls = count_recomputations(svc, monkeypatch)
    await svc.bind(name="other", namespace="default", uid="uid-default-other", node="b")
    await _settle()
    scores = svc.scores(p, out.passed)
    assert calls == []
    svc.cycles.clear()
    assert svc.scores(p, out.passed) == scores
    assert calls == [2]


async def test_prioritize_recomputes_when_a_candidate_changed_since_filter(
    svc: ExtenderService, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _cluster(svc)
    cluster.apply(pod("other", threads=50))
    await _settle()
    p = _pod(svc, "p25")
    out = svc.filter(p, ["a", "b"])
    before = svc.scores(p, out.passed)
    calls = count_recomputations(svc, monkeypatch)
    await svc.bind(name="other", namespace="default", uid="uid-default-other", node="a")
    await _settle()
    after = svc.scores(p, out.passed)
    assert calls == [2]
    # The half-used node is now the better fit for a quarter share: the fresh scores show it.
    assert after != before
    svc.cycles.clear()
    assert svc.scores(p, out.passed) == after


def test_normalise() -> None:
    assert normalise([1.0, 3.0, 2.0]) == [0, 10, 5]
    assert normalise([4.0, 4.0]) == [10, 10]
    assert normalise([None, 2.0, 1.0]) == [0, 10, 0]
    assert normalise([]) == []
    assert normalise([None, None]) == [0, 0]
    assert normalise([0.5, 1.5, 1.0]) == [0, 10, 5]  # half rounds up


def _normalise_by_hand(raw: Sequence[float | None]) -> list[int]:
    known = [s for s in raw if s is not None]
    if not known:
        return [0] * len(raw)
    lo, hi = min(known), max(known)
    return [
        0 if s is None else 10 if hi == lo else math.floor((s - lo) * 10 / (hi - lo) + 0.5)
        for s in raw
    ]


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(
        st.one_of(st.none(), st.integers(0, 100).map(float), st.floats(-1e6, 1e6)), max_size=60
    )
)
# Scores a denormal apart: 10 / 1.11e-308 overflowed (failed 1 run in 5 before the fix).
@example(raw=[0.0, -1.11e-308])
@example(raw=[5e-324, 0.0, None])
def test_normalise_agrees_with_min_max_by_hand(raw: list[float | None]) -> None:
    got = normalise(raw)
    assert all(type(s) is int and 0 <= s <= 10 for s in got)
    # The same figures up to one step where float rounding lands on a half.
    assert all(abs(a - b) <= 1 for a, b in zip(got, _normalise_by_hand(raw), strict=True))
    known = [s for s in raw if s is not None]
    if known and max(known) > min(known):
        assert got[raw.index(max(known))] == 10 and got[raw.index(min(known))] == 0


async def test_bind_annotates_reserves_and_is_confirmed_by_the_watch(svc: ExtenderService) -> None:
    alloc = await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    assert alloc is not None and alloc.node == "a" and alloc.threads == 25
    assert svc.state.ledger.state("uid-default-p25") == "assumed"
    bound = _pod(svc, "p25")
    assert bound["spec"]["nodeName"] == "a"
    annotations = bound["metadata"]["annotations"]
    decoded = decode_allocation(
        annotations[ALLOCATION_KEY], pod_uid="uid-default-p25", namespace="default", name="p25"
    )
    assert decoded == alloc
    assert annotations["mpsched.io/threads.main"] == "25"
    assert annotations["mpsched.io/visible-devices"] == alloc.gpus[0].uuid
    await _settle()
    assert svc.state.ledger.state("uid-default-p25") == "confirmed"
    # By default the annotation is the record: no GpuShareAllocated Event beside it.
    assert not [e for e in _cluster(svc).recorded_events if e["reason"] == "GpuShareAllocated"]


async def test_allocation_events_when_asked_for() -> None:
    """api.allocationEvents true: each fresh allocation is also recorded as a Normal
    GpuShareAllocated Event on its pod, naming the GPU and the share."""
    import dataclasses

    config = Config.default()
    cluster = EmbeddedCluster.from_objects([gpu_node("a", gpus=2), pod("p25", threads=25)])
    service = ExtenderService(
        cluster=cluster,
        config=dataclasses.replace(
            config, api=dataclasses.replace(config.api, allocation_events=True)
        ),
    )
    await service.start()
    try:
        alloc = await service.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
        assert alloc is not None
        await _settle()
        assert ALLOCATION_KEY in _pod(service, "p25")["metadata"]["annotations"]
        events = [e for e in cluster.recorded_events if e["reason"] == "GpuShareAllocated"]
        assert len(events) == 1
        assert "25% threads" in events[0]["message"] and "on a" in events[0]["message"]
    finally:
        await service.close()


async def test_rebind_to_the_same_node_is_a_success(svc: ExtenderService) -> None:
    first = await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await _settle()
    again = await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    assert again == first
    # A retry after a restart (the ledger rebuilt from the cluster) is a success too.
    fresh = await _service([gpu_node("a"), _pod(svc, "p25")], warm_budget_s=0.0)
    assert await fresh.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await fresh.close()
    with pytest.raises(BindError) as err:
        await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="b")
    assert err.value.reason == "conflict"


async def test_failed_bind_releases_the_reservation(svc: ExtenderService) -> None:
    cluster = _cluster(svc)
    p = _pod(svc, "p60")
    svc.filter(p, ["a"])  # the service now knows the pod's shape
    cluster.delete_pod("default", "p60")
    with pytest.raises(BindError) as err:
        await svc.bind(name="p60", namespace="default", uid="uid-default-p60", node="a")
    assert err.value.reason == "not_found"
    assert svc.state.ledger.allocation("uid-default-p60") is None
    svc.state.ledger.check_invariants()
    # UID mismatch: the pod was recreated under the same name.
    cluster.apply(pod("p60", uid="new-uid", threads=60))
    await _settle()
    svc.filter(p, ["a"])
    with pytest.raises(BindError) as err:
        await svc.bind(name="p60", namespace="default", uid="uid-default-p60", node="a")
    assert err.value.reason == "uid_mismatch"
    assert svc.state.ledger.allocation("uid-default-p60") is None


async def test_bind_refusals(svc: ExtenderService) -> None:
    with pytest.raises(BindError) as err:
        await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="cpu-only")
    assert err.value.reason == "unknown_node"
    with pytest.raises(BindError) as err:
        await svc.bind(name="nobody", namespace="default", uid="u", node="a")
    assert err.value.reason == "not_found"
    with pytest.raises(BindError) as err:
        await svc.bind(name="whole2", namespace="default", uid="uid-default-whole2", node="small")
    assert err.value.reason == "no_fit"


async def test_concurrent_binds_never_over_allocate() -> None:
    # 40 pods of 30 % on one node of 2 GPUs: at most 3 per GPU fit (90 %), 6 in all.
    pods = [pod(f"c{i}", threads=30) for i in range(40)]
    service = await _service([gpu_node("n", gpus=2), *pods])
    results = await asyncio.gather(
        *(
            service.bind(name=f"c{i}", namespace="default", uid=f"uid-default-c{i}", node="n")
            for i in range(40)
        ),
        return_exceptions=True,
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BindError)]
    assert len(ok) == 6 and len(refused) == 34
    assert all(r.reason == "no_fit" for r in refused)
    usage = service.state.ledger.node("n")
    assert [g.threads for g in usage.gpus] == [90, 90]
    service.state.ledger.check_invariants()
    await _settle()
    bound = [p for p in pods if _pod(service, p["metadata"]["name"])["spec"].get("nodeName")]
    assert len(bound) == 6
    await service.close()


async def test_ledger_follows_the_cluster(svc: ExtenderService) -> None:
    cluster = _cluster(svc)
    await svc.bind(name="p60", namespace="default", uid="uid-default-p60", node="a")
    await _settle()
    assert svc.state.ledger.allocation("uid-default-p60") is not None
    cluster.set_pod_phase("default", "p60", "Succeeded")
    await _settle()
    assert svc.state.ledger.allocation("uid-default-p60") is None
    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="b")
    await _settle()
    cluster.delete_pod("default", "p25")
    await _settle()
    assert svc.state.ledger.allocation("uid-default-p25") is None
    cluster.delete_node("b")
    await _settle()
    assert svc.state.ledger.get_node("b") is None
    assert "unknown" in svc.filter(_pod(svc, "whole2"), ["b"]).unresolvable["b"]


async def test_startup_rebuilds_allocations_from_annotations(svc: ExtenderService) -> None:
    await svc.bind(name="p60", namespace="default", uid="uid-default-p60", node="a")
    await _settle()
    objects = [gpu_node("a"), _pod(svc, "p60"), pod("other", threads=50)]
    fresh = await _service(objects)
    held = fresh.state.ledger.allocation("uid-default-p60")
    assert held == svc.state.ledger.allocation("uid-default-p60")
    assert fresh.state.ledger.state("uid-default-p60") == "confirmed"
    await fresh.close()


# -- preempt ---------------------------------------------------------------------------------


async def _packed() -> ExtenderService:
    """Node n: GPU 0 holds lo1 (50 %) and lo2 (50 %); GPU 1 holds mid (50 %) and hi (50 %)."""
    objects = [gpu_node("n", gpus=2)]
    shares = [("lo1", 1), ("lo2", 1), ("mid", 5), ("hi", 9)]
    objects += [pod(name, threads=50, priority=prio) for name, prio in shares]
    objects.append(pod("big", threads=100, priority=100))
    service = await _service(objects)
    for name, _ in shares:
        gpu = 0 if name.startswith("lo") else 1
        # Place each pod on the intended GPU by filling GPU 0 first.
        uid = f"uid-default-{name}"
        alloc = await service.bind(name=name, namespace="default", uid=uid, node="n")
        assert alloc is not None and alloc.gpus[0].index == gpu
    await _settle()
    return service


async def test_preempt_frees_one_gpu_with_the_fewest_lowest_priority_victims() -> None:
    service = await _packed()
    service.preempt_extra_victims = False  # drawn from the scheduler's proposal only
    big = _pod(service, "big")
    proposal = {"n": Victims([f"uid-default-{n}" for n in ("lo1", "lo2", "mid", "hi")], 1)}
    chosen = service.preempt(big, proposal)
    assert set(chosen["n"].uids) == {"uid-default-lo1", "uid-default-lo2"}
    # Victims spread over two GPUs free no single GPU: the node is dropped.
    spread = {"n": Victims(["uid-default-lo1", "uid-default-mid"], 0)}
    assert service.preempt(big, spread) == {}
    # Only UIDs on that node come back, never ones placed elsewhere.
    assert service.preempt(big, {"other": Victims(["uid-default-lo1"], 0)}) == {}
    await service.close()


async def test_preempt_keeps_the_proposal_when_the_pod_fits_already() -> None:
    service = await _packed()
    small = pod("tiny", threads=10, priority=100)
    _cluster(service).apply(small)
    await _settle()
    service.state.ledger.release("uid-default-hi")
    service.state.evaluator.touch("n")
    proposal = {"n": Victims(["uid-default-lo1"], 0)}
    assert service.preempt(small, proposal)["n"].uids == ["uid-default-lo1"]
    await service.close()


async def test_preempt_adds_lower_priority_gpu_victims_by_default() -> None:
    # The scheduler's dry run cannot see GPU shares, so it proposes nobody on node n.
    service = await _packed()
    chosen = service.preempt(_pod(service, "big"), {"n": Victims([], 0)})
    assert set(chosen["n"].uids) == {"uid-default-lo1", "uid-default-lo2"}
    # Never a pod of equal or higher priority: a priority-5 pod may only evict lo1 and lo2,
    # and a pod of priority 1 evicts nobody, so the node is left out.
    mid_prio = pod("mid-prio", threads=100, priority=5)
    _cluster(service).apply(mid_prio)
    await _settle()
    assert set(service.preempt(mid_prio, {"n": Victims([], 0)})["n"].uids) == {
        "uid-default-lo1",
        "uid-default-lo2",
    }
    low = pod("low-prio", threads=100, priority=1)
    _cluster(service).apply(low)
    await _settle()
    assert service.preempt(low, {"n": Victims([], 0)}) == {}
    await service.close()


# -- status and workload -----------------------------------------------------------------------


async def test_status_document_shape(svc: ExtenderService) -> None:
    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await svc.bind(name="whole2", namespace="default", uid="uid-default-whole2", node="b")
    doc = svc.status()
    assert set(doc) == {"nodes", "summary", "config"}
    names = [n["name"] for n in doc["nodes"]]
    assert names == ["a", "b", "small"]
    gpu = doc["nodes"][0]["gpus"][0]
    assert set(gpu) == {
        "index", "uuid", "model", "memoryMiB", "computeCapability", "mps", "threads", "memory",
        "clients", "wholeOwner", "pods", "overBudget", "inUsePct",
    }  # fmt: skip
    shared = next(g for g in doc["nodes"][0]["gpus"] if g["pods"])
    assert shared["threads"] == {"used": 25, "capacity": 100}
    assert shared["memory"]["capacityMiB"] == 40960 - 256
    assert shared["clients"] == {"used": 1, "capacity": 48}
    assert shared["pods"][0] == {
        "namespace": "default",
        "name": "p25",
        "uid": "uid-default-p25",
        "threads": 25,
        "memoryMiB": shared["pods"][0]["memoryMiB"],
        "clients": 1,
        "state": "assumed",
    }
    assert {g["wholeOwner"] for g in doc["nodes"][1]["gpus"]} == {"default/whole2"}
    summary = doc["summary"]
    assert summary["nodes"] == 3 and summary["gpus"] == 5 and summary["pods"] == 2
    assert summary["threadsUsedPct"] == pytest.approx((25 + 200) / 5)
    assert isinstance(summary["fragmentationPct"], float)
    assert doc["config"] == {"policy": "default", "source": None, "error": None}
    assert [n["name"] for n in svc.status(node="b")["nodes"]] == ["b"]


async def test_workload_is_learned_from_the_cluster() -> None:
    objects: list[Json] = [gpu_node("n", gpus=8)]
    objects += [pod(f"s{i}", threads=10, cpu="2") for i in range(30)]
    service = await _service(objects)
    shapes = {t.shape for t in service.state.workload}
    assert any(s.threads == 10 and s.cpu_milli == 2000 for s in shapes)
    await service.close()


async def test_reconfigure_swaps_the_policy_and_rebuilds_for_new_budgets(
    svc: ExtenderService,
) -> None:
    import dataclasses

    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await _settle()
    cfg = svc.config
    await svc.reconfigure(
        dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, name="bestfit"))
    )
    assert svc.state.evaluator.policy.name == "bestfit"
    await svc.reconfigure(
        dataclasses.replace(cfg, budgets=dataclasses.replace(cfg.budgets, oversubscription=2.0))
    )
    assert svc.ready
    assert svc.state.ledger.node("a").gpus[0].capacity.threads == 200
    assert svc.state.ledger.allocation("uid-default-p25") is not None


async def test_pending_pods_are_warmed_before_ready(svc: ExtenderService) -> None:
    assert svc.warmer.is_pending("uid-default-p25")
    assert svc.warmer.queued() == 0
    demand = svc.state.parser.parse(_pod(svc, "p25")).demand
    assert demand is not None
    results = svc.state.evaluator.results(demand)
    assert all(results.status[sid] for sid in svc.state.evaluator.state_ids().values())
    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await _settle()
    assert not svc.warmer.is_pending("uid-default-p25")
    # A new pending pod of a new shape is warmed in the background.
    _cluster(svc).apply(pod("late", threads=35, cpu="3"))
    await _settle()
    late = svc.state.parser.parse(_pod(svc, "late")).demand
    assert late is not None
    for _ in range(50):
        if all(
            svc.state.evaluator.results(late).status[s]
            for s in svc.state.evaluator.state_ids().values()
        ):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the late pod's shape was not warmed")


async def test_status_stream_is_the_same_document(svc: ExtenderService) -> None:
    import orjson

    await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    await _settle()
    sample = await svc.metrics_sample(batch=1)
    assert len(sample.gpus) == 5 and sample.nodes == 3
    assert (sample.assumed, sample.confirmed) == (0, 1)
    for node in (None, "b", "ghost"):
        pieces = [p async for p in svc.status_stream(node=node, batch=1)]
        assert orjson.loads(b"".join(pieces)) == svc.status(node=node)


# -- truth rules under faults -------------------------------------------------------------------


class _FaultyCluster(EmbeddedCluster):
    """An embedded cluster whose Binding answers late, or is applied with its answer lost
    while reads fail (an API outage), as a real API server's can be."""

    bind_delay_s = 0.0
    lose_answers = False
    reads_fail = False

    async def bind(self, **kwargs: Any) -> None:
        await asyncio.sleep(self.bind_delay_s)
        await super().bind(**kwargs)
        if self.lose_answers:
            raise Unavailable("connection reset by peer")

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        if self.reads_fail:
            raise Unavailable("connection refused")
        return await super().get_pod(namespace, name)


async def _faulty(
    objects: Sequence[Json], *, in_doubt_s: float = 25.0
) -> tuple[_FaultyCluster, ExtenderService]:
    import dataclasses

    cluster = _FaultyCluster.from_objects(objects)
    assert isinstance(cluster, _FaultyCluster)
    config = Config.default()
    config = dataclasses.replace(
        config, api=dataclasses.replace(config.api, in_doubt_seconds=in_doubt_s)
    )
    service = ExtenderService(cluster=cluster, config=config, warm_budget_s=0.0)
    await service.start()
    return cluster, service


async def test_a_reload_racing_a_slow_bind_cannot_give_a_gpu_out_twice() -> None:
    import dataclasses

    cluster, service = await _faulty(
        [gpu_node("n", gpus=1), pod("a", threads=60), pod("b", threads=60)]
    )
    cluster.bind_delay_s = 0.3
    first = asyncio.create_task(
        service.bind(name="a", namespace="default", uid="uid-default-a", node="n")
    )
    await asyncio.sleep(0.05)  # a's reservation is made; its Binding is on its way
    cfg = service.config
    await service.reconfigure(
        dataclasses.replace(cfg, budgets=dataclasses.replace(cfg.budgets, memory_reserve_mib=512))
    )
    with pytest.raises(BindError) as err:
        await service.bind(name="b", namespace="default", uid="uid-default-b", node="n")
    assert err.value.reason == "no_fit"
    assert await first is not None
    await _settle()
    assert service.state.ledger.node("n").gpus[0].threads == 60
    await service.close()


async def test_a_lost_answer_during_an_outage_is_held_in_doubt_then_confirmed() -> None:
    cluster, service = await _faulty(
        [gpu_node("n", gpus=1), pod("a", threads=60), pod("b", threads=60)]
    )
    cluster.lose_answers = cluster.reads_fail = True
    with pytest.raises(BindError) as err:
        await service.bind(name="a", namespace="default", uid="uid-default-a", node="n")
    assert err.value.reason == "in_doubt"
    # Applied, but nobody knows yet: the reservation still counts.
    assert service.state.ledger.state("uid-default-a") in ("in_doubt", "confirmed")
    with pytest.raises(BindError):
        await service.bind(name="b", namespace="default", uid="uid-default-b", node="n")
    cluster.lose_answers = cluster.reads_fail = False
    for _ in range(100):
        if service.state.ledger.state("uid-default-a") == "confirmed":
            break
        await asyncio.sleep(0.05)
    assert service.state.ledger.state("uid-default-a") == "confirmed"
    assert service.state.ledger.node("n").gpus[0].threads == 60
    await service.close()


async def test_an_unapplied_bind_in_doubt_is_released_once_the_api_answers() -> None:
    # Unbound right after the timeout proves nothing (the API server may still apply it): the
    # reservation is held for api.inDoubtSeconds (short here), then released.
    cluster, service = await _faulty([gpu_node("n", gpus=1), pod("a", threads=60)], in_doubt_s=0.5)

    async def never_applied(**kwargs: Any) -> None:
        raise Unavailable("timed out")

    cluster.reads_fail = True
    cluster.bind = never_applied  # type: ignore[method-assign]
    with pytest.raises(BindError):
        await service.bind(name="a", namespace="default", uid="uid-default-a", node="n")
    assert service.state.ledger.state("uid-default-a") == "in_doubt"
    cluster.reads_fail = False
    for _ in range(100):
        if service.state.ledger.allocation("uid-default-a") is None:
            break
        await asyncio.sleep(0.05)
    assert service.state.ledger.allocation("uid-default-a") is None
    await service.close()


async def test_listener_changes_are_reported_as_needing_a_restart(svc: ExtenderService) -> None:
    import dataclasses

    cfg = svc.config
    done = await svc.reconfigure(
        dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, port=9999))
    )
    assert done == Reconfigured(rebuilt=False, needs_restart=("server",))


async def test_api_changes_are_reported_as_needing_a_restart(svc: ExtenderService) -> None:
    """The API client's timeouts and the binder's settings are fixed when serve starts: a new
    api section is not applied by a reload, and says so instead of passing in silence."""
    import dataclasses

    cfg = svc.config
    done = await svc.reconfigure(
        dataclasses.replace(cfg, api=dataclasses.replace(cfg.api, bind_timeout_seconds=6.0))
    )
    assert done == Reconfigured(rebuilt=False, needs_restart=("api",))


async def test_a_forged_filter_changes_nothing_in_what_bind_writes(svc: ExtenderService) -> None:
    # Between the scheduler's filter and its bind, another client sends a /filter whose Pod
    # claims the same identity with 100 % threads and 30 GiB: bind decides from the pod as the
    # cluster has it (25 %), never from a request body.
    forged = _pod(svc, "p25")
    limits = forged["spec"]["containers"][0]["resources"]["limits"]
    limits.update({"mpsched.io/threads": "100", "mpsched.io/memory": "30Gi"})
    forged["metadata"]["resourceVersion"] = "999999"
    assert svc.filter(forged, ["a"]).passed == ["a"]
    alloc = await svc.bind(name="p25", namespace="default", uid="uid-default-p25", node="a")
    assert alloc is not None and alloc.threads == 25
    written = _pod(svc, "p25")["metadata"]["annotations"]["mpsched.io/threads.main"]
    assert written == "25"
