"""`fit_node` agrees with a brute-force reading of the budget rules on small instances, and the
effective-request rule for init containers holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing.fit import Fit, Misfit, allocate, fit_node
from extender.packing.ledger import Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.request import ContainerAsk, ShareRequest, demand_on
from extender.packing.settings import BudgetSettings
from tests.packing.strategies import nodes, requests

BUDGET_CHOICES = st.builds(
    BudgetSettings,
    oversubscription=st.sampled_from([1.0, 2.0]),
    memory_reserve_mib=st.sampled_from([0, 256]),
    client_overhead_mib=st.sampled_from([0, 200]),
    pre_volta=st.sampled_from(["whole-only", "share"]),
    uid_isolation=st.booleans(),
)


def brute_force_share_gpus(ledger: Ledger, request: ShareRequest) -> tuple[set[int], bool]:
    """Which GPUs take the share now, and could any take it on an empty node: straight from
    docs/design.md's budgets, recounting every allocation instead of trusting the ledger's
    totals."""
    b = ledger.budgets
    node = ledger.node("n0")
    fits: set[int] = set()
    ever = False
    for g in node.gpus:
        info = g.info
        d = demand_on(request, info, b)
        shareable = info.mps == "ready" and (
            info.compute_capability >= ComputeCapability(7, 0) or b.pre_volta == "share"
        )
        # The configured cap is in the inventory's figure (applied where inventories are built).
        clients_cap = info.max_clients
        mem_cap = info.memory_mib - b.memory_reserve_mib
        threads_cap = round(100 * b.oversubscription)
        if (
            shareable
            and d.threads <= threads_cap
            and d.clients <= clients_cap
            and (d.memory_mib + d.clients * b.client_overhead_mib <= mem_cap)
        ):
            ever = True
        on_gpu = [a for a in ledger.allocations() if any(r.index == info.index for r in a.gpus)]
        if any(a.kind == "whole" for a in on_gpu) or not shareable:
            continue
        t = sum(a.threads for a in on_gpu) + d.threads
        c = sum(a.clients for a in on_gpu) + d.clients
        m = sum(a.memory_mib for a in on_gpu) + d.memory_mib + c * b.client_overhead_mib
        uids = {a.run_as_user for a in on_gpu}
        uid_ok = not (
            b.uid_isolation
            and not node.inventory.multi_user
            and uids
            # An unknown UID (None) is never taken to be another's, nor another unknown one.
            and (request.run_as_user is None or request.run_as_user not in uids)
        )
        if t <= threads_cap and c <= clients_cap and m <= mem_cap and uid_ok:
            fits.add(info.index)
    return fits, ever


@settings(max_examples=300, deadline=None)
@given(data=st.data(), budgets=BUDGET_CHOICES)
def test_fit_agrees_with_brute_force(data: st.DataObject, budgets: BudgetSettings) -> None:
    ledger = Ledger(budgets)
    ledger.set_node(data.draw(nodes("n0")))
    # Fill the node with a few placements chosen through fit itself.
    for i in range(data.draw(st.integers(0, 5))):
        req = data.draw(requests(f"pre{i}"))
        result = fit_node(ledger.node("n0"), req, budgets)
        if isinstance(result, Fit) and result.gpus:
            gpu = data.draw(st.sampled_from(result.gpus))
            ledger.assume(allocate(ledger.node("n0"), req, result, gpu, budgets))
    request = data.draw(requests("probe"))
    result = fit_node(ledger.node("n0"), request, budgets)
    node = ledger.node("n0")
    if request.kind == "whole":
        idle = {
            g.info.index
            for g in node.gpus
            if not any(any(r.index == g.info.index for r in a.gpus) for a in ledger.allocations())
        }
        if len(idle) >= request.whole_gpus:
            assert isinstance(result, Fit) and set(result.gpus) == idle
        else:
            assert isinstance(result, Misfit)
            assert result.resolvable == (len(node.gpus) >= request.whole_gpus)
        return
    expected, ever = brute_force_share_gpus(ledger, request)
    if expected:
        assert isinstance(result, Fit) and set(result.gpus) == expected
    else:
        assert isinstance(result, Misfit), result
        assert result.resolvable == ever
        assert result.reason


@given(data=st.data(), budgets=BUDGET_CHOICES)
def test_demands_shared_across_nodes_give_the_same_fits(
    data: st.DataObject, budgets: BudgetSettings
) -> None:
    """The evaluator keeps one request's per-GPU-shape demands across the nodes it fits: the
    answers (reasons included) are those of fit_node on its own, whatever the node order."""
    ledger = Ledger(budgets)
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 4)))]
    for name in names:
        ledger.set_node(data.draw(nodes(name)))
        for i in range(data.draw(st.integers(0, 4))):
            req = data.draw(requests(f"{name}-pre{i}"))
            placed = fit_node(ledger.node(name), req, budgets)
            if isinstance(placed, Fit) and placed.gpus:
                gpu = data.draw(st.sampled_from(placed.gpus))
                ledger.assume(allocate(ledger.node(name), req, placed, gpu, budgets))
    request = data.draw(requests("probe"))
    shapes: dict[tuple[int, int], Any] = {}
    for name in data.draw(st.permutations(names)):
        alone = fit_node(ledger.node(name), request, budgets)
        assert fit_node(ledger.node(name), request, budgets, shapes=shapes) == alone


def test_misfit_reasons_name_the_budget() -> None:
    gpu = GpuInfo(0, "u0", "L4", 23034, ComputeCapability(8, 9), 48, 4)
    ledger = Ledger(BudgetSettings())
    ledger.set_node(NodeInventory("n0", (gpu,)))
    big = ShareRequest("ns", "p", "p", "share", (ContainerAsk("c", threads=10, memory_mib=30000),))
    result = fit_node(ledger.node("n0"), big, BudgetSettings())
    assert isinstance(result, Misfit) and not result.resolvable
    assert result.reason == (
        "no GPU here can ever hold this share: 30000 MiB needed, 22778 MiB pinnable"
    )
    half = ShareRequest("ns", "a", "a", "share", (ContainerAsk("c", threads=60),))
    fit = fit_node(ledger.node("n0"), half, BudgetSettings())
    assert isinstance(fit, Fit)
    ledger.assume(allocate(ledger.node("n0"), half, fit, 0, BudgetSettings()))
    other = ShareRequest("ns", "b", "b", "share", (ContainerAsk("c", threads=50),))
    result = fit_node(ledger.node("n0"), other, BudgetSettings())
    assert isinstance(result, Misfit) and result.resolvable
    assert result.reason == "no GPU has room: none with 50% threads free"
    empty = Ledger(BudgetSettings())
    empty.set_node(NodeInventory("cpu-only", ()))
    result = fit_node(empty.node("cpu-only"), other, BudgetSettings())
    assert isinstance(result, Misfit) and not result.resolvable


def test_effective_request_takes_the_larger_of_init_and_app_sum() -> None:
    gpu = GpuInfo(0, "u0", "A100", 40960, ComputeCapability(8, 0), 48, 4)
    budgets = BudgetSettings(memory_reserve_mib=0)
    request = ShareRequest(
        "ns",
        "p",
        "p",
        "share",
        (
            ContainerAsk("init-big", init=True, threads=70, memory_mib=1000, clients=1),
            ContainerAsk("app1", threads=20, memory_mib=4096, clients=2),
            ContainerAsk("app2", threads=30, memory_mib=4096, clients=1),
        ),
    )
    d = demand_on(request, gpu, budgets)
    assert (d.threads, d.memory_mib, d.clients) == (70, 8192, 3)


def test_units_and_proportional_shares() -> None:
    gpu = GpuInfo(0, "u0", "A100", 40960, ComputeCapability(8, 0), 48, 4)
    budgets = BudgetSettings(memory_reserve_mib=960)  # 40000 MiB pinnable
    one_unit = ShareRequest("ns", "p", "p", "share", (ContainerAsk("c", units=1),))
    assert demand_on(one_unit, gpu, budgets).threads == 25
    assert demand_on(one_unit, gpu, budgets).memory_mib == 10000
    threads_only = ShareRequest("ns", "p", "p", "share", (ContainerAsk("c", threads=33),))
    assert demand_on(threads_only, gpu, budgets).memory_mib == 13200
    memory_only = ShareRequest("ns", "p", "p", "share", (ContainerAsk("c", memory_mib=10001),))
    assert demand_on(memory_only, gpu, budgets).threads == 26  # rounded up
    # Three 33 % shares and one 1 % share fill the GPU exactly without exceeding memory.
    parts = [demand_on(threads_only, gpu, budgets).memory_mib] * 3
    assert sum(parts) <= 40000


def test_node_reasons_do_not_depend_on_current_usage() -> None:
    # kube-scheduler counts identical reasons across nodes; two full nodes of one type must give
    # the same reason however their GPUs happen to be filled.
    budgets = BudgetSettings()
    gpu = GpuInfo(0, "u0", "L4", 23034, ComputeCapability(8, 9), 48, 4)
    ledger = Ledger(budgets)
    for name, fill in (("a", (70,)), ("b", (45, 40))):
        ledger.set_node(NodeInventory(name, (replace(gpu, uuid=f"{name}-0"),)))
        for i, threads in enumerate(fill):
            req = ShareRequest(
                "ns",
                f"{name}{i}",
                f"{name}{i}",
                "share",
                (ContainerAsk("c", threads=threads),),
                run_as_user=1000,
            )
            fit = fit_node(ledger.node(name), req, budgets)
            assert isinstance(fit, Fit)
            ledger.assume(allocate(ledger.node(name), req, fit, 0, budgets))
    probe = ShareRequest(
        "ns", "p", "p", "share", (ContainerAsk("c", threads=40),), run_as_user=1000
    )
    reasons = {fit_node(ledger.node(n), probe, budgets) for n in ("a", "b")}
    assert {r.reason for r in reasons if isinstance(r, Misfit)} == {
        "no GPU has room: none with 40% threads free"
    }
