"""The compiled build's C extension (`extender/packing/_native.c`) decides as the Python code
does: the share fit over packed node records gives fit_node's Fit on every node state, over
budget and mixed UIDs included; a plan refuses tables it cannot hold with an error naming the
problem; the min-max scaling of scores is Python's to the bit, and the gathers by state id are
itemgetter's. (Its FGD score is held to the published reference, bit for bit, by
test_policies.py, which takes the C plan wherever the extension is installed.)

Skipped where the extension is not installed (the pure build); tests/test_native_build.py
compiles it and runs this file against it, and the compiled build's test runs it there."""

from __future__ import annotations

import dataclasses
import math
from array import array
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from extender.packing import native
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, fit_node
from extender.packing.ledger import Allocation, GpuRef, GpuUsage, Ledger, share_cause
from extender.packing.model import NodeInventory
from extender.packing.policies import Policy
from extender.packing.policies.base import NodeState, PodShape, TypicalPod
from extender.packing.policies.bestfit import BestFitPolicy
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.policies.frag import Fragmentation
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.results import make_demand
from extender.packing.settings import BudgetSettings
from extender.packing.state_index import GPU_FIELDS, StateIndex
from extender.service.answers import MAX_SCORE, scale, scale_in_python
from tests.packing.strategies import nodes, requests
from tests.packing.test_fit import BUDGET_CHOICES
from tests.packing.test_ledger import h100, share

pytestmark = pytest.mark.skipif(
    native.FIT_SHARE is None or native.PLAN is None,
    reason="the C extension is not installed (pure build); tests/test_native_build.py builds it",
)


def known(evaluator: Evaluator, names: list[str]) -> Evaluator:
    """`evaluator` with the ledger's nodes `names` read in (as the service's watch makes it)."""
    for name in names:
        evaluator.touch(name)
    evaluator.refresh()
    return evaluator


WORKLOAD = (TypicalPod(PodShape(4000, 30, 1), 0.6), TypicalPod(PodShape(8000, 100, 1), 0.4))


@st.composite
def running(draw: st.DrawFn, ledger: Ledger, name: str, count: int) -> None:
    """Record `count` allocations on node `name` as the cluster shows them: whatever the budgets
    say (over budget, several UIDs on one MPS server, whole and shared at once)."""
    node = ledger.node(name)
    if not node.gpus:
        return
    for i in range(count):
        g = node.gpus[draw(st.integers(0, len(node.gpus) - 1))].info
        ref = (GpuRef(g.index, g.uuid),)
        if draw(st.integers(0, 5)) == 0:
            alloc = Allocation(f"{name}-w{i}", "ns", f"{name}-w{i}", name, "whole", ref)
        else:
            alloc = Allocation(
                f"{name}-s{i}",
                "ns",
                f"{name}-s{i}",
                name,
                "share",
                ref,
                threads=draw(st.integers(0, 120)),
                memory_mib=draw(st.integers(0, 90000)),
                clients=draw(st.integers(0, 50)),
                run_as_user=draw(st.sampled_from([None, 1000, 2000, 2**40])),
            )
        ledger.record(alloc)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(data=st.data(), budgets=BUDGET_CHOICES, isolation=st.booleans())
