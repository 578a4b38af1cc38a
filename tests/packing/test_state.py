"""The decision state follows what runs (truth rules 1, 2, 7 of docs/design.md), driven by watch
events as the cluster interface delivers them: a GPU whose MPS flaps keeps its shares, a lowered
budget counts what runs and refuses new work, an edited or removed allocation annotation changes
nothing and is reported, and a swap to a new state carries the reservations in flight."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pytest

from extender.packing.codec import (
    ALLOCATION_KEY,
    INVENTORY_KEY,
    allocation_annotations,
    decode_allocation_on,
)
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.policies import PolicySettings
from extender.packing.settings import BudgetSettings, NodeSelection
from extender.packing.state import DecisionState
from extender.packing.state_records import StateSettings
from tests.http.kube_objects import gpu_node, pod

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    kind: str
    obj: Json


def settings(**budgets: Any) -> StateSettings:
    return StateSettings(
        budgets=BudgetSettings(**budgets), selection=NodeSelection(), policy=PolicySettings()
    )


def node_event(node: Json, type_: str = "ADDED") -> Event:
    return Event(type_, "Node", node)


def pod_event(p: Json, type_: str = "ADDED") -> Event:
    return Event(type_, "Pod", p)


def with_mps(node: Json, mps: str) -> Json:
    node = json.loads(json.dumps(node))
    inventory = json.loads(node["metadata"]["annotations"][INVENTORY_KEY])
    for g in inventory:
        g["mps"] = mps
    node["metadata"]["annotations"][INVENTORY_KEY] = json.dumps(inventory)
    return node


def reserve(state: DecisionState, p: Json, node: str) -> Allocation:
    parsed = state.parser.parse(p)
    assert parsed.demand is not None
    alloc = state.reserve(parsed.demand, node)
    assert isinstance(alloc, Allocation), alloc
    return alloc


def bound(p: Json, alloc: Allocation) -> Json:
    """The pod as the API server has it after mpsched's Binding."""
    p = json.loads(json.dumps(p))
    p["spec"]["nodeName"] = alloc.node
    p["metadata"]["annotations"].update(allocation_annotations(alloc))
    return p


def threads_on(state: DecisionState, node: str, gpu: int = 0) -> int:
    return state.ledger.node(node).gpus[gpu].threads


def placed(state: DecisionState, p: Json, node: str) -> bool:
    parsed = state.parser.parse(p)
    assert parsed.demand is not None
    state.evaluator.refresh()
    return node in state.evaluator.sweep(parsed.demand, [node]).passed


def test_mps_flap_keeps_the_shares_that_run_and_places_nothing_on_top() -> None:
    state = DecisionState(settings())
    node = gpu_node("a", gpus=1)
    state.apply(node_event(node))
    first = pod("first", threads=100)
    state.apply(pod_event(first))
    alloc = reserve(state, first, "a")
    state.apply(pod_event(bound(first, alloc), "MODIFIED"))
    assert state.ledger.state(alloc.pod_uid) == "confirmed"
    # The agent republishes the node: MPS down, then up again.
    down = state.apply(node_event(with_mps(node, "down"), "MODIFIED"))
    assert "a" in down.touched
    assert state.ledger.allocation(alloc.pod_uid) == alloc
    state.apply(node_event(with_mps(node, "ready"), "MODIFIED"))
    assert threads_on(state, "a") == 100
    second = pod("second", threads=100)
    state.apply(pod_event(second))
    assert not placed(state, second, "a")
    assert isinstance(state.reserve(state.parser.parse(second).demand, "a"), str)  # type: ignore[arg-type]


def test_a_lowered_budget_counts_what_runs_and_refuses_new_work() -> None:
    high = DecisionState(settings(oversubscription=2.0))
    node = gpu_node("a", gpus=1)
    high.apply(node_event(node))
    objects = [node]
    for i in range(2):
        p = pod(f"p{i}", threads=90, memory="1Gi")
        high.apply(pod_event(p))
        objects.append(bound(p, reserve(high, p, "a")))
    assert threads_on(high, "a") == 180
    # The configuration is lowered to 1.0: a new state is built from the same cluster.
    low = DecisionState(settings(oversubscription=1.0))
    notices = []
    for obj in objects:
        notices += low.apply(Event("ADDED", obj["kind"], obj)).notices
    assert threads_on(low, "a") == 180  # both pods run: both count
    assert [(n, g.info.index) for n, g, _ in low.over_budget()] == [("a", 0)]
    assert [n.kind for n in notices] == ["over_budget"]
    third = pod("third", threads=1)
    low.apply(pod_event(third))
    assert not placed(low, third, "a")


