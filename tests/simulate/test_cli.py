"""`mpsched simulate` end to end on tiny inputs: exit codes 0/1/2, the table, the JSON shape,
the plot, and a cluster dump as input."""

from __future__ import annotations

import argparse
import io
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from extender.cli import main
from extender.commands.simulate import Progress
from extender.simulate.report import paper_figures
from extender.simulate.seeds import parse_seeds
from extender.simulate.trace import POD_COLUMNS
from tests.simulate.helpers import BENCH, NODE_HEADER, write_csv

Files = Callable[[int], tuple[Path, Path]]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(BENCH, encoding="utf-8")
    return path


def _argv(nodes: Path, pods: Path, config: Path) -> list[str]:
    return ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--config", str(config)]


def test_runs_several_policies_and_writes_json_and_plot(
    trace_files: Files, config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files(40)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = [*_argv(nodes, pods, config_file), "--policy", "fgd,bestfit", "--policy", "default"]
    assert main([*argv, "--seeds", "1-3", "--json", str(out), "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "fgd" in text and "bestfit" in text and "paired bestfit − fgd" in text
    assert captured.err == ""  # no progress bar where stderr is not a terminal
    doc = json.loads(out.read_text())
    assert doc["version"] == 2
    assert doc["trace"] == {
        "nodes": str(nodes),
        "pods": str(pods),
        "gpu_count": 20,
        "pod_count": 40,
    }
    assert (doc["seeds"], doc["config"], doc["tune"]) == ([1, 2, 3], str(config_file), 1.3)
    assert list(doc["policies"]) == ["fgd", "bestfit", "default"]
    run = doc["policies"]["fgd"]
    assert [s["seed"] for s in run["per_seed"]] == [1, 2, 3]
    seed = run["per_seed"][0]
    assert {"alloc_pct_at_100", "curve", "placed", "frag_pct_at_100", "frag_curve"} <= set(seed)
    assert len(seed["curve"]) == len(seed["frag_curve"]) == 131
    values = [s["alloc_pct_at_100"] for s in run["per_seed"]]
    assert run["mean_alloc_pct_at_100"] == pytest.approx(sum(values) / 3)
    assert 0 < run["mean_alloc_pct_at_100"] <= 100
    frags = [s["frag_pct_at_100"] for s in run["per_seed"]]
    assert run["mean_frag_pct_at_100"] == pytest.approx(sum(frags) / 3)
    # Fragmentation is a part of the idle GPU: never more than what is not allocated.
    for s in run["per_seed"]:
        assert all(
            0 <= f <= 100 - a + 1e-9 for f, a in zip(s["frag_curve"], s["curve"], strict=True)
        )
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_one_policy_has_the_same_shape_and_figures(
    trace_files: Files, config_file: Path, tmp_path: Path
) -> None:
    nodes, pods = trace_files(20)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    argv = [*_argv(nodes, pods, config_file), "--seeds", "5,9"]
    assert main([*argv, "--policy", "fgd", "--json", str(one)]) == 0
    assert main([*argv, "--policy", "bestfit,fgd", "--json", str(two)]) == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert list(a["policies"]) == ["fgd"] and a["seeds"] == [5, 9]
    assert {k: v for k, v in a.items() if k != "policies"} == {
        k: v for k, v in b.items() if k != "policies"
    }
    ignore = {"seconds", "mean_seconds_per_seed"}

    def figures(run: dict[str, object]) -> object:
        return json.loads(
            json.dumps(run), object_hook=lambda o: {k: v for k, v in o.items() if k not in ignore}
        )

    assert figures(a["policies"]["fgd"]) == figures(b["policies"]["fgd"])


def test_without_config_the_json_and_the_title_say_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write_csv(tmp_path / "n.csv", NODE_HEADER, ["t,32000,65536,2,T4"])  # a default model
    pods = write_csv(tmp_path / "p.csv", ",".join(POD_COLUMNS), ["a,1000,1,1,500", "b,0,0,1,1000"])
    out = tmp_path / "r.json"
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["config"] == "defaults" and list(doc["policies"]) == ["default"]
    assert "product defaults" in capsys.readouterr().out


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal() -> None:
    quiet = io.StringIO()
    bar = Progress(quiet, total_runs=2)
    bar.start("fgd seed 1")
    bar.update(5, 10)
    bar.close()
    assert quiet.getvalue() == ""
    term = FakeTerminal()
    bar = Progress(term, total_runs=2)
    bar.start("fgd seed 1")
    bar.update(5, 10)
    assert term.getvalue().endswith(" 25.0%")  # half of the first of two runs
    bar.update(10, 10)
    bar.start("fgd seed 2")
    bar.update(10, 10)
    shown = term.getvalue()
    assert "fgd seed 2" in shown and shown.endswith("100.0%") and "#" * Progress.WIDTH in shown
    bar.close()
    assert term.getvalue().endswith("\r")  # the line is cleared for what follows


def test_the_command_draws_progress_on_a_terminal_stderr(
    trace_files: Files, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes, pods = trace_files(20)
    err = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    argv = [*_argv(nodes, pods, config_file), "--policy", "fgd,bestfit", "--seeds", "1,2"]
    assert main(argv) == 0
    shown = err.getvalue()
    assert "bestfit seed 2" in shown and "100.0%" in shown


@pytest.mark.parametrize(
    "extra",
    [
        ["--seeds", "9-1"],
        ["--seeds", "x"],
        ["--seeds", "0-10000000000"],  # ten billion: refused before any list is built
        ["--policy", "nope"],
        ["--tune", "0"],
        ["--cluster", "x.json"],
        ["--bogus"],
    ],
)
def test_bad_usage_exits_2(
    trace_files: Files, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files(5)
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), *extra]) == 2
    err = capsys.readouterr().err
    assert "usage error" in err and len(err.strip().splitlines()) == 1


def test_missing_inputs_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--pods", "p.csv"]) == 2
    assert "--nodes" in capsys.readouterr().err


def test_unreadable_input_exits_1_with_one_line(
    trace_files: Files, tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, _ = trace_files(5)
    argv = ["simulate", "--nodes", str(nodes), "--config", str(config_file)]
    assert main([*argv, "--pods", str(tmp_path / "absent.csv")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent.csv" in err[0]
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,2000,\n")
    assert main([*argv, "--pods", str(bad)]) == 1
    assert "bad.csv:2:" in capsys.readouterr().err


def test_bad_config_exits_1(trace_files: Files, tmp_path: Path) -> None:
    nodes, pods = trace_files(5)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("budgets: {oversubscription: nope}\n")
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--config", str(cfg)]
    assert main(argv) == 1


def _gpu_node(name: str, gpus: int) -> dict[str, object]:
    inventory = [
        {
            "index": i,
            "uuid": f"GPU-{name}-{i}",
            "model": "A100",
            "memoryMiB": 40960,
            "computeCapability": "8.0",
            "maxClients": 48,
            "units": 4,
            "mps": "ready",
        }
        for i in range(gpus)
    ]
    return {
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"mpsched.io/gpus": json.dumps(inventory)}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}},
    }


def _pod(name: str, limits: dict[str, str], cpu: str = "2") -> dict[str, object]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": limits, "requests": {"cpu": cpu}}}
            ]
        },
    }