def test_the_c_fit_is_fit_node(
    data: st.DataObject, budgets: BudgetSettings, isolation: bool
) -> None:
    ledger = Ledger(budgets)
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 4)))]
    for name in names:
        ledger.set_node(data.draw(nodes(name, max_gpus=8)))
        data.draw(running(ledger, name, data.draw(st.integers(0, 12))))
        ledger.hold_elsewhere(name, data.draw(st.sampled_from([0, 0, 0, 1])))
    # The fit reads UID isolation from the evaluator's budgets, the capacities from the ledger's.
    checked = dataclasses.replace(budgets, uid_isolation=isolation)
    evaluator = Evaluator(ledger, checked, FgdPolicy(WORKLOAD), cpu_free=lambda _: 64000)
    for name in names:
        evaluator.touch(name)
    evaluator.refresh()
    for k in range(data.draw(st.integers(1, 3))):
        request = data.draw(requests(f"probe{k}"))
        demand = make_demand(request, 1000)
        for name in data.draw(st.permutations(names)):
            entry = evaluator.entry(demand, name)
            assert entry is not None
            fit = entry[0]
            # A result is kept per node state: it names the first node seen in that state.
            assert dataclasses.replace(fit, node=name) == fit_node(
                ledger.node(name), request, checked
            )


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    data=st.data(),
    budgets=BUDGET_CHOICES,
    policy=st.sampled_from(
        [
            FgdPolicy(WORKLOAD, name="default", lookahead=0.3, mix=True),
            FgdPolicy(WORKLOAD),
            BestFitPolicy(),
        ]
    ),
)
def test_the_c_fill_decides_as_the_python_fill(
    data: st.DataObject, budgets: BudgetSettings, policy: Policy
) -> None:
    """A sweep and a bind's entry give the same answers, scores and GPUs with the C fit and
    score (one call per node for FGD's descent, the fit alone for another policy) as in
    Python."""
    ledger = Ledger(budgets)
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 5)))]
    cpu = {name: data.draw(st.integers(0, 200_000)) for name in names}
    for name in names:
        ledger.set_node(data.draw(nodes(name, max_gpus=8)))
        data.draw(running(ledger, name, data.draw(st.integers(0, 10))))
    evaluators = [
        known(Evaluator(ledger, budgets, policy, cpu_free=cpu.__getitem__, native=native), names)
        for native in (True, False)
    ]
    for k in range(data.draw(st.integers(1, 3))):
        demand = make_demand(data.draw(requests(f"probe{k}")), data.draw(st.integers(0, 64000)))
        order = data.draw(st.permutations(names))
        fast, slow = (e.sweep(demand, order) for e in evaluators)
        assert not fast.unknown
        assert (fast.passed, fast.scores) == (slow.passed, slow.scores)
        assert (fast.failed, fast.unresolvable) == (slow.failed, slow.unresolvable)
        for name in order:
            assert evaluators[0].entry(demand, name) == evaluators[1].entry(demand, name)


def test_a_share_of_a_whole_gpu_goes_to_the_tightest_candidate() -> None:
    # FGD's descent names no GPU for a 100 % share (it scores it as a whole GPU): the fill
    # then takes the tightest candidate. With oversubscription a GPU that holds a share can
    # take one: GPU 0 (a 60 % share) is tighter than the idle GPU 1.
    budgets = BudgetSettings(oversubscription=2.0)
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    ledger.assume(share("a", 60, 1000, 1, gpu=0))
    request = ShareRequest(
        "ns",
        "p",
        "p",
        "share",
        containers=(ContainerAsk("c", threads=100, memory_mib=1000),),
        run_as_user=1000,
    )
    demand = make_demand(request, 1000)
    policy = FgdPolicy(WORKLOAD, name="default", lookahead=0.3, mix=True)
    for native_fill in (True, False):
        evaluator = Evaluator(ledger, budgets, policy, cpu_free=lambda _: 64000, native=native_fill)
        entry = evaluator.entry(demand, "n0")
        assert entry is not None
        fit, _, gpu = entry
        assert isinstance(fit, Fit) and fit.gpus == (0, 1)
        assert gpu == 0


def test_a_record_holds_what_the_fit_reads() -> None:
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    ledger.assume(share("a", 30, 2000, 2, gpu=1, run_as=1000))
    evaluator = Evaluator(ledger, budgets, FgdPolicy(WORKLOAD), cpu_free=lambda _: 1000)
    record = evaluator.fit_record(ledger.node("n0"))
    assert record is not None
    words = memoryview(record).cast("q").tolist()
    # A header (GPUs, multi-user), then per GPU its figures: index, shape, the capacity's
    # threads, memory, clients and client overhead, the usage's threads, memory and clients,
    # given out whole, the UIDs' kind and the one UID, idle, why it takes no shares.
    width = len(GPU_FIELDS)
    assert words[:2] == [2, 0] and len(words) == 2 + 2 * width
    cap = ledger.node("n0").gpus[1].capacity
    gpu1 = [1, 0, cap.threads, cap.memory_mib, cap.clients, cap.client_overhead_mib]
    assert words[2 + width :] == [*gpu1, 30, 2000, 2, 0, 2, 1000, 0, 0]
    # Nodes whose GPUs are held through the device plugin are left to the Python fit.
    ledger.hold_elsewhere("n0", 1)
    assert evaluator.fit_record(ledger.node("n0")) is None
    # So are nodes running a pod whose GPU their inventory does not show (by uuid).
    ledger.hold_elsewhere("n0", 0)
    ledger.record(share("b", 10, gpu=0, run_as=1000, node="n0"))
    assert evaluator.fit_record(ledger.node("n0")) is not None
    ledger.record(dataclasses.replace(share("c", 10, run_as=1000), gpus=(GpuRef(2, "GPU-gone"),)))
    assert ledger.node("n0").unplaced == {"c"}
    assert evaluator.fit_record(ledger.node("n0")) is None


