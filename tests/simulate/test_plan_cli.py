"""`mpsched plan` end to end on hand-made inputs: the answer per strategy in the table and the
JSON (the keys scripts read), the HTML report written, the exit codes 0/1/2, a trace without
times, sizing by a node type, and the what-if on a cluster dump."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from extender.cli import main
from extender.commands.plan import Progress
from extender.packing.codec import INVENTORY_KEY
from tests.simulate.helpers import NODE_HEADER, POD_HEADER, write_csv

CONFIG = """
budgets: {memoryReserveMiB: 0, clientOverheadMiB: 0, preVolta: share}
gpuModels:
  G2: {memoryMiB: 32768, computeCapability: "7.0"}
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    """Pool: 1-GPU nodes. Workload: 30+30+30+10 % alive together for 100 s (one GPU with
    mpsched, 7 quarter units = 2 GPUs with equal:4, 4 whole GPUs), then a whole-GPU pod alone."""
    nodes = write_csv(
        tmp_path / "nodes.csv", NODE_HEADER, [f"n{i},64000,262144,1,G2" for i in range(4)]
    )
    rows = [
        f"p{i},1000,1024,1,{milli},,LS,Running,0,100,0"
        for i, milli in enumerate((300, 300, 300, 100))
    ]
    rows.append("w,1000,1024,1,1000,,LS,Running,500,600,500")
    return nodes, write_csv(tmp_path / "pods.csv", POD_HEADER, rows)


def plan(trace: tuple[Path, Path], config: Path, *extra: str) -> list[str]:
    nodes, pods = trace
    return ["plan", "--nodes", str(nodes), "--pods", str(pods), "--config", str(config), *extra]


