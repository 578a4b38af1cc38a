"""The ledger under random inventory changes with allocations running: GPUs reordered, removed,
added, a uuid kept at another index or a new uuid at an old index. Allocations count on their
GPU by uuid; the GPUs the ledger names over budget are exactly those an independent recount by
uuid finds; a node running a pod whose GPU its inventory does not show takes nothing new; and
no decision (fit, assume) ever adds to a GPU over budget or to such a node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing.errors import LedgerError
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, Misfit, allocate, fit_node
from extender.packing.ledger import Allocation, GpuRef, Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.policies import PolicySettings, make_policy
from extender.packing.results import make_demand
from extender.packing.settings import BudgetSettings
from extender.packing.workload import DEFAULT_WORKLOAD
from tests.packing.strategies import requests

NODES = ("n0", "n1")
#: Each node's GPUs come from a pool of uuids: an inventory is any ordered choice of them.
POOL = 6


def uuid(node: str, k: int) -> str:
    return f"GPU-{node}-u{k}"


@st.composite
def inventories(draw: st.DrawFn, node: str) -> NodeInventory:
    chosen = draw(st.lists(st.integers(0, POOL - 1), unique=True, max_size=4))
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=uuid(node, k),
            model="H100",
            memory_mib=draw(st.sampled_from([16160, 81559])),
            compute_capability=ComputeCapability(9, 0),
            max_clients=draw(st.sampled_from([4, 48])),
            units=4,
            mps=draw(st.sampled_from(["ready", "ready", "ready", "down"])),
        )
        for i, k in enumerate(chosen)
    )
    return NodeInventory(node, gpus, multi_user=draw(st.booleans()))


@st.composite
def running(draw: st.DrawFn, pod: str) -> Allocation:
    """An allocation the cluster shows: any GPU of the node's pool, named by any index (the
    index NVML gave it when the pod was placed)."""
    node = draw(st.sampled_from(NODES))
    ref = GpuRef(draw(st.integers(0, 3)), uuid(node, draw(st.integers(0, POOL - 1))))
    if draw(st.integers(0, 4)) == 0:
        return Allocation(pod, "ns", pod, node, "whole", (ref,))
    return Allocation(
        pod,
        "ns",
        pod,
        node,
        "share",
        (ref,),
        threads=draw(st.integers(1, 100)),
        memory_mib=draw(st.integers(0, 20000)),
        clients=draw(st.integers(1, 8)),
        run_as_user=draw(st.sampled_from([None, 1000, 2000])),
    )


def blocked_by_recount(ledger: Ledger, name: str) -> bool:
    """Whether a pod counted on `name` names a GPU the node's inventory does not show."""
    shown = {g.info.uuid for g in ledger.node(name).gpus}
    return any(
        a.node == name and any(r.uuid not in shown for r in a.gpus) for a in ledger.allocations()
    )


def over_by_recount(ledger: Ledger) -> set[tuple[str, str]]:
    """(node, uuid) of every GPU whose pods exceed a budget, recounted from the allocations by
    uuid alone (whatever index they name)."""
    over: set[tuple[str, str]] = set()
    for name in ledger.node_names():
        node = ledger.node(name)
        shown = {g.info.uuid for g in node.gpus}
        for g in node.gpus:
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
            clients = sum(a.clients for a in shares)
            users = [a.run_as_user for a in shares]
            isolated = ledger.budgets.uid_isolation and not node.inventory.multi_user
            if (
                len(wholes) > 1
                or (wholes and shares)
                or (
                    shares
                    and (
                        sum(a.threads for a in shares) > cap.threads
                        or clients > cap.clients
                        or sum(a.memory_mib for a in shares) + clients * cap.client_overhead_mib
                        > cap.memory_mib
                        or (isolated and (len(set(users)) > 1 or users.count(None) > 1))
                    )
                )
            ):
                over.add((name, g.info.uuid))
    return over


def check(ledger: Ledger) -> None:
    ledger.check_invariants()
    assert {(n, g.info.uuid) for n, g, _ in ledger.over_budget()} == over_by_recount(ledger)
    for name in ledger.node_names():
        assert bool(ledger.node(name).unplaced) == blocked_by_recount(ledger, name), name


operations = st.lists(
    st.tuples(
        st.sampled_from(["decide", "decide", "record", "record", "release", "reinventory"]),
        st.integers(0, 12),
        st.integers(0, 7),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), ops=operations, oversub=st.sampled_from([1.0, 1.5]))