def test_the_c_fit_refuses_what_is_not_a_record() -> None:
    assert native.FIT_SHARE is not None
    with pytest.raises(ValueError, match="not a fit record"):
        native.FIT_SHARE(b"\x01" * 8, b"", None, True)
    header = memoryview(bytearray(8 * (2 + len(GPU_FIELDS)))).cast("q")
    # One GPU of shape 5, with no demand for it.
    header[0], header[2 + GPU_FIELDS.index("shape")] = 1, 5
    with pytest.raises(ValueError, match="no demand for GPU shape 5"):
        native.FIT_SHARE(header.tobytes(), b"", None, True)


@pytest.mark.parametrize(
    ("groups", "left", "problem"),
    [
        (((0, (), 0.0),), (), "a group's size must be 1..100, got 0"),
        (((10, ((0, 1, True, 0.5),), 0.5),), (), "a task is"),
        (((10, ((0, 0, True, 0.5, 10),), 0.5),), (), "at least one GPU"),
        ((), (0.0,) * 3, "left and gaps must both have 101 items or none"),
    ],
)
def test_a_plan_refuses_bad_tables_by_name(
    groups: tuple[object, ...], left: tuple[float, ...], problem: str
) -> None:
    assert native.PLAN is not None
    with pytest.raises((ValueError, TypeError), match=problem):
        native.PLAN(0.0, groups, left, left, 0.3, False)  # type: ignore[arg-type]


@pytest.mark.parametrize("mix", [True, False])
def test_cpu_limits_divide_exactly_at_the_edges(mix: bool) -> None:
    # The C measure divides free CPU by a type's CPU through a multiplication; at exact
    # multiples, one off them, and past 2**53 it must still be Python's floor division.
    sizes = (1, 3, 7, 1000, 3152, 32000, 999_983)
    workload = tuple(TypicalPod(PodShape(c, 25 + i, 1), 0.1) for i, c in enumerate(sizes))
    frag = Fragmentation(workload, 0.3, mix=mix)
    plan = frag.native_plan("H100", 4)
    assert plan is not None
    free = (10, 40, 60, 100)
    cpus = {0, 1, 2**52 - 1, 2**52, 2**52 + 1, 2**53 + 7, 2**62 + 12345, 2**63 - 1}
    for c in sizes:
        for k in (1, 2, 3, 7, 31, 1000, 123_457):
            cpus.update((c * k - 1, c * k, c * k + 1))
    for cpu in sorted(cpus):
        assert plan.value(cpu, free) == frag._compute("H100", cpu, free), cpu


def test_a_workload_the_c_plan_cannot_hold_is_measured_in_python() -> None:
    # A CPU ask past 64 bits: the plan refuses it, and the policy scores in Python, as the
    # pure build does (same answer as with no C plan at all).
    workload = (TypicalPod(PodShape(2**70, 30, 1), 0.5), TypicalPod(PodShape(1000, 50, 1), 0.5))
    policy = FgdPolicy(workload, name="default", lookahead=0.3, mix=True)
    assert policy.native_plan("H100", 4) is None
    node = NodeState("H100", 64000, (100, 40, 70, 0))
    pod = PodShape(2000, 30, 1)
    plain = FgdPolicy(workload, name="default", lookahead=0.3, mix=True)
    plain.frag._native = None  # what the pure build has
    assert policy.score(node, pod, (0, 1, 2)) == plain.score(node, pod, (0, 1, 2))


