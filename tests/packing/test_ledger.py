"""The ledger's decisions never let a GPU exceed a budget, whatever sequence of assume / confirm /
release / inventory change / record it sees; only what runs (recorded, or kept through an
inventory change) can exceed one, and the GPUs over budget are exactly those an independent
recount finds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing.errors import BudgetExceeded, LedgerError, UnknownNode
from extender.packing.fit import Fit, allocate, fit_node
from extender.packing.ledger import Allocation, GpuRef, Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.settings import BudgetSettings
from tests.packing.strategies import nodes, requests


def h100(index: int, node: str = "n0") -> GpuInfo:
    return GpuInfo(index, f"GPU-{node}-{index}", "H100", 81559, ComputeCapability(9, 0), 48, 4)


def share(
    uid: str,
    threads: int,
    memory: int = 1000,
    clients: int = 1,
    *,
    gpu: int = 0,
    run_as: int | None = 1000,
    node: str = "n0",
) -> Allocation:
    return Allocation(
        uid,
        "ns",
        uid,
        node,
        "share",
        (GpuRef(gpu, f"GPU-{node}-{gpu}"),),
        threads,
        memory,
        clients,
        run_as_user=run_as,
    )


def whole(uid: str, *, gpu: int, node: str = "n0") -> Allocation:
    return Allocation(uid, "ns", uid, node, "whole", (GpuRef(gpu, f"GPU-{node}-{gpu}"),))


def make_ledger(**budget: object) -> Ledger:
    ledger = Ledger(BudgetSettings(**budget))  # type: ignore[arg-type]
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    return ledger


def test_threads_budget_is_enforced_per_gpu() -> None:
    ledger = make_ledger()
    ledger.assume(share("a", 60))
    with pytest.raises(BudgetExceeded, match="threads"):
        ledger.assume(share("b", 41))
    ledger.assume(share("b", 40))
    ledger.assume(share("c", 60, gpu=1))  # the other GPU has its own budget
    ledger.check_invariants()


def test_oversubscription_raises_the_thread_budget() -> None:
    ledger = make_ledger(oversubscription=1.5)
    ledger.assume(share("a", 100))
    ledger.assume(share("b", 50))
    with pytest.raises(BudgetExceeded):
        ledger.assume(share("c", 1))


def test_memory_budget_counts_reserve_and_client_overhead() -> None:
    ledger = make_ledger(memory_reserve_mib=559, client_overhead_mib=100)
    # capacity 81559 - 559 = 81000; one client costs 100 on top of its pinned memory
    ledger.assume(share("a", 10, memory=80900, clients=1))
    with pytest.raises(BudgetExceeded, match="memory"):
        ledger.assume(share("b", 10, memory=0, clients=1))


def test_client_budget_is_the_architecture_limit() -> None:
    ledger = make_ledger()
    for i in range(48):
        ledger.assume(share(f"p{i}", 1, memory=1, clients=1))
    with pytest.raises(BudgetExceeded, match="clients"):
        ledger.assume(share("one-more", 1, memory=1, clients=1))


def test_uid_isolation_keeps_one_uid_per_gpu_unless_multi_user() -> None:
    ledger = make_ledger()
    ledger.assume(share("a", 10, run_as=1000))
    with pytest.raises(BudgetExceeded, match="UID"):
        ledger.assume(share("b", 10, run_as=2000))
    ledger.release("a")
    ledger.assume(share("b", 10, run_as=2000))
    multi = Ledger(BudgetSettings())
    multi.set_node(NodeInventory("n0", (h100(0),), multi_user=True))
    multi.assume(share("a", 10, run_as=1000))
    multi.assume(share("b", 10, run_as=2000))
    multi.check_invariants()


def test_whole_and_shared_exclude_each_other() -> None:
    ledger = make_ledger()
    whole = Allocation("w", "ns", "w", "n0", "whole", (GpuRef(0, "GPU-n0-0"),))
    ledger.assume(whole)
    with pytest.raises(BudgetExceeded, match="whole"):
        ledger.assume(share("s", 10))
    ledger.assume(share("s", 10, gpu=1))
    with pytest.raises(BudgetExceeded, match="not idle"):
        ledger.assume(Allocation("w2", "ns", "w2", "n0", "whole", (GpuRef(1, "GPU-n0-1"),)))


def test_pre_volta_takes_only_whole_gpus_by_default() -> None:
    p100 = GpuInfo(0, "GPU-n0-0", "P100", 16280, ComputeCapability(6, 0), 16, 4)
    ledger = Ledger(BudgetSettings())
    ledger.set_node(NodeInventory("n0", (p100,)))
    with pytest.raises(BudgetExceeded, match="no shares"):
        ledger.assume(share("s", 10))
    sharing = Ledger(BudgetSettings(pre_volta="share"))
    sharing.set_node(NodeInventory("n0", (p100,)))
    sharing.assume(share("s", 10))
    assert sharing.node("n0").gpus[0].capacity.clients == 16


def test_a_mig_gpu_takes_no_shares_but_can_be_given_out_whole() -> None:
    ledger = Ledger(BudgetSettings())
    ledger.set_node(NodeInventory("n0", (replace(h100(0), mig=True), h100(1))))
    with pytest.raises(BudgetExceeded, match="MIG is enabled"):
        ledger.assume(share("s", 10))
    ledger.assume(share("t", 10, gpu=1))
    ledger.assume(whole("w", gpu=0))
    assert ledger.node("n0").gpus[0].owner == "w"


def test_assume_is_idempotent_and_refuses_a_second_different_allocation() -> None:
    ledger = make_ledger()
    ledger.assume(share("a", 30))
    ledger.assume(share("a", 30))
    assert ledger.node("n0").gpus[0].threads == 30
    with pytest.raises(LedgerError, match="already holds"):
        ledger.assume(share("a", 30, gpu=1))
    assert ledger.state("a") == "assumed"
    ledger.confirm("a")
    assert ledger.state("a") == "confirmed"


def test_unknown_node_gpu_and_pod() -> None:
    ledger = make_ledger()
    with pytest.raises(UnknownNode):
        ledger.assume(share("a", 10, node="nope"))
    with pytest.raises(LedgerError, match="no GPU"):
        ledger.assume(replace(share("a", 10), gpus=(GpuRef(0, "GPU-other"),)))
    with pytest.raises(LedgerError):
        ledger.confirm("never-seen")
    assert ledger.release("never-seen") is None


def test_inventory_change_keeps_every_allocation_and_counts_it_over_budget() -> None:
    ledger = make_ledger()
    ledger.assume(share("a", 30, gpu=0))
    ledger.assume(share("b", 30, gpu=1))
    generation = ledger.node("n0").generation
    unplaced = ledger.set_node(NodeInventory("n0", (h100(0),)))
    # GPU 1 left the inventory: b still runs, so it stays counted, unplaced.
    assert [a.pod_uid for a in unplaced] == ["b"]
    assert ledger.allocation("a") is not None and ledger.allocation("b") is not None
    assert [a.pod_uid for a in ledger.unplaced()] == ["b"]
    assert ledger.node("n0").generation > generation
    ledger.check_invariants()
    # GPU 1 returns: b loads it again, as it is.
    assert ledger.set_node(NodeInventory("n0", (h100(0), h100(1)))) == []
    assert ledger.node("n0").gpus[1].threads == 30
    gone = ledger.remove_node("n0")
    assert sorted(a.pod_uid for a in gone) == ["a", "b"]
    assert ledger.allocation("a") is not None
    ledger.check_invariants()


def test_mps_down_keeps_shares_counted_and_the_gpu_takes_nothing_new() -> None:
    ledger = make_ledger()
    ledger.assume(share("a", 60, gpu=0))
    down = replace(h100(0), mps="down")
    ledger.set_node(NodeInventory("n0", (down, h100(1))))
    assert ledger.node("n0").gpus[0].threads == 60
    assert [(n, g.info.index) for n, g, _ in ledger.over_budget()] == [("n0", 0)]
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    assert ledger.node("n0").gpus[0].threads == 60
    with pytest.raises(BudgetExceeded):
        ledger.assume(share("b", 60, gpu=0))
    assert list(ledger.over_budget()) == []


def test_recorded_allocations_count_over_budget_and_block_new_ones() -> None:
    ledger = make_ledger()
    ledger.record(share("a", 80, gpu=0))
    ledger.record(share("b", 80, gpu=0))
    g = ledger.node("n0").gpus[0]
    assert g.threads == 160
    [(node, gpu, why)] = list(ledger.over_budget())
    assert (node, gpu.info.index) == ("n0", 0) and "160%" in why
    with pytest.raises(BudgetExceeded):
        ledger.assume(share("c", 1, gpu=0))
    ledger.record(whole("w1", gpu=1))
    ledger.record(whole("w2", gpu=1))
    assert "whole to 2 pods" in {i.info.index: w for _, i, w in ledger.over_budget()}[1]
    ledger.release("w1")
    assert ledger.node("n0").gpus[1].owner == "w2"
    ledger.release("b")
    assert [gpu.info.index for _, gpu, _ in ledger.over_budget()] == []
    ledger.check_invariants()


def test_a_recorded_allocation_on_an_unknown_node_waits_for_it() -> None:
    ledger = Ledger(BudgetSettings())
    assert ledger.record(share("a", 30, node="later")) is False
    assert [a.pod_uid for a in ledger.unplaced()] == ["a"]
    ledger.set_node(NodeInventory("later", (h100(0, "later"),)))
    assert ledger.node("later").gpus[0].threads == 30
    ledger.check_invariants()


def recount_ok(ledger: Ledger) -> None:
    """Independent of the ledger's own bookkeeping: recount each GPU from the allocations, and
    check that the GPUs over a budget are exactly those the ledger names."""
    reported = {(n, g.info.index) for n, g, _ in ledger.over_budget()}
    for name in ledger.node_names():
        node = ledger.node(name)
        for g in node.gpus:
            # An allocation loads this GPU when it names its uuid (whatever index it names);
            # one naming a GPU the inventory no longer shows is counted, unplaced, on no GPU.
            shown = {gpu.info.uuid for gpu in node.gpus}
            mine = [
                a
                for a in ledger.allocations()
                if a.node == name
                and any(r.uuid == g.info.uuid for r in a.gpus)
                and all(r.uuid in shown for r in a.gpus)
            ]
            shares = [a for a in mine if a.kind == "share"]
            wholes = [a for a in mine if a.kind == "whole"]
            cap = g.capacity
            pinned = sum(a.memory_mib for a in shares)
            clients = sum(a.clients for a in shares)
            over = (
                len(wholes) > 1
                or bool(wholes and shares)
                or (
                    bool(shares)
                    and (
                        sum(a.threads for a in shares) > cap.threads
                        or clients > cap.clients
                        or pinned + clients * cap.client_overhead_mib > cap.memory_mib
                        or (
                            ledger.budgets.uid_isolation
                            and not node.inventory.multi_user
                            and (
                                len({a.run_as_user for a in shares}) > 1
                                or sum(a.run_as_user is None for a in shares) > 1
                            )
                        )
                    )
                )
            )
            assert over == ((name, g.info.index) in reported), (name, g.info.index)


operations = st.lists(
    st.tuples(
        st.sampled_from(["place", "release", "confirm", "reinventory", "record"]),
        st.integers(0, 30),
        st.integers(0, 7),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    ops=operations,
    oversub=st.sampled_from([1.0, 1.5]),
    overhead=st.sampled_from([0, 300]),
)
def test_only_what_runs_can_exceed_a_budget(
    data: st.DataObject, ops: list[tuple[str, int, int]], oversub: float, overhead: int
) -> None:
    budgets = BudgetSettings(
        oversubscription=oversub,
        client_overhead_mib=overhead,
        memory_reserve_mib=200,
        pre_volta="share",
    )
    ledger = Ledger(budgets)
    ledger.set_node(data.draw(nodes("n0")))
    for op, pod, choice in ops:
        uid = f"p{pod}"
        if op == "place":
            request = data.draw(requests(uid))
            result = fit_node(ledger.node("n0"), request, budgets)
            if isinstance(result, Fit) and result.gpus:
                gpu = result.gpus[choice % len(result.gpus)]
                alloc = allocate(ledger.node("n0"), request, result, gpu, budgets)
                if ledger.allocation(uid) is None:
                    ledger.assume(alloc)  # a fit must always be assumable
            # Raw assumes that may break a budget must be refused, never half-applied.
            raw = share(
                uid + "x",
                data.draw(st.integers(0, 120)),
                data.draw(st.integers(0, 90000)),
                data.draw(st.integers(0, 50)),
                gpu=choice % 3,
                run_as=data.draw(st.sampled_from([None, 1000])),
            )
            before = ledger.allocation(raw.pod_uid)
            over_before = {(n, g.info.index) for n, g, _ in ledger.over_budget()}
            try:
                ledger.assume(raw)
            except LedgerError:
                assert ledger.allocation(raw.pod_uid) == before
            # A decision never puts a GPU over budget, nor adds to one that is.
            assert {(n, g.info.index) for n, g, _ in ledger.over_budget()} <= over_before
            if ledger.allocation(raw.pod_uid) != before:
                assert ("n0", raw.gpus[0].index) not in over_before
        elif op == "release":
            ledger.release(uid)
        elif op == "confirm" and ledger.allocation(uid) is not None:
            ledger.confirm(uid)
        elif op == "reinventory":
            counted = {a.pod_uid for a in ledger.allocations()}
            ledger.set_node(data.draw(nodes("n0")))
            # Nothing that runs is dropped by an inventory change.
            assert {a.pod_uid for a in ledger.allocations()} == counted
        elif op == "record":
            raw = share(
                uid + "r",
                data.draw(st.integers(0, 120)),
                data.draw(st.integers(0, 90000)),
                data.draw(st.integers(0, 50)),
                gpu=choice % 3,
                run_as=data.draw(st.sampled_from([None, 1000])),
            )
            ledger.record(raw)
            assert ledger.allocation(raw.pod_uid) == raw
        ledger.check_invariants()
        recount_ok(ledger)