def test_inventory_changes_keep_every_pod_on_its_gpu_by_uuid(
    data: st.DataObject, ops: list[tuple[str, int, int]], oversub: float
) -> None:
    budgets = BudgetSettings(oversubscription=oversub, client_overhead_mib=300)
    ledger = Ledger(budgets)
    for name in NODES:
        ledger.set_node(data.draw(inventories(name)))
    # The evaluator (filter's and bind's path, in C where compiled) decides as fit_node does.
    policy = make_policy("default", workload=DEFAULT_WORKLOAD, settings=PolicySettings())
    evaluator = Evaluator(ledger, budgets, policy, cpu_free=lambda _: 64000)
    for op, pod, choice in ops:
        uid = f"p{pod}"
        name = NODES[choice % len(NODES)]
        if op == "decide":
            blocked = blocked_by_recount(ledger, name)
            over = over_by_recount(ledger)
            request = data.draw(requests(uid))
            fit = fit_node(ledger.node(name), request, budgets)
            for node in NODES:
                evaluator.touch(node)
            entry = evaluator.entry(make_demand(request, 1000), name)
            assert entry is not None
            assert isinstance(entry[0], Fit) == isinstance(fit, Fit)
            if isinstance(fit, Fit) and isinstance(entry[0], Fit):
                # Nodes of equal state share one result (its node name is the first's).
                assert (entry[0].gpus, entry[0].demands) == (fit.gpus, fit.demands)
            if blocked:
                # No decision adds to a node whose pods the ledger cannot place.
                assert isinstance(fit, Misfit)
                if ledger.node(name).gpus:
                    assert "inventory does not show" in fit.reason
            if isinstance(fit, Fit) and fit.gpus and ledger.allocation(uid) is None:
                gpu = fit.gpus[choice % len(fit.gpus)]
                alloc = allocate(ledger.node(name), request, fit, gpu, budgets)
                ledger.assume(alloc)  # a fit is always assumable
                assert all((name, r.uuid) not in over for r in alloc.gpus)
                assert over_by_recount(ledger) <= over
            # A raw decision on any GPU of the pool, named by any index: refused, whole, where
            # the node is blocked, the GPU is over budget or it does not fit.
            raw = data.draw(running(uid + "x"))
            blocked = blocked_by_recount(ledger, raw.node)
            over = over_by_recount(ledger)
            before = ledger.allocation(raw.pod_uid)
            try:
                ledger.assume(raw)
            except LedgerError:
                assert ledger.allocation(raw.pod_uid) == before
            else:
                if before is None:
                    assert not blocked
                    assert all((raw.node, r.uuid) not in over for r in raw.gpus)
            assert over_by_recount(ledger) <= over
        elif op == "record":
            alloc = data.draw(running(uid + "r"))
            ledger.record(alloc)
            assert ledger.allocation(alloc.pod_uid) == alloc
        elif op == "release":
            ledger.release(uid + data.draw(st.sampled_from(["", "x", "r"])))
        else:
            counted = {a.pod_uid for a in ledger.allocations()}
            ledger.set_node(data.draw(inventories(name)))
            # Nothing that runs is dropped by an inventory change.
            assert {a.pod_uid for a in ledger.allocations()} == counted
        check(ledger)


def test_a_pod_keeps_its_gpu_when_the_indices_swap() -> None:
    ledger = Ledger(BudgetSettings())
    a, b = uuid("n0", 0), uuid("n0", 1)

    def gpu(index: int, uuid: str) -> GpuInfo:
        return GpuInfo(index, uuid, "H100", 81559, ComputeCapability(9, 0), 48, 4)

    ledger.set_node(NodeInventory("n0", (gpu(0, a), gpu(1, b))))
    ledger.assume(
        Allocation("p", "ns", "p", "n0", "share", (GpuRef(0, a),), 60, 1000, 1, run_as_user=1)
    )
    ledger.set_node(NodeInventory("n0", (gpu(0, b), gpu(1, a))))
    assert [g.threads for g in ledger.node("n0").gpus] == [0, 60]
    assert not ledger.node("n0").unplaced
    # GPU a gone, b renumbered to 0: the pod cannot be placed, and the node is blocked.
    ledger.set_node(NodeInventory("n0", (gpu(0, b),)))
    assert ledger.node("n0").unplaced == {"p"}
    ledger.release("p")
    assert not ledger.node("n0").unplaced
    ledger.check_invariants()


def test_a_stand_in_uuid_names_its_gpu_by_index() -> None:
    # A pod placed while the node was known from labels only holds a stand-in uuid and was
    # given its GPU by index (NVIDIA_VISIBLE_DEVICES=1); once the agent publishes NVML uuids,
    # it counts on the GPU of that index, and the node is not blocked.
    ledger = Ledger(BudgetSettings())
    nvml = tuple(
        GpuInfo(i, uuid("n0", i), "H100", 81559, ComputeCapability(9, 0), 48, 4) for i in (0, 1)
    )
    ledger.set_node(NodeInventory("n0", nvml))
    ref = GpuRef(1, "n0-gpu1")
    ledger.record(Allocation("p", "ns", "p", "n0", "share", (ref,), 60, 1000, 1, run_as_user=1))
    assert [g.threads for g in ledger.node("n0").gpus] == [0, 60]
    assert not ledger.node("n0").unplaced
    ledger.set_node(NodeInventory("n0", nvml[:1]))
    assert ledger.node("n0").unplaced == {"p"}
    ledger.release("p")
    ledger.check_invariants()
