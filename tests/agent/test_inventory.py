"""What the agent publishes: the inventory of a discovered node, its agent record, the merge
patch of only what differs; and, end to end, the extender's own decoder and ledger placing onto
the published inventory exactly as the budgets say."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from extender.agent.inventory import (
    AGENT_KEY,
    MPS_READY_LABEL,
    agent_record,
    inventory_from_discovery,
    node_patch,
)
from extender.agent.nvml import Discovery, Nvml
from extender.packing.codec import INVENTORY_KEY, decode_inventory, encode_inventory
from extender.packing.errors import BudgetExceeded
from extender.packing.ledger import Allocation, GpuRef, Ledger
from extender.packing.model import NodeInventory
from extender.packing.settings import BudgetSettings
from tests.agent.fake_nvml import A100_MIG, H100, P100, V100, FakeNvml

NODE = "gpu-node-1"


@pytest.fixture
async def discovery() -> Discovery:
    session = Nvml(FakeNvml(), timeout_s=1.0)
    await session.start()
    try:
        return await session.discover()
    finally:
        await session.close()


def inventory(
    found: Discovery, budgets: BudgetSettings | None = None, **labels: str
) -> NodeInventory:
    return inventory_from_discovery(
        NODE, found, labels=labels, budgets=budgets or BudgetSettings(), mps="ready"
    )


def test_client_limits_come_from_compute_capability(discovery: Discovery) -> None:
    inv = inventory(discovery)
    assert inv.name == NODE
    assert [g.max_clients for g in inv.gpus] == [48, 48, 48, 16]
    assert [g.mig for g in inv.gpus] == [False, True, False, False]
    assert [g.uuid for g in inv.gpus] == [H100.uuid, A100_MIG.uuid, V100.uuid, P100.uuid]
    assert [g.model for g in inv.gpus] == [H100.name, A100_MIG.name, V100.name, P100.name]
    assert [g.shareable for g in inv.gpus] == [True, True, True, False]  # P100: pre-Volta
    assert {g.units for g in inv.gpus} == {4}  # the configured default
    assert {g.mps for g in inv.gpus} == {"ready"}
    assert not inv.multi_user


def test_configured_cap_and_label_units(discovery: Discovery) -> None:
    inv = inventory(
        discovery, BudgetSettings(max_clients_per_gpu=20), **{"nvidia.com/gpu.replicas": "8"}
    )
    assert [g.max_clients for g in inv.gpus] == [20, 20, 20, 16]
    assert {g.units for g in inv.gpus} == {8}
    down = inventory_from_discovery(
        NODE, discovery, labels={}, budgets=BudgetSettings(), mps="down"
    )
    assert {g.mps for g in down.gpus} == {"down"}


def test_the_encoded_inventory_reads_back_the_same(discovery: Discovery) -> None:
    inv = inventory(discovery)
    text = encode_inventory(inv)
    doc = json.loads(text)
    assert [("mig" in g) for g in doc] == [False, True, False, False]  # only where true
    assert doc[0] == {
        "index": 0,
        "uuid": H100.uuid,
        "model": "NVIDIA H100 80GB HBM3",
        "memoryMiB": 81559,
        "computeCapability": "9.0",
        "maxClients": 48,
        "units": 4,
        "mps": "ready",
    }
    assert decode_inventory(NODE, text, budgets=BudgetSettings()).gpus == inv.gpus


def test_agent_record_is_canonical_json(discovery: Discovery) -> None:
    assert agent_record(discovery, mps_state="ready", reason="") == (
        '{"cuda":"12.4","driver":"550.54.15","mps":"ready","reason":""}'
    )
    text = agent_record(discovery, mps_state="down", reason="control daemon exited\n  status 1")
    assert json.loads(text)["reason"] == "control daemon exited status 1"
    long = json.loads(agent_record(discovery, mps_state="foreign", reason="x" * 5000))["reason"]
    assert len(long) == 512 and long.endswith("...")
    with pytest.raises(ValueError, match="'sleepy'"):
        agent_record(discovery, mps_state="sleepy", reason="")


def published(discovery: Discovery) -> tuple[dict[str, str], dict[str, str]]:
    annotations = {
        INVENTORY_KEY: encode_inventory(inventory(discovery)),
        AGENT_KEY: agent_record(discovery, mps_state="ready", reason=""),
    }
    return annotations, {MPS_READY_LABEL: "true"}


def test_node_patch_none_when_nothing_differs(discovery: Discovery) -> None:
    annotations, labels = published(discovery)
    node = {
        "metadata": {
            "name": NODE,
            "annotations": {**annotations, "other.io/x": "1"},
            "labels": {**labels, "kubernetes.io/hostname": NODE},
        }
    }
    assert node_patch(node, annotations=annotations, labels=labels) is None


def test_node_patch_holds_only_what_differs(discovery: Discovery) -> None:
    annotations, labels = published(discovery)
    node = {"metadata": {"annotations": dict(annotations), "labels": {MPS_READY_LABEL: "false"}}}
    assert node_patch(node, annotations=annotations, labels=labels) == {
        "metadata": {"labels": {MPS_READY_LABEL: "true"}}
    }
    record = agent_record(discovery, mps_state="down", reason="probe failed")
    node = {"metadata": {"annotations": dict(annotations), "labels": dict(labels)}}
    assert node_patch(node, annotations={**annotations, AGENT_KEY: record}, labels=labels) == {
        "metadata": {"annotations": {AGENT_KEY: record}}
    }


def test_node_patch_of_a_bare_node(discovery: Discovery) -> None:
    annotations, labels = published(discovery)
    for node in ({}, {"metadata": {"name": NODE}}, {"metadata": {"annotations": None}}):
        assert node_patch(node, annotations=annotations, labels=labels) == {
            "metadata": {"annotations": annotations, "labels": labels}
        }


# -- end to end: the extender's decoder and ledger on the published inventory -----------------


def ledger_for(discovery: Discovery, budgets: BudgetSettings) -> Ledger:
    text = encode_inventory(inventory(discovery, budgets))
    ledger = Ledger(budgets)
    ledger.set_node(decode_inventory(NODE, text, budgets=budgets))
    return ledger


def share(n: int, gpu: int, uuid: str) -> Allocation:
    """One pod of UID 1000 holding one MPS client, 2 % of the threads and 300 MiB on GPU
    `gpu` (a pod without runAsUser would share its GPU with nobody)."""
    return Allocation(
        f"pod-{gpu}-{n}",
        "ns",
        f"pod-{n}",
        NODE,
        "share",
        (GpuRef(gpu, uuid),),
        2,
        300,
        1,
        run_as_user=1000,
    )


def fill(ledger: Ledger, gpu: int, uuid: str, *, up_to: int = 100) -> int:
    """How many one-client shares GPU `gpu` takes before the ledger refuses one."""
    for n in range(up_to):
        try:
            ledger.assume(share(n, gpu, uuid))
        except BudgetExceeded:
            return n
    return up_to


def test_published_inventory_places_as_budgets_say(discovery: Discovery) -> None:
    ledger = ledger_for(discovery, BudgetSettings())
    assert fill(ledger, 0, H100.uuid) == 48  # the 49th is refused: clients
    with pytest.raises(BudgetExceeded, match="0 MPS clients free"):
        ledger.assume(share(48, 0, H100.uuid))
    assert fill(ledger, 2, V100.uuid) == 48  # compute capability 7.0: Volta, 48
    with pytest.raises(BudgetExceeded, match="pre-Volta"):
        ledger.assume(share(0, 3, P100.uuid))  # whole-only by default
    with pytest.raises(BudgetExceeded, match="MIG is enabled"):
        ledger.assume(share(0, 1, A100_MIG.uuid))
    # The MIG A100 and the P100 are still given out whole.
    ledger.assume(Allocation("w1", "ns", "w1", NODE, "whole", (GpuRef(1, A100_MIG.uuid),)))
    ledger.assume(Allocation("w3", "ns", "w3", NODE, "whole", (GpuRef(3, P100.uuid),)))
    ledger.check_invariants()


def test_pre_volta_share_mode_takes_sixteen(discovery: Discovery) -> None:
    ledger = ledger_for(discovery, BudgetSettings(pre_volta="share"))
    assert fill(ledger, 3, P100.uuid) == 16
    assert fill(ledger, 1, A100_MIG.uuid) == 0  # MIG stays whole-only in every mode
    ledger.check_invariants()


def test_a_daemon_that_is_down_takes_no_shares(discovery: Discovery) -> None:
    budgets = BudgetSettings()
    inv = inventory_from_discovery(NODE, discovery, labels={}, budgets=budgets, mps="down")
    ledger = Ledger(budgets)
    ledger.set_node(decode_inventory(NODE, encode_inventory(inv), budgets=budgets))
    assert fill(ledger, 0, H100.uuid) == 0
    # A GPU that changes (MIG switched on) shows up in the next inventory.
    changed = replace(discovery, gpus=(replace(discovery.gpus[0], mig=True), *discovery.gpus[1:]))
    assert inventory(changed).gpus[0].mig


def test_sixty_clients_from_cuda_13_1_reach_the_extender_only_with_the_option(
    discovery: Discovery,
) -> None:
    """budgets.clientsCuda131: the agent publishes 60 for Volta+ GPUs of a CUDA 13.1 driver,
    and the extender's decoder keeps it; without the option both stay at 48."""
    newer = replace(discovery, cuda_version="13.1")
    on = BudgetSettings(clients_cuda131=True)
    published = inventory_from_discovery(NODE, newer, labels={}, budgets=on, mps="ready")
    assert [g.max_clients for g in published.gpus] == [60, 60, 60, 16]
    text = encode_inventory(published)
    assert [g.max_clients for g in decode_inventory(NODE, text, budgets=on).gpus] == [60] * 3 + [16]
    off = BudgetSettings()
    assert [g.max_clients for g in decode_inventory(NODE, text, budgets=off).gpus] == [48] * 3 + [
        16
    ]
    older = inventory_from_discovery(NODE, discovery, labels={}, budgets=on, mps="ready")
    assert [g.max_clients for g in older.gpus] == [48, 48, 48, 16]  # CUDA 12.4
    capped = replace(on, max_clients_per_gpu=52)
    assert {g.max_clients for g in decode_inventory(NODE, text, budgets=capped).gpus} == {52, 16}