def test_answers_per_strategy_in_table_json_and_report(
    trace: tuple[Path, Path], config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, html = tmp_path / "plan.json", tmp_path / "plan.html"
    argv = plan(trace, config_file, "--seeds", "1-3", "--jobs", "1")
    assert main([*argv, "--json", str(out), "--report", str(html)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no progress bar where stderr is not a terminal
    assert "lower bound: 1 GPUs" in captured.out
    assert "default saves 3.0 GPUs vs whole" in captured.out
    doc = json.loads(out.read_text())
    assert doc["lower_bound_gpus"] == 1
    needed = {name: s["gpus_needed"] for name, s in doc["strategies"].items()}
    assert needed["whole"] == {
        "per_seed": {"1": 4, "2": 4, "3": 4},
        "mean": 4.0,
        "min": 4,
        "max": 4,
    }
    assert needed["equal:4"]["per_seed"] == {"1": 2, "2": 2, "3": 2}
    assert needed["default"]["mean"] == 1.0
    saving = {(s["mpsched"], s["against"]): s["mean"] for s in doc["savings"]}
    assert saving == {("default", "whole"): 3.0, ("default", "equal:4"): 1.0}
    assert doc["inputs"]["seeds"] == [1, 2, 3] and doc["inputs"]["load"] == 1.0
    assert set(doc["columns"]) >= {"gpus_needed", "demand_placed", "busy_gpus", "paper_alloc_pct"}
    # Every strategy replayed on the smallest cluster any needed (1 GPU): the others wait there.
    comparison = doc["comparison"]
    assert comparison["gpus"] == 1
    whole = comparison["strategies"]["whole"]
    assert (whole["placed"], whole["waited"], whole["wait_max"]) == (5, 3, 300.0)
    assert len(whole["curves"]["busy_gpus"]) == 240
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "lower bound <b>1</b> GPUs" in page
    assert "http://" not in page and "https://" not in page


def test_usage_errors_exit_2_and_failures_exit_1(
    trace: tuple[Path, Path], config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(plan(trace, config_file, "--strategies", "whole,equal:0")) == 2
    assert "equal:N needs a whole N" in capsys.readouterr().err
    assert main(["plan", "--nodes", str(trace[0])]) == 2
    assert main(plan(trace, config_file, "--load", "0")) == 2
    assert main(plan(trace, config_file, "--node-type", "G9:1")) == 2
    assert "unknown GPU model 'G9'" in capsys.readouterr().err
    missing = tmp_path / "none.csv"
    assert (
        main(
            ["plan", "--nodes", str(trace[0]), "--pods", str(missing), "--config", str(config_file)]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("mpsched: plan:") and "none.csv" in err and "Traceback" not in err


def test_a_trace_without_times_needs_a_rate(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write_csv(tmp_path / "n.csv", NODE_HEADER, ["n0,64000,262144,2,G2"])
    pods = write_csv(
        tmp_path / "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        [f"p{i},1000,1024,1,500" for i in range(20)],
    )
    argv = ["plan", "--nodes", str(nodes), "--pods", str(pods), "--config", str(config_file)]
    assert main(argv) == 2
    assert "give --rate and --lifetime" in capsys.readouterr().err
    out = tmp_path / "p.json"
    drawn = [*argv, "--rate", "0.01", "--lifetime", "60", "--seeds", "1,2", "--jobs", "2"]
    assert main([*drawn, "--json", str(out), "--node-type", "G2:2"]) == 0
    doc = json.loads(out.read_text())
    assert doc["inputs"]["times"].startswith("drawn: 0.01 pods/s")
    assert doc["inputs"]["sizing"] == "counts of G2:2"
    for s in doc["strategies"].values():
        assert all(g is not None and g % 2 == 0 for g in s["gpus_needed"]["per_seed"].values())


def test_times_are_all_or_none(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write_csv(tmp_path / "n.csv", NODE_HEADER, ["n0,64000,262144,2,G2"])
    rows = ["a,1000,1024,1,500,,LS,Running,,,", "b,1000,1024,1,500,,LS,Running,5,9,5"]
    pods = write_csv(tmp_path / "p.csv", POD_HEADER, rows)
    argv = ["plan", "--nodes", str(nodes), "--pods", str(pods), "--config", str(config_file)]
    assert main(argv) == 1
    assert "p.csv:3: creation_time (column 9): line 2 has no times" in capsys.readouterr().err
    pods.write_text(POD_HEADER + "\na,1000,1024,1,500,,LS,Running,9,5,9\n")
    assert main(argv) == 1
    assert "5 is before creation_time 9" in capsys.readouterr().err


def test_the_progress_bar_shows_an_eta_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = Progress(stream)
    bar.update(1, 4)
    assert "1/4 jobs" in stream.getvalue() and "ETA" in stream.getvalue()
    quiet = io.StringIO()
    Progress(quiet).update(1, 4)
    assert quiet.getvalue() == ""


def _node(name: str) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": f"GPU-{name}", "model": "G2", "memoryMiB": 32768}
    gpu.update({"computeCapability": "7.0", "units": 4, "mps": "ready"})
    meta = {"name": name, "annotations": {INVENTORY_KEY: json.dumps([gpu])}}
    return {
        "kind": "Node",
        "metadata": meta,
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}},
    }


def _pod(name: str, threads: int, node: str = "", phase: str = "Pending") -> dict[str, Any]:
    limits = {"mpsched.io/threads": str(threads)}
    container = {"name": "main", "resources": {"requests": {"cpu": "1"}, "limits": limits}}
    # One user for every pod: a share pod whose user is unknown shares no GPU.
    spec: dict[str, Any] = {"containers": [container], "securityContext": {"runAsUser": 1000}}
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}"}
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_what_if_on_a_cluster_dump(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One 1-GPU node running 60 %; pending: 30 % (fits), 50 % and 70 % (do not). With one more
    # node like it, 30 + 50 + 70 still do not fit in the 40 + 100 left; with two they do.
    items = [
        _node("gpu-a"),
        _pod("running", 60, node="gpu-a", phase="Running"),
        _pod("done", 90, node="gpu-a", phase="Succeeded"),
        _pod("small", 30),
        _pod("mid", 50),
        _pod("large", 70),
    ]
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"kind": "List", "items": items}))
    out = tmp_path / "whatif.json"
    argv = [
        "plan",
        "--cluster",
        str(dump),
        "--config",
        str(config_file),
        "--strategies",
        "default,whole",
    ]
    assert main([*argv, "--add-node-type", "gpu-a", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "default: 1 of 3 pending pods fit now; add 2 × gpu-a" in text
    doc = json.loads(out.read_text())
    ours = doc["strategies"]["default"]
    assert ours["now"]["do_not_fit"] == ["ml/large", "ml/mid"]
    assert ours["now"]["placement"]["ml/small"] == "gpu-a"
    assert ours["add_nodes"] == 2 and ours["with_added"]["do_not_fit"] == []
    # Whole GPUs: the running pod holds the node's one GPU, so every pending pod needs its own.
    assert doc["strategies"]["whole"]["add_nodes"] == 3
    assert main([*argv, "--nodes", "x.csv"]) == 2
