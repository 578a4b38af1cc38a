"""The agent's /metrics text: parsed back with prometheus-client's own parser (and checked by
promtool where it is on PATH), computed from the latest snapshot at scrape time."""

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from extender.agent.metrics import (
    CONTENT_TYPE,
    AgentMetrics,
    AgentSnapshot,
    GpuSnapshot,
    PodSnapshot,
)
from extender.agent.usage import PodUsage

GPU0 = GpuSnapshot(
    index=0,
    uuid="GPU-2f3a6d1c-8b4e-4f7a-9c0d-1e2f3a4b5c6d",
    model="NVIDIA H100 80GB HBM3",
    mps="ready",
    utilization_percent=37,
    memory_used_mib=12_288,
    memory_total_mib=81_559,
    mps_clients=3,
)
# A MIG-enabled GPU: NVML measures no utilisation there.
GPU1 = GpuSnapshot(
    index=1,
    uuid="GPU-7c8d9e0f-1a2b-4c3d-8e4f-5a6b7c8d9e0f",
    model='odd "model"\\name',
    mps="off",
    utilization_percent=None,
    memory_used_mib=None,
    memory_total_mib=81_559,
    mps_clients=0,
)
POD_A = PodSnapshot(
    namespace="ml",
    name="a",
    uid="uid-a",
    gpu_index=0,
    used_mib=8300,
    allowed_mib=8192,
    over_share=True,
    clients=1,
)
POD_C = PodSnapshot(
    namespace="ml",
    name="c",
    uid="uid-c",
    gpu_index=0,
    used_mib=4000,
    allowed_mib=None,
    over_share=False,
    clients=2,
)
SNAPSHOT = AgentSnapshot(
    node="gpu-1",
    gpus=(GPU0, GPU1),
    pods=(POD_A, POD_C),
    daemon_up=True,
    daemon_restarts=2,
    nvml_errors=5,
    unknown_clients=1,
)


