"""The synthetic held-out mixes: model pinning keeps the pods, pins the asked share of GPU
pods, and only to a model with a node that can host the pod."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from extender.simulate import synthetic
from extender.simulate.synthetic import Host, pin_weights, pods, read_hosts, write_csv

HOSTS = (
    Host("G2", 8, 96_000, 393_216),
    Host("G2", 8, 96_000, 393_216),
    Host("G2", 8, 96_000, 393_216),
    Host("T4", 2, 104_000, 786_432),
    Host("A10", 1, 8_000, 32_768),
)


def test_pinning_keeps_the_pods_and_pins_the_asked_share_of_gpu_pods() -> None:
    plain = list(pods("uniform", seed=3, gpus=800))
    pinned = list(pods("uniform", seed=3, gpus=800, pin=0.33, hosts=HOSTS))
    assert [r[:5] for r in pinned] == [r[:5] for r in plain]
    assert all(r[5] == "" for r in plain)
    gpu_pods = [r for r in pinned if r[3] > 0]
    share = sum(1 for r in gpu_pods if r[5]) / len(gpu_pods)
    assert len(gpu_pods) > 800
    assert 0.28 < share < 0.38
    assert all(r[5] == "" for r in pinned if r[3] == 0)


def test_a_pod_is_pinned_only_to_a_model_that_can_host_it() -> None:
    rows = list(pods("whole-heavy", seed=1, gpus=800, pin=1.0, hosts=HOSTS))
    for _, cpu, memory, num, _, spec in rows:
        if num == 0:
            continue
        hostable = {
            h.model
            for h in HOSTS
            if h.gpus >= num and h.cpu_milli >= cpu and h.memory_mib >= memory
        }
        assert (spec in hostable) if hostable else spec == ""
    assert "G2" in {r[5] for r in rows if r[3] == 8}


def test_models_are_drawn_by_gpus_or_with_skew_by_their_square_root() -> None:
    assert pin_weights(HOSTS, skew=False) == {"A10": 1.0, "G2": 24.0, "T4": 2.0}
    assert pin_weights(HOSTS, skew=True) == pytest.approx({"A10": 1.0, "G2": 24**0.5, "T4": 2**0.5})


def test_pinning_needs_the_nodes_and_a_fraction() -> None:
    with pytest.raises(ValueError, match="nodes"):
        next(pods("uniform", seed=1, gpus=10, pin=0.1))
    with pytest.raises(ValueError, match="pin"):
        next(pods("uniform", seed=1, gpus=10, pin=1.5, hosts=HOSTS))


def test_the_command_writes_gpu_spec_from_a_node_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,96000,393216,8,G2\n")
    assert read_hosts(nodes) == (Host("G2", 8, 96_000, 393_216),)
    argv = ["--mix", "cpu-bound", "--gpus", "50", "--pin", "1", "--nodes", str(nodes)]
    assert synthetic.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
    specs = {line.rsplit(",", 1)[1] for line in lines[1:] if line.split(",")[3] != "0"}
    assert specs == {"G2"}
    out = io.StringIO()
    write_csv([("p", 1000, 4096, 1, 500, "T4")], out)
    assert out.getvalue().endswith("p,1000,4096,1,500,T4\n")