def test_cluster_dump_replays_through_the_same_core(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "15360",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5",
        "nvidia.com/mps.capable": "true",
    }
    gfd = {"kind": "Node", "metadata": {"name": "gfd", "labels": labels}, "status": {}}
    items = [_gpu_node("a", 4), gfd]
    items += [_pod(f"s{i}", {"mpsched.io/threads": "30"}) for i in range(6)]
    items += [_pod(f"m{i}", {"mpsched.io/memory": "10Gi"}) for i in range(3)]  # loose path
    items += [_pod("w", {"mpsched.io/gpus": "2"}), _pod("cpu", {}, cpu="4")]
    dump = tmp_path / "cluster.json"
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    out = tmp_path / "r.json"
    argv = ["simulate", "--cluster", str(dump), "--seeds", "1", "--policy", "fgd,default"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["trace"] == {"cluster": str(dump), "gpu_count": 6, "pod_count": 11}
    assert doc["policies"]["fgd"]["per_seed"][0]["placed"] >= 11  # everything fits on 6 GPUs


def test_cluster_dump_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "cluster.json"
    dump.write_text(
        json.dumps({"kind": "List", "items": [_pod("p", {"mpsched.io/threads": "500"})]})
    )
    assert main(["simulate", "--cluster", str(dump), "--seeds", "1"]) == 1
    assert "p" in capsys.readouterr().err


def test_paper_figures_only_for_the_paper_trace() -> None:
    assert paper_figures("/x/openb_pod_list_default.csv")["fgd"] == 95.23
    assert paper_figures("/x/pods.csv") == {}
    assert paper_figures(None) == {}


def test_a_seed_range_is_counted_before_it_is_built() -> None:
    """Before: "0-2000000" built a list of two million seeds (72 MB), then refused it."""
    tracemalloc.start()
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="between 1 and"):
            parse_seeds("0-2000000")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20
