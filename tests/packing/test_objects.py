"""The one effective-request rule (`pod_requests`) and the one rounding: sidecars started
before or after a regular init container, overhead, requests defaulted from limits, requests
rounded up and a node's allocatable rounded down."""

from __future__ import annotations

from typing import Any

import pytest

from extender.packing.objects import (
    PodResources,
    QuantityMemo,
    pod_cpu_milli,
    pod_requests,
    read_node,
)
from extender.packing.settings import BudgetSettings, NodeSelection

Json = dict[str, Any]


def _c(name: str, cpu: str | None = None, memory: str | None = None, **extra: Any) -> Json:
    """A container asking in `resources.requests`."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": name, "resources": {"requests": requests}, **extra}


def _sidecar(name: str, cpu: str, memory: str = "0") -> Json:
    return _c(name, cpu, memory, restartPolicy="Always")


def test_app_containers_add_up() -> None:
    spec = {"containers": [_c("a", "1", "1Gi"), _c("b", "500m", "512Mi")]}
    assert pod_requests(spec) == PodResources(1500, 1536)


def test_a_regular_init_container_runs_alone_and_counts_when_larger() -> None:
    spec = {"initContainers": [_c("setup", "4", "4Gi")], "containers": [_c("a", "1", "1Gi")]}
    assert pod_requests(spec) == PodResources(4000, 4096)
    spec["initContainers"] = [_c("setup", "500m", "256Mi")]
    assert pod_requests(spec) == PodResources(1000, 1024)


def test_a_sidecar_started_before_an_init_container_runs_beside_it() -> None:
    # proxy (2) is up while setup (4) runs: 6; afterwards proxy beside the app: 2 + 1.
    spec = {
        "initContainers": [_sidecar("proxy", "2", "1Gi"), _c("setup", "4", "2Gi")],
        "containers": [_c("a", "1", "1Gi")],
    }
    assert pod_requests(spec) == PodResources(6000, 3072)


def test_a_sidecar_started_after_an_init_container_does_not_overlap_it() -> None:
    # setup (4) runs alone; then proxy (2) beside the app (1): max(4, 3).
    spec = {
        "initContainers": [_c("setup", "4", "2Gi"), _sidecar("proxy", "2", "1Gi")],
        "containers": [_c("a", "1", "1Gi")],
    }
    assert pod_requests(spec) == PodResources(4000, 2048)


def test_sidecars_add_to_the_app_containers() -> None:
    spec = {
        "initContainers": [_sidecar("proxy", "2", "1Gi"), _sidecar("log", "500m", "256Mi")],
        "containers": [_c("a", "1", "1Gi")],
    }
    assert pod_requests(spec) == PodResources(3500, 2304)


def test_overhead_comes_on_top() -> None:
    spec = {
        "initContainers": [_c("setup", "4")],
        "containers": [_c("a", "1", "1Gi")],
        "overhead": {"cpu": "250m", "memory": "128Mi"},
    }
    assert pod_requests(spec) == PodResources(4250, 1152)


def test_a_missing_request_defaults_to_the_limit() -> None:
    limits_only = {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}
    both = {
        "name": "b",
        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "4", "memory": "2Gi"}},
    }
    # b: the CPU request counts over its limit; its memory has no request, so the limit does.
    assert pod_requests({"containers": [limits_only, both]}) == PodResources(2500, 3072)


def test_requests_round_up() -> None:
    spec = {"containers": [_c("a", "1500.5m", "1048577")]}  # 1 MiB and one byte
    assert pod_requests(spec) == PodResources(1501, 2)
    assert pod_cpu_milli(spec) == 1501
    assert pod_requests({"containers": [_c("a", "0.0001")]}).cpu_milli == 1


def test_nothing_asked_is_zero_and_garbage_is_ignored() -> None:
    assert pod_requests({}) == PodResources(0, 0)
    spec = {"containers": [_c("a", "lots", "1Gi"), "not a container", {"resources": []}]}
    assert pod_requests(spec) == PodResources(0, 1024)


def _node(cpu: str, memory: str) -> Json:
    return {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def test_allocatable_rounds_down() -> None:
    reading = read_node(_node("1500.5m", "2147483647"), BudgetSettings(), NodeSelection())
    assert reading is not None
    assert (reading.cpu_milli, reading.memory_mib) == (1500, 2047)


@pytest.mark.parametrize("round_up", [True, False])
def test_one_memo_keeps_both_roundings_apart(round_up: bool) -> None:
    memo = QuantityMemo()
    assert memo.milli("1.5m", round_up=not round_up) == (1 if round_up else 2)
    assert memo.milli("1.5m", round_up=round_up) == (2 if round_up else 1)
