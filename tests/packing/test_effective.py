"""One effective-request rule: admission (the webhook's `/mutate`), the ledger (`demand_on` and
`fit_node`) and the simulator (a cluster dump read by `simulate.dump`) give one answer for the
same pod, and that answer is Kubernetes' — checked against a timeline of which containers run at
once, computed here independently of `packing.effective`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.config import Config
from extender.packing.effective import Role, effective
from extender.packing.errors import InvalidRequest
from extender.packing.fit import Fit, fit_node
from extender.packing.ledger import Ledger
from extender.packing.model import ComputeCapability, GpuInfo, NodeInventory
from extender.packing.objects import device_plugin_gpus, pod_requests
from extender.packing.podspec import parse_pod
from extender.packing.request import demand_on
from extender.packing.settings import BudgetSettings
from extender.simulate.dump import read_cluster
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import parse_review
from tests.webhook.reviews import container, pod_object, review

BUDGETS = BudgetSettings(memory_reserve_mib=0)
GPU = GpuInfo(0, "GPU-0", "H100", 81920, ComputeCapability(9, 0), 48, 4)
ADMISSION = AdmissionSettings.from_config(Config.default())

#: One container as a test case: (role, threads asked or None, whole GPUs asked or None, cpu m).
Part = tuple[Role, int | None, int | None, int]


def _container(i: int, part: Part) -> dict[str, Any]:
    role, threads, gpus, cpu = part
    limits = {"cpu": f"{cpu}m"}
    if threads is not None:
        limits["mpsched.io/threads"] = str(threads)
    if gpus is not None:
        limits["mpsched.io/gpus"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    extra = {"restartPolicy": "Always"} if role is Role.SIDECAR else {}
    return container(f"c{i}", limits=limits, **extra)


def _pod(parts: list[Part]) -> dict[str, Any]:
    app = [_container(i, p) for i, p in enumerate(parts) if p[0] is Role.APP]
    init = [_container(i, p) for i, p in enumerate(parts) if p[0] is not Role.APP]
    obj = pod_object(*app, init=init or None)
    obj["metadata"].update(name="p", namespace="default", uid="uid-p")
    return obj


def _timeline_peak(parts: list[Part], value: Callable[[Part], int]) -> int:
    """The most of `value` running at once: each init container with the sidecars started
    before it (and itself, if it is one), then the app containers with every sidecar."""
    peak = 0
    started: list[Part] = []
    for p in parts:
        if p[0] is Role.APP:
            continue
        peak = max(peak, sum(value(q) for q in [*started, p]))
        if p[0] is Role.SIDECAR:
            started.append(p)
    steady = [p for p in parts if p[0] is Role.APP] + started
    return max(peak, sum(value(q) for q in steady))


def _admitted(obj: dict[str, Any]) -> tuple[bool, str]:
    decision = mutate(parse_review(review(obj)), ADMISSION)
    return decision.allowed, decision.message or ""


def _simulated(obj: dict[str, Any], tmp: Path) -> Any:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n0",
            "annotations": {
                "mpsched.io/gpus": json.dumps(
                    [
                        {
                            "index": 0,
                            "uuid": "GPU-0",
                            "model": "H100",
                            "memoryMiB": 81920,
                            "computeCapability": "9.0",
                            "maxClients": 48,
                            "units": 4,
                            "mps": "ready",
                        }
                    ]
                )
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}},
    }
    path = tmp / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [node, obj]}))
    return read_cluster(path, BUDGETS).pods[0]


def test_effective_is_the_largest_of_init_phases_and_steady_state() -> None:
    s, i, a = Role.SIDECAR, Role.INIT, Role.APP
    assert effective([(s, (30,)), (i, (80,)), (a, (10,))], 1) == (110,)
    assert effective([(i, (80,)), (s, (30,)), (a, (10,))], 1) == (80,)
    assert effective([(s, (1, 5)), (s, (2, 0)), (a, (0, 1))], 2) == (3, 6)


def test_a_sidecar_beside_a_large_init_container_is_refused_at_admission() -> None:
    """30 % sidecar, then an 80 % init container: 110 % of one GPU while the init container
    runs. It was admitted, and then every node refused it: Pending for ever."""
    obj = _pod([(Role.SIDECAR, 30, None, 1), (Role.INIT, 80, None, 1), (Role.APP, 10, None, 1)])
    with pytest.raises(InvalidRequest, match=r"threads=110 at once"):
        parse_pod(obj, BUDGETS)
    allowed, message = _admitted(obj)
    assert not allowed
    assert "110" in message
    assert "'c0'" in message


def test_whole_gpus_follow_kubernetes_rule_for_sidecars() -> None:
    """A sidecar with one whole GPU keeps it while a later init container takes two: three at
    once, as Kubernetes computes `nvidia.com/gpu` (it said 2)."""
    obj = _pod([(Role.SIDECAR, None, 1, 1), (Role.INIT, None, 2, 1), (Role.APP, None, 1, 1)])
    request = parse_pod(obj, BUDGETS)
    assert request.whole_gpus == 3
    assert device_plugin_gpus(obj["spec"]) == 3


roles = st.sampled_from([Role.APP, Role.INIT, Role.SIDECAR])
share_parts = st.lists(
    st.tuples(roles, st.integers(1, 100), st.none(), st.integers(1, 4000)), min_size=1, max_size=5
)
whole_parts = st.lists(
    st.tuples(roles, st.none(), st.integers(1, 4), st.integers(1, 4000)), min_size=1, max_size=5
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.one_of(share_parts, whole_parts))
def test_admission_ledger_and_simulator_agree(parts: list[Part], tmp_path: Path) -> None:
    if all(p[0] is not Role.APP for p in parts):
        parts = [*parts, (Role.APP, None, None, 1)]
    obj = _pod(parts)
    threads = _timeline_peak(parts, lambda p: p[1] or 0)
    gpus = _timeline_peak(parts, lambda p: p[2] or 0)
    cpu = _timeline_peak(parts, lambda p: p[3])
    share = any(p[1] is not None for p in parts)
    sharers = sum(p[1] is not None for p in parts)
    # Admission: a share pod needing more than one GPU's threads at once is refused.
    fits_one_gpu = not share or threads <= 100 or sharers < 2
    allowed, message = _admitted(obj)
    assert allowed == fits_one_gpu, message
    assert pod_requests(obj["spec"]).cpu_milli == cpu
    if not allowed:
        return
    request = parse_pod(obj, BUDGETS)
    ledger = Ledger(BUDGETS)
    ledger.set_node(NodeInventory("n0", (GPU, dataclasses.replace(GPU, index=1, uuid="GPU-1"))))
    if share:
        assert demand_on(request, GPU, BUDGETS).threads == threads
        # A single container's threads are within 1..100 by validation: the pod always fits.
        assert isinstance(fit_node(ledger.node("n0"), request, BUDGETS), Fit)
    else:
        assert request.whole_gpus == gpus == device_plugin_gpus(obj["spec"])
        assert isinstance(fit_node(ledger.node("n0"), request, BUDGETS), Fit) == (gpus <= 2)
    sim = _simulated(obj, tmp_path)
    assert sim.cpu_milli == cpu
    assert sim.request == request
