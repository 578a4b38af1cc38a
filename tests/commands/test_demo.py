"""`mpsched demo` end to end (the real service in-process, driven over HTTP) and the built-in
sample cluster it runs on: every allocation in the sample is one the ledger accepts."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

import orjson
import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.cluster.loader import parse_document
from extender.commands import demo, demo_pods
from extender.packing.codec import (
    ALLOCATION_KEY,
    INVENTORY_KEY,
    decode_allocation,
    decode_inventory,
    inventory_from_labels,
)
from extender.packing.ledger import Ledger
from extender.packing.settings import BudgetSettings


def _items() -> list[dict[str, Any]]:
    return list(parse_document(demo.sample_cluster_text(), source="sample"))


def test_sample_cluster_allocations_fit_a_fresh_ledger() -> None:
    budgets = BudgetSettings()
    ledger = Ledger(budgets)
    items = _items()
    nodes = [i for i in items if i["kind"] == "Node"]
    by_model: dict[str, int] = {}
    for node in nodes:
        meta = node["metadata"]
        labels = meta.get("labels", {})
        text = meta.get("annotations", {}).get(INVENTORY_KEY)
        if text is not None:
            inventory = decode_inventory(meta["name"], text, budgets=budgets, labels=labels)
        else:
            found = inventory_from_labels(meta["name"], labels, budgets=budgets)
            if found is None:
                continue  # the CPU-only node
            inventory = found
        ledger.set_node(inventory)
        for g in inventory.gpus:
            by_model[g.model] = g.max_clients
    assert by_model["Tesla V100-SXM2-16GB"] == 48  # compute capability 7.0: Volta
    assert by_model["Tesla P100-PCIE-16GB"] == 16  # 6.0: pre-Volta
    assert by_model["Tesla-T4"] == 48  # from GFD labels only
    assert len(ledger) == 6

    allocated = 0
    for pod in (i for i in items if i["kind"] == "Pod"):
        meta = pod["metadata"]
        text = meta.get("annotations", {}).get(ALLOCATION_KEY)
        if text is None:
            continue
        alloc = decode_allocation(
            text, pod_uid=meta["uid"], namespace=meta["namespace"], name=meta["name"]
        )
        assert alloc.node == pod["spec"]["nodeName"]
        ledger.assume(alloc, confirmed=True)
        allocated += 1
    ledger.check_invariants()
    assert allocated >= 5
    assert EmbeddedCluster.from_text(demo.sample_cluster_text()).node_count() == len(nodes)


def test_templates_cover_every_special_kind_and_are_seeded() -> None:
    first = demo_pods.demo_templates(32, seed=4)
    assert len(first) == 32
    assert all(t in first for t in demo_pods.SPECIAL)
    assert first == demo_pods.demo_templates(32, seed=4)
    assert first != demo_pods.demo_templates(32, seed=5)
    # Pinned pods first, so that every GPU model shows a placement.
    pinned = [bool(t.node_selector) for t in first]
    assert pinned == sorted(pinned, reverse=True)
    assert len(demo_pods.demo_templates(3, seed=1)) == 3


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    code = demo.run(parser.parse_args(list(argv)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def json_report() -> dict[str, Any]:
    """One `--json` run shared by the assertions below (each run starts a real server)."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert demo.run(parser.parse_args(["--seed", "2", "--json"])) == 0
    report: dict[str, Any] = orjson.loads(out.getvalue())
    return report


def test_demo_places_a_pod_on_every_gpu_model_that_takes_shares(
    json_report: dict[str, Any],
) -> None:
    pods = {p["name"]: p for p in json_report["pods"]}
    assert len(pods) == demo.DEFAULT_PODS
    models_with_shares: set[str] = set()
    models_with_demo_pods: set[str] = set()
    for node in json_report["status"]["nodes"]:
        for gpu in node["gpus"]:
            if gpu["threads"]["capacity"] > 0:
                models_with_shares.add(gpu["model"])
            if any(p["namespace"] == demo_pods.NAMESPACE for p in gpu["pods"]):
                models_with_demo_pods.add(gpu["model"])
    assert len(models_with_shares) == 5  # H100, A100, L4, V100, T4; not the pre-Volta P100
    assert models_with_shares <= models_with_demo_pods


def test_demo_reports_why_pods_did_not_fit(json_report: dict[str, Any]) -> None:
    pods = {p["name"].rsplit("-", 1)[0]: p for p in json_report["pods"] if not p["node"]}
    too_big, invalid = pods["too-big"], pods["invalid"]
    # Nothing can ever fit these: every candidate is unresolvable, with a reason.
    for pod in (too_big, invalid):
        assert pod["feasible"] == []
        assert set(pod["failedAndUnresolvableNodes"]) == set(pod["candidates"])
        assert all(pod["failedAndUnresolvableNodes"].values())
    assert "needs 16 whole" in too_big["failedAndUnresolvableNodes"]["gpu-h100-1"]
    assert "150" in invalid["failedAndUnresolvableNodes"]["gpu-h100-1"]
    # A share pinned to the pre-Volta P100 node is refused there, unresolvably.
    assert pods["p100-share"]["candidates"] == ["gpu-p100-1"]
    assert "gpu-p100-1" in pods["p100-share"]["failedAndUnresolvableNodes"]
    placed = [p for p in json_report["pods"] if p["node"]]
    assert json_report["placed"] == len(placed) >= 25
    assert all(p["bindError"] == "" for p in placed)


def test_demo_prints_the_table_and_the_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--seed", "2", "--pods", "20")
    assert code == 0, err
    for item in _items():
        if item["kind"] == "Node":
            assert item["metadata"]["name"] in out
    gpu_nodes = ["gpu-h100-1", "gpu-a100-1", "gpu-l4-1", "gpu-v100-1", "gpu-p100-1"]
    for name in [*gpu_nodes, "gpu-t4-gfd-1"]:
        assert any(line.startswith(f"{name}  (") for line in out.splitlines())
    assert "GPU  MODEL" in out
    assert "THREADS %" in out
    assert "of 20 pods placed." in out
    assert "Not placed" in out
    assert "[unresolvable]" in out


def test_demo_rejects_a_bad_pod_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--pods", "0")
    assert code == 2
    assert out == ""
    assert err.startswith("mpsched demo: ")
