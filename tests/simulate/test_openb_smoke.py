"""Smoke run on a slice of the real openb trace (skipped where the trace is not checked out
next to the repository): the replay runs end to end and the policies keep their order."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.config import Config
from extender.packing.policies import make_policy, typical_workload
from extender.simulate.replay import run_seed
from extender.simulate.trace import read_nodes, read_pods
from extender.simulate.types import Cluster

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"
NODES = TRACES / "openb_node_list_gpu_node.csv"
PODS = TRACES / "openb_pod_list_default.csv"


@pytest.mark.skipif(not NODES.exists() or not PODS.exists(), reason="openb trace not present")
def test_openb_slice_replays(bench_config: Config) -> None:
    nodes = read_nodes(NODES, bench_config.gpu_models, budgets=bench_config.budgets)
    pods = read_pods(PODS)
    # Every 8th node and every 8th pod: the same mix, one eighth of the size (about 1 s).
    cluster = Cluster(nodes[::8], pods[::8])
    workload = typical_workload(p.shape for p in cluster.pods)
    got = {}
    for name in ("bestfit", "fgd", "default"):
        policy = make_policy(name, workload=workload, settings=bench_config.policy)
        result = run_seed(cluster, policy, bench_config.budgets, 42)
        assert 85.0 < result.alloc_pct_at_100 <= 100.0
        assert result.placed < result.arrivals
        got[name] = result.alloc_pct_at_100
    assert got["fgd"] > got["bestfit"]
