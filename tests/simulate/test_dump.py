"""`read_cluster` reads a dump as the extender does: nodes through `objects.read_node` (the
node selection included), pods' CPU and memory by the one effective-request rule, a share
sized on the cluster's largest GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extender.packing.codec import INVENTORY_KEY
from extender.packing.settings import BudgetSettings, NodeSelection
from extender.simulate.dump import UNKNOWN_CPU_MILLI, read_cluster
from extender.simulate.types import TraceError

Json = dict[str, Any]


def _node(name: str, memory_mib: int, labels: dict[str, str], cpu: str | None) -> Json:
    gpu = {"index": 0, "uuid": f"GPU-{name}", "model": "X", "memoryMiB": memory_mib}
    gpu.update({"computeCapability": "8.0", "units": 4, "mps": "ready"})
    status = {"allocatable": {"cpu": cpu, "memory": "1Gi"}} if cpu else {}
    meta = {"name": name, "labels": labels, "annotations": {INVENTORY_KEY: json.dumps([gpu])}}
    return {"kind": "Node", "metadata": meta, "status": status}


def _write(tmp_path: Path, items: list[Json]) -> Path:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"kind": "List", "items": items}))
    return path


def test_nodes_and_pods_are_read_by_the_extenders_rules(tmp_path: Path) -> None:
    pool = {"pool": "gpu"}
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
        "spec": {
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "1"}}}
            ],
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "250.5m", "memory": "1Gi"},
                        "limits": {"mpsched.io/memory": "8Gi"},
                    },
                }
            ],
            "overhead": {"cpu": "100m"},
        },
    }
    items = [
        _node("big", 81920, pool, "7.9999"),
        _node("small", 16384, pool, None),
        _node("other", 40960, {"pool": "cpu"}, "8"),
        pod,
    ]
    selection = NodeSelection(selector=pool)
    cluster = read_cluster(_write(tmp_path, items), BudgetSettings(), selection=selection)
    big, small, other = cluster.nodes
    assert (big.cpu_milli, big.memory_mib, len(big.inventory.gpus)) == (7999, 1024, 1)
    assert small.cpu_milli == UNKNOWN_CPU_MILLI
    assert other.inventory.gpus == ()  # not selected: CPU-only pods only
    (p,) = cluster.pods
    # 1000 (sidecar) + 251 (rounded up) + 100 (overhead); 8 GiB of the largest GPU (80 GiB
    # less the 256 MiB reserve) is 11 % of its threads, rounded up.
    assert (p.cpu_milli, p.memory_mib, p.shape.threads, p.shape.gpus) == (1351, 1024, 11, 1)


def test_a_dump_without_gpus_is_refused(tmp_path: Path) -> None:
    plain = {"kind": "Node", "metadata": {"name": "cpu-only"}, "status": {}}
    with pytest.raises(TraceError, match=r"dump\.json: no Node with a GPU inventory"):
        read_cluster(_write(tmp_path, [plain]), BudgetSettings(), selection=NodeSelection())
