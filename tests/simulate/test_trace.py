"""The openb CSV reader: shapes and requests of trace pods, node inventories, and errors that
name the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.config import Config
from extender.packing.policies import PodShape
from extender.simulate.trace import read_nodes, read_pods, trace_pod
from extender.simulate.types import TraceError
from tests.simulate.helpers import NODE_HEADER, POD_HEADER, write_csv


def test_trace_pods_map_milli_to_thread_percent() -> None:
    share = trace_pod("s", 3152, 100, 1, 810, "")
    assert share.shape == PodShape(3152, 81, 1)
    assert share.request.kind == "share"
    assert share.request.containers[0].threads == 81
    assert share.request.containers[0].memory_mib is None  # follows threads proportionally
    assert trace_pod("w", 8000, 1, 8, 1000, "").shape == PodShape(8000, 100, 8)
    assert trace_pod("w", 8000, 1, 8, 1000, "").request.whole_gpus == 8
    assert trace_pod("c", 8000, 1, 0, 0, "").request.kind == "none"
    assert trace_pod("m", 1, 1, 1, 500, "V100M16|V100M32").shape.models == {"V100M16", "V100M32"}


def test_nodes_get_the_configured_models_and_client_limits(
    tmp_path: Path, bench_config: Config
) -> None:
    path = write_csv(tmp_path / "n.csv", NODE_HEADER, ["a,64000,1024,2,P100", "b,1000,1,0,"])
    a, b = read_nodes(path, bench_config.gpu_models, units=4)
    assert (a.cpu_milli, a.memory_mib, a.model) == (64000, 1024, "P100")
    assert [g.max_clients for g in a.inventory.gpus] == [16, 16]  # pre-Volta
    assert a.inventory.gpus[1].memory_mib == 16280
    assert b.inventory.gpus == ()


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["a,64000,1024,2,H900"], r"n\.csv:2: unknown GPU model 'H900'"),
        (["a,64000,1024,2,G2", "b,lots,1,1,G2"], r"n\.csv:3: cpu_milli 'lots' is not an integer"),
        (["a,-5,1024,2,G2"], r"n\.csv:2: cpu_milli -5 is negative"),
        ([], r"n\.csv: no nodes"),
    ],
)
def test_bad_node_rows_name_the_line(
    tmp_path: Path, bench_config: Config, rows: list[str], message: str
) -> None:
    path = write_csv(tmp_path / "n.csv", NODE_HEADER, rows)
    with pytest.raises(TraceError, match=message):
        read_nodes(path, bench_config.gpu_models, units=4)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p,1000,1,1,1500,,LS,Running,0,,", r"p\.csv:3: gpu_milli 1500 with num_gpu 1"),
        ("p,1000,1,2,500,,LS,Running,0,,", r"p\.csv:3: gpu_milli 500 with num_gpu 2"),
        ("p,1000,x,1,500,,LS,Running,0,,", r"p\.csv:3: memory_mib 'x' is not an integer"),
    ],
)
def test_bad_pod_rows_name_the_line(tmp_path: Path, row: str, message: str) -> None:
    path = write_csv(tmp_path / "p.csv", POD_HEADER, ["ok,1000,1,1,500,,LS,Running,0,,", row])
    with pytest.raises(TraceError, match=message):
        read_pods(path)


def test_missing_file_and_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_pods(tmp_path / "absent.csv")
    path = write_csv(tmp_path / "p.csv", "name,cpu_milli", ["a,1"])
    with pytest.raises(TraceError, match=r"p\.csv:1: missing column\(s\) memory_mib"):
        read_pods(path)
