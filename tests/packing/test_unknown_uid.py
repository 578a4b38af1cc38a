"""A share pod whose effective UID is unknown (no runAsUser: the image's user) is never taken to
be another's UID, nor another unknown one: under UID isolation it gets a GPU without shares and
takes none after it; on a multi-user MPS node, or with isolation off, it shares as any pod.

One rule in the core, so filter (fit_node and the evaluator, compiled or not), bind (the
ledger's assume) and simulate (the engine) decide alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.packing import native
from extender.packing.errors import BudgetExceeded
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, Misfit, allocate, fit_node
from extender.packing.ledger import Allocation, GpuRef, Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.policies import PolicySettings, make_policy
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.results import make_demand
from extender.packing.settings import BudgetSettings
from extender.packing.view import pod_shape
from extender.packing.workload import DEFAULT_WORKLOAD
from extender.simulate.engine import Engine
from extender.simulate.types import TRACE_USER, SimNode, SimPod

GPU = GpuInfo(0, "GPU-n0-0", "H100", 81559, ComputeCapability(9, 0), 48, 4)


def request(name: str, user: int | None, threads: int = 30) -> ShareRequest:
    ask = ContainerAsk("c", threads=threads)
    return ShareRequest("ns", name, name, "share", containers=(ask,), run_as_user=user)


def one_gpu(*, multi_user: bool = False, isolation: bool = True) -> tuple[Ledger, BudgetSettings]:
    budgets = BudgetSettings(uid_isolation=isolation)
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("n0", (GPU,), multi_user=multi_user))
    return ledger, budgets


def place(ledger: Ledger, budgets: BudgetSettings, req: ShareRequest) -> bool:
    """Filter then bind, as the service does: whether the pod went on the node."""
    fit = fit_node(ledger.node("n0"), req, budgets)
    if not isinstance(fit, Fit):
        return False
    ledger.assume(allocate(ledger.node("n0"), req, fit, fit.gpus[0], budgets))
    return True


@pytest.mark.parametrize(("first", "second"), [(None, None), (None, 1000), (1000, None)], ids=str)
def test_an_unknown_uid_shares_no_gpu_under_uid_isolation(
    first: int | None, second: int | None
) -> None:
    ledger, budgets = one_gpu()
    assert place(ledger, budgets, request("a", first))
    fit = fit_node(ledger.node("n0"), request("b", second), budgets)
    assert isinstance(fit, Misfit) and fit.resolvable
    assert "serve another UID" in fit.reason
    # Bind re-checks in the ledger: an allocation made elsewhere is refused too.
    held = ledger.allocation("a")
    assert held is not None
    forced = replace(held, pod_uid="b", name="b", run_as_user=second)
    with pytest.raises(BudgetExceeded, match="UID"):
        ledger.assume(forced)


@pytest.mark.parametrize(
    "setting", [{"multi_user": True}, {"isolation": False}], ids=["multi-user", "no-isolation"]
)
def test_unknown_uids_share_where_uid_isolation_does_not_apply(setting: dict[str, bool]) -> None:
    ledger, budgets = one_gpu(**setting)
    assert place(ledger, budgets, request("a", None))
    assert place(ledger, budgets, request("b", None))
    assert list(ledger.over_budget()) == []


def test_two_unknown_uids_recorded_on_one_gpu_are_over_budget() -> None:
    ledger, budgets = one_gpu()
    for name in ("a", "b"):
        ref = GpuRef(0, GPU.uuid)
        ledger.record(Allocation(name, "ns", name, "n0", "share", (ref,), 10, 100, 1))
    [(_, _, why)] = list(ledger.over_budget())
    assert "2 UIDs" in why
    assert isinstance(fit_node(ledger.node("n0"), request("c", None), budgets), Misfit)


@pytest.mark.parametrize(
    "compiled",
    [
        pytest.param(
            True,
            marks=pytest.mark.skipif(native.FIT_SHARE is None, reason="pure build"),
        ),
        False,
    ],
    ids=["c", "python"],
)
def test_the_evaluator_keeps_unknown_uids_apart(compiled: bool) -> None:
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    gpus = (GPU, replace(GPU, index=1, uuid="GPU-n0-1"))
    ledger.set_node(NodeInventory("n0", gpus))
    policy = make_policy("fgd", workload=DEFAULT_WORKLOAD, settings=PolicySettings())
    evaluator = Evaluator(ledger, budgets, policy, cpu_free=lambda _: 64000, native=compiled)
    first = make_demand(request("a", None), 1000)
    entry = evaluator.entry(first, "n0")
    assert entry is not None
    fit, _, gpu = entry
    assert isinstance(fit, Fit)
    ledger.assume(allocate(ledger.node("n0"), first.request, fit, gpu, budgets))
    evaluator.touch("n0")
    taken = (gpu,) if gpu is not None else fit.gpus[:1]
    assert [g.index for g in ledger.allocation("a").gpus] == list(taken)  # type: ignore[union-attr]
    for user in (None, 1000):
        entry = evaluator.entry(make_demand(request(f"b{user}", user), 1000), "n0")
        assert entry is not None and isinstance(entry[0], Fit)
        assert entry[0].gpus == (1 - taken[0],)


def sim_pod(name: str, user: int | None) -> SimPod:
    req = request(name, user, threads=40)
    return SimPod(name, 1000, 1, pod_shape(req, 1000, threads=40), req)


def test_simulate_keeps_unknown_uids_apart_and_packs_the_trace_user() -> None:
    node = SimNode("n0", 64000, 512000, NodeInventory("n0", (GPU,)))
    policy = make_policy("fgd", workload=DEFAULT_WORKLOAD, settings=PolicySettings())
    budgets = BudgetSettings()
    unknown = Engine((node,), policy, budgets, [0])
    assert unknown.place(sim_pod("a", None)) == (0, 0)
    assert unknown.place(sim_pod("b", None)) is None
    trace = Engine((node,), policy, budgets, [0])
    assert trace.place(sim_pod("a", TRACE_USER)) == (0, 0)
    assert trace.place(sim_pod("b", TRACE_USER)) == (0, 0)