def _samples(text: bytes) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text.decode()):
        assert family.documentation, f"{family.name} has no help text"
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    (match,) = [s for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return match.value


def test_nothing_is_exposed_before_the_first_snapshot() -> None:
    metrics = AgentMetrics()
    assert metrics.snapshot is None
    assert _samples(metrics.render()) == {}


def test_every_family_shows_the_snapshot() -> None:
    metrics = AgentMetrics(clock=lambda: 1_700_000_000.0)
    metrics.update(SNAPSHOT)
    s = _samples(metrics.render())
    g0 = {"node": "gpu-1", "gpu": "0"}
    g1 = {"node": "gpu-1", "gpu": "1"}
    assert _value(s, "mpsched_agent_gpu_memory_used_mib", **g0) == 12_288
    assert _value(s, "mpsched_agent_gpu_memory_total_mib", **g1) == 81_559
    assert _value(s, "mpsched_agent_gpu_utilization_percent", **g0) == 37
    assert _value(s, "mpsched_agent_gpu_mps_clients", **g0) == 3
    assert _value(s, "mpsched_agent_gpu_info", **g1, model='odd "model"\\name') == 1
    assert _value(s, "mpsched_agent_gpu_mps_state", **g0, state="ready") == 1
    assert _value(s, "mpsched_agent_gpu_mps_state", **g0, state="down") == 0
    assert _value(s, "mpsched_agent_gpu_mps_state", **g1, state="off") == 1
    # What NVML could not tell is left out, not shown as 0.
    assert [x.labels["gpu"] for x in s["mpsched_agent_gpu_utilization_percent"]] == ["0"]
    assert [x.labels["gpu"] for x in s["mpsched_agent_gpu_memory_used_mib"]] == ["0"]
    a = {"node": "gpu-1", "namespace": "ml", "pod": "a", "uid": "uid-a", "gpu": "0"}
    assert _value(s, "mpsched_agent_pod_memory_used_mib", **a) == 8300
    assert _value(s, "mpsched_agent_pod_memory_allowed_mib", **a) == 8192
    assert _value(s, "mpsched_agent_pod_over_share", **a) == 1
    assert _value(s, "mpsched_agent_pod_mps_clients", **a) == 1
    assert _value(s, "mpsched_agent_pod_over_share", pod="c") == 0
    # c's share has no memory budget: no allowed series for it.
    assert [x.labels["pod"] for x in s["mpsched_agent_pod_memory_allowed_mib"]] == ["a"]
    assert _value(s, "mpsched_agent_mps_daemon_up", node="gpu-1") == 1
    assert _value(s, "mpsched_agent_mps_daemon_restarts_total", node="gpu-1") == 2
    assert _value(s, "mpsched_agent_nvml_errors_total", node="gpu-1") == 5
    assert _value(s, "mpsched_agent_unknown_mps_clients", node="gpu-1") == 1
    assert _value(s, "mpsched_agent_snapshot_timestamp_seconds", node="gpu-1") == 1.7e9
    assert all(name.startswith("mpsched_agent_") for name in s)
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_a_scrape_shows_the_latest_snapshot_and_only_it() -> None:
    metrics = AgentMetrics()
    metrics.update(SNAPSHOT)
    later = AgentSnapshot(node="gpu-1", gpus=(GPU0,), daemon_up=False, daemon_restarts=3)
    metrics.update(later)
    assert metrics.snapshot is later
    s = _samples(metrics.render())
    assert _value(s, "mpsched_agent_mps_daemon_up", node="gpu-1") == 0
    assert _value(s, "mpsched_agent_mps_daemon_restarts_total", node="gpu-1") == 3
    assert len(s["mpsched_agent_gpu_info"]) == 1
    assert "mpsched_agent_pod_over_share" not in s


def test_an_unknown_mps_state_gets_its_own_series() -> None:
    metrics = AgentMetrics()
    metrics.update(AgentSnapshot(node="n", gpus=(replace(GPU0, mps="odd"),)))
    states = {
        x.labels["state"]: x.value
        for x in _samples(metrics.render())["mpsched_agent_gpu_mps_state"]
    }
    assert states == {"ready": 0, "down": 0, "foreign": 0, "off": 0, "odd": 1}


def test_pod_snapshots_come_from_usage_rows() -> None:
    usage = PodUsage(
        pod_uid="uid-a",
        namespace="ml",
        name="a",
        gpu_index=0,
        used_mib=8300,
        allowed_mib=8192,
        clients=1,
        allowed_clients=1,
        over_share=True,
        reason="uses 8300 MiB on GPU 0, allowed 8192 MiB",
    )
    assert PodSnapshot.of(usage) == POD_A


def test_registries_are_separate_and_never_the_default() -> None:
    one, two = AgentMetrics(), AgentMetrics()
    one.update(SNAPSHOT)
    assert one.registry is not two.registry and one.registry is not REGISTRY
    assert _samples(two.render()) == {}
    assert REGISTRY.get_sample_value("mpsched_agent_mps_daemon_up", {"node": "gpu-1"}) is None


def test_render_in_another_thread_while_updating() -> None:
    metrics = AgentMetrics()
    metrics.update(SNAPSHOT)
    errors: list[BaseException] = []

    def scrape() -> None:
        try:
            for _ in range(50):
                names = _samples(metrics.render())
                assert "mpsched_agent_mps_daemon_up" in names
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=scrape)
    thread.start()
    for i in range(200):
        metrics.update(AgentSnapshot(node="gpu-1", gpus=(GPU0,), daemon_restarts=i))
    thread.join(10)
    assert not thread.is_alive() and errors == []


def test_promtool_accepts_the_text() -> None:
    metrics = AgentMetrics()
    metrics.update(SNAPSHOT)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (apt-get install prometheus provides it)")
    check = subprocess.run(
        [promtool, "check", "metrics"],
        input=metrics.render(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert check.returncode == 0, (check.stdout + check.stderr).decode()
