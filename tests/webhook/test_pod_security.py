"""Issue 31: share pods as the webhook mutates them, and every workload the deploy/ roots
render, pass Pod Security `baseline` (tests/webhook/pod_security.py, the API server's checks):
no hostIPC, no hostPath. The node agent's DaemonSet is the one exception: node infrastructure
(the MPS daemon, the kubelet's device-plugin socket), alone in the `privileged` namespace
mpsched-node. Under `delivery: hostIPC` a share pod fails baseline: the documented risk."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from extender.config import Config
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import parse_review
from tests.deploy.manifests import pod_spec, render, roots
from tests.webhook.pod_security import baseline_problems
from tests.webhook.reviews import Json, apply_patch, container, pod_object, review

DEFAULT = AdmissionSettings.from_config(Config.default())
HOST_IPC = dataclasses.replace(
    DEFAULT, webhook=dataclasses.replace(DEFAULT.webhook, delivery="hostIPC")
)
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet")
#: The one workload outside `baseline`, and its namespace (enforce: privileged).
AGENT = ("mpsched-node", "mpsched-agent")

SHAPES: dict[str, Json] = {
    "share": pod_object(container(limits={"mpsched.io/threads": "25", "mpsched.io/memory": "4Gi"})),
    "units": pod_object(container(limits={"mpsched.io/units": "2"})),
    "whole": pod_object(container(limits={"mpsched.io/gpus": "1"})),
    "sidecars": pod_object(
        container("trainer", limits={"mpsched.io/threads": "30"}),
        container("logs"),
        init=[container("fetch", limits={"mpsched.io/threads": "10"}), container("setup")],
    ),
}


def _mutated(obj: Json, settings: AdmissionSettings) -> Json:
    decision = mutate(parse_review(review(obj)), settings)
    assert decision.allowed, decision.message
    return apply_patch(obj, decision.patch)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_mutated_share_pod_passes_baseline(shape: str) -> None:
    pod = _mutated(SHAPES[shape], DEFAULT)
    assert baseline_problems(pod) == []
    spec = pod["spec"]
    assert "hostIPC" not in spec
    assert not [v for v in spec["volumes"] if "hostPath" in v]


def test_host_ipc_delivery_fails_baseline_as_documented() -> None:
    pod = _mutated(SHAPES["share"], HOST_IPC)
    assert baseline_problems(pod) == [
        "hostNamespaces: hostIPC",
        "hostPathVolumes: mpsched-mps-pipe",
    ]


@pytest.mark.parametrize("root", roots())
def test_every_rendered_workload_passes_baseline_but_the_node_agent(root: str) -> None:
    seen = []
    for doc in render(root):
        if doc["kind"] not in WORKLOADS:
            continue
        meta = doc["metadata"]
        key = (meta.get("namespace"), meta["name"])
        template = {"metadata": doc["spec"]["template"].get("metadata", {}), "spec": pod_spec(doc)}
        if key == AGENT:
            assert baseline_problems(template), "the agent needs the privileged namespace"
            continue
        seen.append(key)
        assert baseline_problems(template) == [], key
        spec = template["spec"]
        assert not spec.get("hostIPC") and not [
            v for v in spec.get("volumes", []) if "hostPath" in v
        ]
    assert seen  # the webhook and the extender at least
    namespaces = {
        d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for d in render(root)
        if d["kind"] == "Namespace"
    }
    assert namespaces[AGENT[0]] == "privileged"


# --- the checker refuses what baseline refuses ---------------------------------------------


def _with(change: dict[str, Any], where: str = "spec") -> Json:
    pod = copy.deepcopy(SHAPES["share"])
    target = pod["spec"]["containers"][0] if where == "container" else pod[where]
    target.update(copy.deepcopy(change))
    return pod


VIOLATIONS = [
    (_with({"hostIPC": True}), "hostNamespaces: hostIPC"),
    (_with({"hostPID": True, "hostNetwork": True}), "hostNamespaces: hostNetwork, hostPID"),
    (_with({"securityContext": {"privileged": True}}, "container"), "privileged: main"),
    (
        _with({"securityContext": {"capabilities": {"add": ["IPC_LOCK", "CHOWN"]}}}, "container"),
        "capabilities: IPC_LOCK",
    ),
    (
        _with({"volumes": [{"name": "pipe", "hostPath": {"path": "/tmp/nvidia-mps"}}]}),
        "hostPathVolumes: pipe",
    ),
    (_with({"ports": [{"containerPort": 80, "hostPort": 8080}]}, "container"), "hostPorts: 8080"),
    (
        _with({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        "seccompProfile: Unconfined",
    ),
    (
        _with({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
        "sysctls: kernel.msgmax",
    ),
    (_with({"securityContext": {"procMount": "Unmasked"}}, "container"), "procMount: main"),
    (
        _with({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "container"),
        "seLinuxOptions",
    ),
    (
        _with({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "container"),
        "appArmorProfile",
    ),
    (
        _with(
            {"annotations": {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}},
            "metadata",
        ),
        "appArmorProfile",
    ),
    (
        _with({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "container"),
        "windowsHostProcess",
    ),
    (
        _with({"livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}, "container"),
        "hostProbesAndHostLifecycle: main",
    ),
    (
        _with({"ephemeralContainers": [{"name": "dbg", "securityContext": {"privileged": True}}]}),
        "privileged: dbg",
    ),
]


@pytest.mark.parametrize(("pod", "reason"), VIOLATIONS, ids=[r for _, r in VIOLATIONS])
def test_the_checker_refuses_each_baseline_violation(pod: Json, reason: str) -> None:
    assert baseline_problems(pod) == [reason]


def test_the_checker_admits_what_baseline_admits() -> None:
    allowed = _with(
        {
            "securityContext": {
                "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
                "seLinuxOptions": {"type": "container_t", "level": "s0:c1"},
                "procMount": "Default",
            },
            "ports": [{"containerPort": 80, "hostPort": 0}],
        },
        "container",
    )
    allowed["spec"]["volumes"].append({"name": "scratch", "emptyDir": {"medium": "Memory"}})
    allowed["spec"]["securityContext"]["sysctls"] = [{"name": "net.ipv4.tcp_rmem", "value": "1"}]
    assert baseline_problems(allowed) == []
    # procMount is relaxed in a user namespace.
    userns = _with({"securityContext": {"procMount": "Unmasked"}}, "container")
    userns["spec"]["hostUsers"] = False
    assert baseline_problems(userns) == []
