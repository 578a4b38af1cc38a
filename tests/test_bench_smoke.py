"""scripts/bench_extender.py at small scale: the generated cluster is one the extender could have
produced (every allocation decodes and fits a fresh ledger), and the whole benchmark (serve,
floor, serial pairs, concurrent binds, report) runs end to end in seconds."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.packing.codec import (
    ALLOCATION_KEY,
    INVENTORY_KEY,
    decode_allocation,
    decode_inventory,
)
from extender.packing.ledger import Ledger
from extender.packing.podspec import parse_pod
from extender.packing.settings import BudgetSettings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_extender.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_extender", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class body is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_generated_cluster_respects_every_budget(bench: ModuleType) -> None:
    budgets = BudgetSettings()
    doc, stats = bench.generate_cluster(40, 480, seed=3)
    items: list[dict[str, Any]] = doc["items"]
    nodes = [i for i in items if i["kind"] == "Node"]
    pods = [i for i in items if i["kind"] == "Pod"]
    assert len(nodes) == 40 == stats.nodes
    assert len({n["metadata"]["name"] for n in nodes}) == 40
    assert len(pods) == stats.running_pods
    assert 0.9 * 480 <= len(pods) <= 480
    assert len({p["metadata"]["uid"] for p in pods}) == len(pods)
    # About half of the GPU capacity in use, as the bench promises.
    assert 35 <= stats.threads_used_pct <= 65
    assert stats.whole_pods > 0

    # Rebuild from the annotations alone, as the service does, into a fresh ledger: assume
    # raises if any GPU would go over a budget, and check_invariants re-adds everything.
    ledger = Ledger(budgets)
    for node in nodes:
        meta = node["metadata"]
        ledger.set_node(
            decode_inventory(
                meta["name"], meta["annotations"][INVENTORY_KEY], budgets=budgets,
                labels=meta["labels"],
            )
        )  # fmt: skip
    kinds: Counter[str] = Counter()
    for pod in pods:
        meta = pod["metadata"]
        alloc = decode_allocation(
            meta["annotations"][ALLOCATION_KEY],
            pod_uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
        )
        assert alloc.node == pod["spec"]["nodeName"]
        assert pod["status"]["phase"] == "Running"
        # The spec asks for what the annotation grants.
        assert parse_pod(pod, budgets).kind == alloc.kind
        ledger.assume(alloc, confirmed=True)
        kinds[alloc.kind] += 1
    ledger.check_invariants()
    assert kinds["share"] > kinds["whole"] > 0

    # And the embedded cluster (what `serve --cluster-file` loads) accepts the dump.
    cluster = EmbeddedCluster.from_text(orjson.dumps(doc), source="generated")
    assert cluster.node_count() == 40
    assert cluster.pod_count() == len(pods)


def test_pending_pods_are_valid_and_mixed(bench: ModuleType) -> None:
    pods = bench.pending_pods(60, seed=5)
    requests = [parse_pod(p, BudgetSettings()) for p in pods]
    assert {r.kind for r in requests} == {"share", "whole"}
    assert all("nodeName" not in p["spec"] for p in pods)
    assert len({p["metadata"]["uid"] for p in pods}) == 60


@pytest.mark.parametrize(
    ("nodes", "candidates"), [(50, 50), (99, 99), (200, 100), (1000, 420), (5000, 500)]
)
def test_candidate_count_follows_kube_scheduler(
    bench: ModuleType, nodes: int, candidates: int
) -> None:
    assert bench.adaptive_candidates(nodes) == candidates


def test_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    # Blocks of 7 over 20 pods: the last block is a short one.
    argv = [
        sys.executable,
        str(SCRIPT),
        *("--nodes", "50", "--pods", "20", "--block", "7", "--json", "-"),
    ]
    proc = subprocess.run(argv, capture_output=True, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    report = orjson.loads(proc.stdout)
    assert report["cluster"]["nodes"] == 50
    assert report["block"] == 7
    for who in ("extender", "floor"):
        assert report[who]["adaptive"]["pair_ms"]["n"] == 20
        # Clock ticks are 10 ms: at this scale the figure may round to 0, but it is measured.
        assert report[who]["adaptive"]["server_cpu_ms_per_pod"] is not None
        assert report[who]["all"]["candidates"] == 50
        assert report[who]["bind"]["binds"] > 0
    ext = report["extender"]
    assert ext["adaptive"]["placed"] > 0
    assert ext["new_shapes"]["pair_ms"]["n"] == 20
    assert ext["bind"]["ok"] > 0
    assert report["serve"]["peak_rss_mb"] > 0
    assert {t["result"] for t in report["targets"]} <= {"PASS", "MISS"}
    assert len(report["targets"]) == 6