def test_an_edited_or_removed_allocation_changes_nothing_and_is_reported() -> None:
    state = DecisionState(settings())
    state.apply(node_event(gpu_node("a", gpus=1)))
    p = pod("p", threads=40)
    state.apply(pod_event(p))
    alloc = reserve(state, p, "a")
    seen = bound(p, alloc)
    state.apply(pod_event(seen, "MODIFIED"))
    edited = json.loads(json.dumps(seen))
    forged = dataclasses.replace(alloc, threads=1, memory_mib=1)
    edited["metadata"]["annotations"][ALLOCATION_KEY] = allocation_annotations(forged)[
        ALLOCATION_KEY
    ]
    out = state.apply(pod_event(edited, "MODIFIED"))
    assert [n.kind for n in out.notices] == ["allocation_changed"]
    assert state.ledger.allocation(alloc.pod_uid) == alloc
    assert threads_on(state, "a") == 40
    # The same edit again is not reported twice (a status update carries it on).
    assert state.apply(pod_event(edited, "MODIFIED")).notices == []
    removed = json.loads(json.dumps(seen))
    del removed["metadata"]["annotations"][ALLOCATION_KEY]
    out = state.apply(pod_event(removed, "MODIFIED"))
    assert [n.kind for n in out.notices] == ["allocation_changed"]
    assert threads_on(state, "a") == 40
    # It ends with the pod.
    state.apply(pod_event(removed, "DELETED"))
    assert state.ledger.allocation(alloc.pod_uid) is None
    assert threads_on(state, "a") == 0


def test_a_pod_bound_with_an_unreadable_allocation_is_reported() -> None:
    state = DecisionState(settings())
    state.apply(node_event(gpu_node("a", gpus=1)))
    p = pod("p", threads=40, node="a", annotations={ALLOCATION_KEY: "{not json"})
    out = state.apply(pod_event(p))
    assert [n.kind for n in out.notices] == ["allocation_unreadable"]


def test_a_node_that_leaves_keeps_its_pods_counted_until_it_returns() -> None:
    state = DecisionState(settings())
    node = gpu_node("a", gpus=1)
    state.apply(node_event(node))
    p = pod("p", threads=70)
    state.apply(pod_event(p))
    alloc = reserve(state, p, "a")
    state.apply(pod_event(bound(p, alloc), "MODIFIED"))
    state.apply(node_event(node, "DELETED"))
    assert state.ledger.allocation(alloc.pod_uid) == alloc
    state.apply(node_event(node))
    assert threads_on(state, "a") == 70


def test_a_swap_carries_reservations_in_flight_but_not_pods_that_ended() -> None:
    old = DecisionState(settings())
    node = gpu_node("a", gpus=1)
    old.apply(node_event(node))
    flying, gone = pod("flying", threads=60), pod("gone", threads=30)
    old.apply(pod_event(flying))
    old.apply(pod_event(gone))
    in_flight = reserve(old, flying, "a")  # its Binding is on its way
    ended = reserve(old, gone, "a")
    # The new state is built from a list taken before either bind landed, and its own
    # watch has already delivered the deletion of `gone` (the old one lags).
    new = DecisionState(settings(oversubscription=1.0))
    for obj in (node, flying, gone):
        new.apply(Event("ADDED", obj["kind"], obj))
    new.apply(pod_event(gone, "DELETED"))
    new.carry_allocations(old)
    assert new.ledger.allocation(in_flight.pod_uid) == in_flight
    assert new.ledger.state(in_flight.pod_uid) == "assumed"
    assert new.ledger.allocation(ended.pod_uid) is None
    assert threads_on(new, "a") == 60
    other = pod("other", threads=60)
    new.apply(pod_event(other))
    assert not placed(new, other, "a")
    # The bind lands: the new state's own watch confirms what it carried.
    new.apply(pod_event(bound(flying, in_flight), "MODIFIED"))
    assert new.ledger.state(in_flight.pod_uid) == "confirmed"
    assert threads_on(new, "a") == 60


def test_bind_decides_from_the_pending_pod_the_watch_delivered() -> None:
    state = DecisionState(settings())
    state.apply(node_event(gpu_node("a", gpus=1)))
    p = pod("p", threads=10)
    state.apply(pod_event(p))
    record = state.pending("uid-default-p")
    assert record is not None and record.parsed is not None and record.parsed.demand is not None
    assert record.parsed.demand.request.containers[0].threads == 10
    state.apply(pod_event(bound(p, reserve(state, p, "a")), "MODIFIED"))
    assert state.pending("uid-default-p") is None


