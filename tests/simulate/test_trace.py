"""The openb CSV reader: shapes and requests of trace pods, node inventories, both pod column
sets (the short one replays exactly as the full one), and errors that name file, line and
column."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from extender.config import Config
from extender.packing.codec import decode_inventory
from extender.packing.codec_labels import inventory_from_labels
from extender.packing.ledger import Ledger
from extender.packing.policies import PodShape, make_policy, typical_workload
from extender.simulate.replay import run_seed
from extender.simulate.trace import POD_COLUMNS, read_nodes, read_pods, trace_pod
from extender.simulate.types import Cluster, TraceError
from tests.simulate.helpers import NODE_HEADER, NODES, POD_HEADER, pod_rows, write_csv

SHORT_HEADER = ",".join(POD_COLUMNS)


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
    a, b = read_nodes(path, bench_config.gpu_models, budgets=bench_config.budgets)
    assert (a.cpu_milli, a.memory_mib, a.model) == (64000, 1024, "P100")
    assert [g.max_clients for g in a.inventory.gpus] == [16, 16]  # pre-Volta
    assert a.inventory.gpus[1].memory_mib == 16280
    assert b.inventory.gpus == ()


def _short(rows: list[str]) -> list[str]:
    """The same pods in the short column set (the first five columns)."""
    return [",".join(r.split(",")[:5]) for r in rows]


def test_the_short_column_set_reads_as_the_full_one_without_constraints(tmp_path: Path) -> None:
    full = read_pods(write_csv(tmp_path / "full.csv", POD_HEADER, pod_rows(14)))
    short = read_pods(write_csv(tmp_path / "short.csv", SHORT_HEADER, _short(pod_rows(14))))
    assert short == full
    assert all(not p.shape.models for p in short)  # no gpu_spec: any model


def test_the_short_column_set_replays_exactly_as_the_full_one(
    tmp_path: Path, bench_config: Config
) -> None:
    nodes = read_nodes(
        write_csv(tmp_path / "n.csv", NODE_HEADER, NODES),
        bench_config.gpu_models,
        budgets=bench_config.budgets,
    )
    rows = pod_rows(50)
    # Full rows with times and phases that an ordering by time, or a filter on the phase,
    # would act on: the replay must not.
    timed = [
        r.replace(",LS,Running,0,,", f",BE,Failed,{900 - i},{1000 - i},")
        for i, r in enumerate(rows)
    ]
    full = Cluster(nodes, read_pods(write_csv(tmp_path / "full.csv", POD_HEADER, timed)))
    short = Cluster(nodes, read_pods(write_csv(tmp_path / "s.csv", SHORT_HEADER, _short(rows))))
    workload = typical_workload(p.shape for p in full.pods)
    policy = make_policy("fgd", workload=workload, settings=bench_config.policy)
    a = run_seed(full, policy, bench_config.budgets, 3)
    b = run_seed(short, policy, bench_config.budgets, 3)
    assert (a.curve, a.placed) == (b.curve, b.placed)
    assert a.placed > 0


def test_columns_in_any_order_with_extras_a_bom_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        "\ufeffgpu_milli, num_gpu ,name,extra,memory_mib,cpu_milli,gpu_spec\n"
        "500,1,s,zzz,100,3000,T4|G2\n\n"
        "1000.0,2,w,,,8000,\n",
        encoding="utf-8",
    )
    s, w = read_pods(path)
    assert s.shape == PodShape(3000, 50, 1, frozenset({"T4", "G2"}))
    assert (w.shape, w.memory_mib) == (PodShape(8000, 100, 2), 0)  # empty cell: no request


def _bad_pods(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceError) as caught:
        read_pods(path)
    return str(caught.value)


OK = "ok,1000,1,1,500\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"p\.csv:1: empty file: expected a header with name, cpu_milli, memory_mib"),
        (SHORT_HEADER + "\n", r"p\.csv: no pods"),
        (
            "name,cpu_milli,num_gpu,gpu_milli\np,1,1,1\n",
            r"p\.csv:1: missing column\(s\) memory_mib \(required: name, cpu_milli, memory_mib",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,cpu_milli,gpu_milli\n",
            r"p\.csv:1: cpu_milli \(column 5\): duplicate column \(also column 2\)",
        ),
        (
            SHORT_HEADER + "\n" + OK + "p,1000,x,1,500\n",
            r"p\.csv:3: memory_mib \(column 3\): 'x' is not an integer",
        ),
        (SHORT_HEADER + "\np,1000,1,1,0.5\n", r"p\.csv:2: gpu_milli \(column 5\): '0.5' is not"),
        (
            SHORT_HEADER + "\n" + OK + "p,-5,1,1,500\n",
            r"p\.csv:3: cpu_milli \(column 2\): -5 is neg",
        ),
        (
            SHORT_HEADER + "\n" + OK + "p,1000,1,1,1500\n",
            r"p\.csv:3: gpu_milli \(column 5\): 1500 with num_gpu 1",
        ),
        (
            SHORT_HEADER + "\n" + OK + "p,1000,1,2,500\n",
            r"p\.csv:3: gpu_milli \(column 5\): 500 with num_gpu 2",
        ),
        (SHORT_HEADER + "\n" + OK + OK, r"p\.csv:3: name \(column 1\): pod 'ok' already on line 2"),
        (SHORT_HEADER + "\n" + ",1,1,0,0\n", r"p\.csv:2: name \(column 1\): empty pod name"),
        (
            SHORT_HEADER + "\n" + OK + "p,1,1,0,0,extra\n",
            r"p\.csv:3: column 6: 6 cells, but the header has 5 columns",
        ),
        (SHORT_HEADER + '\np,"1\n', r"p\.csv:\d+: unexpected end of data"),
    ],
)
def test_bad_pod_files_name_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    assert re.search(message, _bad_pods(tmp_path, text))


@pytest.mark.parametrize(
    ("header", "rows", "message"),
    [
        (NODE_HEADER, ["a,64000,1024,2,H900"], r"n\.csv:2: model \(column 5\): unknown GPU model"),
        (
            NODE_HEADER,
            ["a,64000,1024,2,G2", "b,lots,1,1,G2"],
            r"n\.csv:3: cpu_milli \(column 2\): 'lots' is not an integer",
        ),
        (NODE_HEADER, ["a,-5,1024,2,G2"], r"n\.csv:2: cpu_milli \(column 2\): -5 is negative"),
        (
            NODE_HEADER,
            ["a,1,1,2,"],
            r"n\.csv:2: model \(column 5\): node a has 2 GPUs but no model",
        ),
        (
            NODE_HEADER,
            ["a,1,1,2,G2", "a,1,1,2,G2"],
            r"n\.csv:3: sn \(column 1\): node 'a' already on line 2",
        ),
        (NODE_HEADER, ["a,1,1,0,"], r"n\.csv: no node has a GPU"),
        (NODE_HEADER, [], r"n\.csv: no nodes"),
        ("sn,cpu_milli,memory_mib,gpu", ["a,1,1,2"], r"n\.csv:1: missing column\(s\) model"),
        ("sn,sn,cpu_milli,memory_mib,gpu,model", [], r"n\.csv:1: sn \(column 2\): duplicate"),
    ],
)
def test_bad_node_files_name_file_line_and_column(
    tmp_path: Path, bench_config: Config, header: str, rows: list[str], message: str
) -> None:
    path = write_csv(tmp_path / "n.csv", header, rows)
    with pytest.raises(TraceError, match=message):
        read_nodes(path, bench_config.gpu_models, budgets=bench_config.budgets)


def test_empty_node_file(tmp_path: Path, bench_config: Config) -> None:
    path = tmp_path / "n.csv"
    path.write_text("")
    with pytest.raises(TraceError, match=r"n\.csv:1: empty file: expected a header with sn"):
        read_nodes(path, bench_config.gpu_models, budgets=bench_config.budgets)


def test_missing_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"absent\.csv: cannot read"):
        read_pods(tmp_path / "absent.csv")
    path = tmp_path / "p.csv"
    path.write_bytes(b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\xff\xfe,1,1,0,0\n")
    with pytest.raises(TraceError, match=r"p\.csv: not UTF-8 text"):
        read_pods(path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,64000,1024,100000000,G2", r"gpu \(column 4\): 100000000 is above 64"),
        ("a,64000,1024,65,G2", r"gpu \(column 4\): 65 is above 64"),
        ("a,1e300,1024,2,G2", r"cpu_milli \(column 2\): 1e300 is above 1000000000"),
        ("a,1,99999999999999999999999,2,G2", r"memory_mib \(column 3\): 9{23} is above 4294967296"),
    ],
)
def test_node_sizes_out_of_range_are_one_error(
    tmp_path: Path, bench_config: Config, row: str, message: str
) -> None:
    """Before: gpu=100000000 built a hundred million GPUs (55 s, 3.8 GB, then MemoryError)."""
    path = write_csv(tmp_path / "n.csv", NODE_HEADER, [row])
    with pytest.raises(TraceError, match=r"n\.csv:2: " + message):
        read_nodes(path, bench_config.gpu_models, budgets=bench_config.budgets)


def test_a_node_file_of_too_many_gpus_in_all_is_one_error(
    tmp_path: Path, bench_config: Config
) -> None:
    rows = [f"n{i},64000,1024,64,G2" for i in range(15_626)]  # 1,000,064 GPUs
    path = write_csv(tmp_path / "n.csv", NODE_HEADER, rows)
    with pytest.raises(TraceError, match=r"n\.csv:15627: gpu \(column 4\): more than 1,000,000"):
        read_nodes(path, bench_config.gpu_models, budgets=bench_config.budgets)


def test_pod_sizes_out_of_range_are_one_error(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(SHORT_HEADER + "\np,1000,1,100000000,1000\n")
    with pytest.raises(TraceError, match=r"p\.csv:2: num_gpu \(column 4\): 100000000 is above 64"):
        read_pods(path)


@pytest.mark.parametrize("cap", [None, 4, 30])
def test_serve_and_simulate_give_a_gpu_the_same_client_budget(
    cap: int | None, tmp_path: Path, bench_config: Config
) -> None:
    """The configured client cap is applied once, where an inventory is built: a T4 read from
    the trace, from GPU Feature Discovery labels, and from an agent's annotation that claims
    more clients than the cap, all serve the same number of MPS clients, in the inventory and
    in the ledger's budget. (The trace reader gave the architecture's 48, and only the ledger
    applied the cap, a second time.)"""
    budgets = dataclasses.replace(bench_config.budgets, max_clients_per_gpu=cap)
    path = write_csv(tmp_path / "n.csv", NODE_HEADER, ["t,8000,1024,1,T4"])
    (traced,) = read_nodes(path, bench_config.gpu_models, budgets=budgets)
    labels = {
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "15109",
        "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5",
        "nvidia.com/gpu.product": "T4",
        "nvidia.com/gpu.sharing-strategy": "mps",
    }
    labelled = inventory_from_labels("l", labels, budgets=budgets)
    claim = {"index": 0, "uuid": "GPU-a-0", "model": "T4", "memoryMiB": 15109}
    annotated = decode_inventory(
        "a",
        json.dumps([{**claim, "computeCapability": "7.5", "maxClients": 48, "units": 4}]),
        budgets=budgets,
    )
    assert labelled is not None
    expected = 48 if cap is None else cap
    for inventory in (traced.inventory, labelled, annotated):
        ledger = Ledger(budgets)
        ledger.set_node(inventory)
        assert inventory.gpus[0].max_clients == expected, inventory.name
        assert ledger.node(inventory.name).gpus[0].capacity.clients == expected, inventory.name
