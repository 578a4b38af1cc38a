"""The state index keys a node by its GPUs' figures (`GpuFigures`, the one list of a GPU's
fields): equal keys must mean equal answers, reasons included; and a C fit whose record fields
are not that list is refused at import."""

from __future__ import annotations

import dataclasses

import pytest

from extender.packing import native
from extender.packing.errors import RecordLayoutError
from extender.packing.evaluate import Evaluator
from extender.packing.ledger import GpuRef, Ledger
from extender.packing.model import NodeInventory
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.results import make_demand
from extender.packing.settings import BudgetSettings
from extender.packing.state_index import GPU_FIELDS, GpuFigures, check_record_layout
from tests.packing.test_ledger import h100, share
from tests.packing.test_native import WORKLOAD


def test_the_c_records_fields_are_the_gpu_figures() -> None:
    assert GpuFigures._fields == GPU_FIELDS
    check_record_layout(GPU_FIELDS)
    check_record_layout(None)  # the pure build: no C fit to check
    if native.RECORD_FIELDS is not None:
        assert native.RECORD_FIELDS == GPU_FIELDS


@pytest.mark.parametrize(
    "fields",
    [
        tuple(reversed(GPU_FIELDS)),
        GPU_FIELDS[:-1],
        (*GPU_FIELDS, "extra"),
        tuple(
            "memory" if f == "threads" else "threads" if f == "memory" else f for f in GPU_FIELDS
        ),
    ],
)
def test_a_c_fit_reading_other_fields_is_refused(fields: tuple[str, ...]) -> None:
    with pytest.raises(RecordLayoutError, match="rebuild the C extension"):
        check_record_layout(fields)


@pytest.mark.parametrize("native_fit", [True, False])
def test_nodes_whose_gpus_take_no_shares_for_different_reasons_keep_their_reasons(
    native_fit: bool,
) -> None:
    """A GPU with MIG enabled and one whose MPS is down both have no share capacity; the
    node's reason says which. The hand-written state key left the difference out, so the
    second node was given the first one's reason."""
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    ledger.set_node(NodeInventory("mig", (dataclasses.replace(h100(0, "mig"), mig=True),)))
    ledger.set_node(NodeInventory("down", (dataclasses.replace(h100(0, "down"), mps="down"),)))
    evaluator = Evaluator(
        ledger, budgets, FgdPolicy(WORKLOAD), cpu_free=lambda _: 64000, native=native_fit
    )
    for name in ("mig", "down"):
        evaluator.touch(name)
    evaluator.refresh()
    request = ShareRequest(
        "ns", "p", "p", "share", containers=(ContainerAsk("c", threads=30),), run_as_user=1000
    )
    swept = evaluator.sweep(make_demand(request, 1000), ["mig", "down"])
    assert "MIG is enabled" in swept.unresolvable["mig"]
    assert "MPS is down" in swept.unresolvable["down"]


def test_nodes_in_one_state_are_not_given_each_others_names() -> None:
    """Two nodes each running a pod whose GPU their inventory does not show are in one state:
    the reason kept for it named the first node, and the second was given that name."""
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    for name in ("a", "b"):
        ledger.set_node(NodeInventory(name, (h100(0, name),)))
        lost = (GpuRef(3, f"GPU-gone-{name}"),)
        ledger.record(dataclasses.replace(share(f"x{name}", 10, node=name), gpus=lost))
    evaluator = Evaluator(ledger, budgets, FgdPolicy(WORKLOAD), cpu_free=lambda _: 64000)
    for name in ("a", "b"):
        evaluator.touch(name)
    evaluator.refresh()
    request = ShareRequest(
        "ns", "p", "p", "share", containers=(ContainerAsk("c", threads=30),), run_as_user=1000
    )
    failed = evaluator.sweep(make_demand(request, 1000), ["a", "b"]).failed
    assert set(failed) == {"a", "b"}
    assert "GPUs of a " not in failed["b"]
    assert failed["a"] == failed["b"]