@pytest.mark.parametrize(
    "ask",
    [
        {"threads": 20, "memory_mib": 2**70},  # a demand past 64 bits
        {"threads": 20, "memory_mib": 1000, "uid": 2**70},  # a UID past 64 bits
    ],
)
def test_figures_past_64_bits_are_fitted_in_python(ask: dict[str, int]) -> None:
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    ledger.assume(share("a", 30, 2000, 1, gpu=1))
    request = ShareRequest(
        "ns", "p", "p", "share",
        containers=(ContainerAsk("c", threads=ask["threads"], memory_mib=ask["memory_mib"]),),
        run_as_user=ask.get("uid"),
    )  # fmt: skip
    demand = make_demand(request, 1000)
    policy = FgdPolicy(WORKLOAD, name="default", lookahead=0.3, mix=True)
    sweeps = [
        known(Evaluator(ledger, budgets, policy, cpu_free=lambda _: 64000, native=n), ["n0"]).sweep(
            demand, ["n0"]
        )
        for n in (True, False)
    ]
    assert sweeps[0] == sweeps[1]
    # Read and fitted (a demand that large fits no GPU: a reason, not an error).
    assert not sweeps[0].unknown
    assert sweeps[0].passed == ([] if ask["memory_mib"] > 2**63 else ["n0"])


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    raw=st.lists(
        st.one_of(
            st.integers(0, 100).map(float),
            st.floats(-1e6, 1e6),
            st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=60,
    ),
    as_tuple=st.booleans(),
)
@example(raw=[0.0, -1.11e-308], as_tuple=True)  # a denormal apart
@example(raw=[5e-324, 0.0], as_tuple=False)
@example(raw=[-0.0, 0.0, 1.0], as_tuple=True)
@example(raw=[-1e308, 1e308], as_tuple=True)  # further apart than the largest double
@example(raw=[1.0, float("nan")], as_tuple=True)
@example(raw=[0.5, 1.5, 1.0], as_tuple=True)  # half rounds up
def test_the_c_scaling_is_pythons(raw: list[float], as_tuple: bool) -> None:
    assert native.SCALE is not None
    scores = tuple(raw) if as_tuple else raw
    scaled = native.SCALE(scores, MAX_SCORE)
    finite = all(math.isfinite(s) for s in raw)
    if not finite or (raw and not math.isfinite(max(raw) - min(raw))):
        assert scaled is None  # Python decides (or refuses) those
        return
    assert scaled == scale_in_python(raw)
    assert scale(scores) == scaled


def test_the_c_scaling_leaves_what_is_not_a_float_to_python() -> None:
    assert native.SCALE is not None
    assert native.SCALE((1, 2.0), MAX_SCORE) is None
    assert native.SCALE((True, 2.0), MAX_SCORE) is None
    assert scale((1, 3, 2)) == (0, 10, 5)
    assert native.SCALE((), MAX_SCORE) == ()
    with pytest.raises(TypeError, match="scale"):
        native.SCALE(iter([1.0]), MAX_SCORE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top"):
        native.SCALE((1.0,), -1)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(st.floats(allow_nan=False), min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 10**6), max_size=60),
)
def test_the_c_gathers_are_itemgetters(values: list[float], picks: list[int]) -> None:
    assert native.PICK_BYTES is not None and native.PICK_DOUBLES is not None
    ids = tuple(p % len(values) for p in picks)
    status = bytearray(i * 37 % 256 for i in range(len(values)))
    scores = array("d", values)
    assert native.PICK_BYTES(status, ids) == bytes(status[i] for i in ids)
    assert native.PICK_DOUBLES(scores, ids) == tuple(scores[i] for i in ids)


