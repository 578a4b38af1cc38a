"""Fixtures for the simulator's tests: tiny openb-format traces written to a temp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from extender.config import Config, load_config_text
from extender.simulate.trace import read_nodes, read_pods
from extender.simulate.types import Cluster
from tests.simulate.helpers import BENCH, NODE_HEADER, NODES, POD_HEADER, pod_rows, write_csv


@pytest.fixture
def bench_config() -> Config:
    return load_config_text(BENCH)


@pytest.fixture
def trace_files(tmp_path: Path) -> Callable[[int], tuple[Path, Path]]:
    def make(pods: int = 60) -> tuple[Path, Path]:
        nodes = write_csv(tmp_path / "nodes.csv", NODE_HEADER, NODES)
        pod_file = write_csv(tmp_path / "pods.csv", POD_HEADER, pod_rows(pods))
        return nodes, pod_file

    return make


@pytest.fixture
def small_cluster(trace_files: Callable[[int], tuple[Path, Path]], bench_config: Config) -> Cluster:
    nodes, pods = trace_files(60)
    return Cluster(
        read_nodes(nodes, bench_config.gpu_models, budgets=bench_config.budgets), read_pods(pods)
    )