def test_device_plugin_pods_take_the_node_out_of_mpsched_budgets() -> None:
    state = DecisionState(settings())
    state.apply(node_event(gpu_node("a", gpus=4)))
    plugin = pod("cuda", node="a", phase="Running")
    plugin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    state.apply(pod_event(plugin))
    assert state.ledger.node("a").held_elsewhere == 2
    share = pod("share", threads=10)
    state.apply(pod_event(share))
    parsed = state.parser.parse(share)
    assert parsed.demand is not None
    reason = state.reserve(parsed.demand, "a")
    assert isinstance(reason, str) and "device plugin" in reason
    # The node is known again once the device-plugin pod ends, whichever event says so.
    state.apply(pod_event(plugin, "DELETED"))
    assert state.ledger.node("a").held_elsewhere == 0
    assert placed(state, share, "a")


def test_device_plugin_pods_listed_before_their_node_still_count() -> None:
    state = DecisionState(settings())
    plugin = pod("cuda", node="a", phase="Running")
    plugin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    state.apply(pod_event(plugin))
    state.apply(node_event(gpu_node("a", gpus=2)))
    assert state.ledger.node("a").held_elsewhere == 1


def test_the_policy_follows_the_clusters_node_types_not_every_node() -> None:
    state = DecisionState(settings())
    assert state.use_workload(None) is False  # no nodes yet: the policy in force stays
    for i in range(60):
        state.apply(node_event(gpu_node(f"a{i}", gpus=2, model="A100", cpu="64")))
    # The default workload still, but node types are now known: the policy is rebuilt.
    assert state.use_workload(None) is True
    assert [(t.model, t.gpus, t.cpu_milli, t.count) for t in state.types] == [
        ("A100", 2, 64_000, 60)
    ]
    # One node more of the same type: under the tolerance, the score caches stay.
    state.apply(node_event(gpu_node("a60", gpus=2, model="A100", cpu="64")))
    assert state.use_workload(None) is False
    # A new node type: the policy is rebuilt with it.
    state.apply(node_event(gpu_node("t0", gpus=1, model="T4", cpu="8")))
    assert state.use_workload(None) is True
    assert {(t.model, t.gpus) for t in state.types} == {("A100", 2), ("T4", 1)}


def test_a_pod_bound_with_the_text_its_bind_wrote_is_confirmed_without_decoding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch's first sight of a bound pod decodes its allocation annotation, unless it is
    byte for byte the one this state's bind wrote for the reservation; a pod whose annotation
    is another by then is decoded and counted as it says."""
    import extender.packing.state as state_module

    decoded: list[str] = []

    def counting(text: str, **kwargs: Any) -> Allocation | str:
        decoded.append(text)
        return decode_allocation_on(text, **kwargs)

    monkeypatch.setattr(state_module, "decode_allocation_on", counting)
    state = DecisionState(settings())
    state.apply(node_event(gpu_node("a", gpus=2)))
    p, q = pod("p", threads=10), pod("q", threads=20)
    for x in (p, q):
        state.apply(pod_event(x))
    mine = reserve(state, p, "a")
    written = json.loads(json.dumps(p))
    written["spec"]["nodeName"] = "a"
    written["metadata"]["annotations"].update(state.annotations(mine))
    state.apply(pod_event(written, "MODIFIED"))
    assert decoded == []
    assert state.ledger.state(mine.pod_uid) == "confirmed"
    assert state.ledger.allocation(mine.pod_uid) == mine
    # q: reserved on one GPU, but it shows up with a share of the other written on it.
    held = reserve(state, q, "a")
    state.annotations(held)
    info = state.ledger.node("a").gpus[1 - held.gpus[0].index].info
    other = dataclasses.replace(held, gpus=(GpuRef(info.index, info.uuid),))
    state.apply(pod_event(bound(q, other), "MODIFIED"))
    assert len(decoded) == 1
    assert state.ledger.allocation(held.pod_uid) == other
    assert state.ledger.state(held.pod_uid) == "confirmed"


def test_the_learned_workload_keeps_every_shape_for_the_pinned_loads() -> None:
    # 19 pods of one shape and one of another: the typical cut (95 %) keeps the first only;
    # the pinned loads are computed from both (`Learned.demand`).
    state = DecisionState(settings())
    for i in range(20):
        state.apply(pod_event(pod(f"p{i}", threads=10 if i else 30)))
    learned = state.learn_workload()
    assert learned is not None
    assert [tp.shape.threads for tp in learned.typical] == [10]
    assert sorted(tp.shape.threads for tp in learned.demand) == [10, 30]
    state.apply(node_event(gpu_node("a", gpus=2)))
    assert state.use_workload(learned) is True
    assert state.demand == learned.demand