def test_the_c_gathers_refuse_what_they_cannot_read() -> None:
    assert native.PICK_BYTES is not None and native.PICK_DOUBLES is not None
    with pytest.raises(IndexError, match="outside"):
        native.PICK_BYTES(bytearray(3), (0, 3))
    with pytest.raises(IndexError, match="outside"):
        native.PICK_DOUBLES(array("d", [1.0]), (-1,))
    with pytest.raises(TypeError, match="array"):
        native.PICK_DOUBLES(array("q", [1]), (0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ids"):
        native.PICK_BYTES(bytearray(3), [0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.PICK_BYTES(bytearray(3), ("0",))  # type: ignore[arg-type]
    assert native.PICK_BYTES(bytearray(3), ()) == b""
    assert native.PICK_DOUBLES(array("d"), ()) == ()


@st.composite
def near_the_edge(draw: st.DrawFn, g: GpuUsage) -> tuple[int, int, int]:
    """A share's (threads, memory MiB, clients) on `g`: at one of its budgets' exact edge, one
    past it, one short of it, or anywhere."""
    cap = g.capacity

    def around(room: int, anywhere: int) -> int:
        edge = st.sampled_from([room, room + 1, room - 1, 0])
        return max(0, draw(edge | st.integers(0, anywhere)))

    clients = around(cap.clients - g.clients, 50)
    threads = around(cap.threads - g.threads, 220)
    memory = around(cap.memory_left(g.memory_mib, g.clients + clients), 90_000)
    return threads, memory, clients


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(
    data=st.data(),
    budgets=BUDGET_CHOICES,
    isolation=st.booleans(),
    user=st.sampled_from([None, 1000, 2000]),
)
def test_the_c_share_fit_is_share_cause(
    data: st.DataObject, budgets: BudgetSettings, isolation: bool, user: int | None
) -> None:
    """The C fit, called itself on a node's record, takes exactly the GPUs that the one
    definition of the share fit (`ledger.share_cause`) lets the share onto: budgets at their
    edges, client caps, over-budget GPUs, given out whole, unshareable, UIDs isolated or not,
    multi-user nodes."""
    ledger = Ledger(budgets)
    ledger.set_node(data.draw(nodes("n0", max_gpus=8)))
    data.draw(running(ledger, "n0", data.draw(st.integers(0, 12))))
    node = ledger.node("n0")
    index = StateIndex(ledger, budgets, cpu_free=lambda _: 0)
    record = index.fit_record(node)
    if record is None:
        assert not node.gpus
        return
    words = memoryview(record).cast("q").tolist()
    per_gpu = [words[2 + i * len(GPU_FIELDS) :][: len(GPU_FIELDS)] for i in range(len(node.gpus))]
    shapes = [gpu[GPU_FIELDS.index("shape")] for gpu in per_gpu]
    # Each GPU shape's demand is drawn at the edges of the first GPU of that shape.
    demands = [data.draw(near_the_edge(node.gpus[shapes.index(s)])) for s in range(max(shapes) + 1)]
    assert native.FIT_SHARE is not None
    found = native.FIT_SHARE(
        record, array("q", [x for d in demands for x in d]).tobytes(), user, isolation
    )
    multi_user = node.inventory.multi_user
    expected = [
        (g.info.index, s)
        for g, s in zip(node.gpus, shapes, strict=True)
        if share_cause(g, *demands[s], user, multi_user=multi_user, uid_isolation=isolation) is None
    ]
    assert ([] if found is None else list(zip(*found, strict=True))) == expected


def test_the_evaluator_fills_through_the_c_code() -> None:
    """Where the extension is installed the evaluator's fit and fill are the C functions'
    (counted here), not a Python path giving the same answers."""
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("n0", (h100(0), h100(1))))
    calls = {"fit": 0, "fill": 0}
    evaluator = known(
        Evaluator(ledger, budgets, FgdPolicy(WORKLOAD), cpu_free=lambda _: 64000), ["n0"]
    )
    fit_share, fill_share = native.FIT_SHARE, native.FILL_SHARE
    assert evaluator._fit_share is fit_share and evaluator._fill_share is fill_share
    assert fit_share is not None and fill_share is not None

    def counted_fit(*args: Any) -> Any:
        calls["fit"] += 1
        return fit_share(*args)

    def counted_fill(*args: Any) -> Any:
        calls["fill"] += 1
        return fill_share(*args)

    evaluator._fit_share, evaluator._fill_share = counted_fit, counted_fill
    request = ShareRequest(
        "ns", "p", "p", "share", containers=(ContainerAsk("c", threads=30),), run_as_user=1000
    )
    demand = make_demand(request, 1000)
    swept = evaluator.sweep(demand, ["n0"])
    assert swept.passed == ["n0"] and calls == {"fit": 0, "fill": 1}
    assert evaluator.entry(demand, "n0") is not None and calls["fit"] == 1
