"""The checks of `mpsched preflight`, decided without I/O from one `Survey` of the cluster: each
says ✓, ✗ (with what to do) or – (does not apply yet: before install, or no GPU node).

Owns the check's record, when mpsched counts as installed (a check of a component that is
missing fails once anything of mpsched is installed, and does not apply before), how a GPU node
is recognised, when the agent is ready on it, what counts as evidence of the NVIDIA container
runtime, the Pod Security of GPU pods' namespaces and the extender's readiness. The versions'
checks are `extender.commands.preflight_versions`, the webhook's `preflight_webhook`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from extender.agent.inventory import AGENT_KEY
from extender.cluster import JsonObject
from extender.commands.pod_security import enforced_level, violations
from extender.kube.survey import Survey
from extender.packing.codec import INVENTORY_KEY

GFD_LABEL: Final = "nvidia.com/gpu.present"
GKE_LABEL: Final = "cloud.google.com/gke-accelerator"
#: GPU Feature Discovery's driver labels (`nvidia.com/cuda.driver.major`, and
#: `nvidia.com/cuda.driver-version.major` in newer releases): GFD reads them through the runtime.
GFD_DRIVER_PREFIX: Final = "nvidia.com/cuda.driver"
MPSCHED_RESOURCE_PREFIX: Final = "mpsched.io/"

Status = Literal["ok", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    #: What to do, for a failed check.
    fix: str = ""

    @classmethod
    def failed(cls, name: str, problems: Sequence[str], fix: str) -> Check:
        """A failed check whose detail is every problem found, in order."""
        return cls(name, "fail", "; ".join(problems), fix)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def installed(survey: Survey) -> bool:
    """Whether anything of mpsched is in the cluster (after install, a missing piece fails)."""
    names = {_meta(n).get("name") for n in survey.namespaces}
    return (
        survey.names.namespace in names
        or survey.agent_daemonset is not None
        or survey.extender_deployment is not None
        or survey.mutating_webhook is not None
    )


def absent(survey: Survey, name: str, what: str, key: str) -> Check:
    if key in survey.errors:
        return Check(
            name,
            "fail",
            f"cannot read {what}: {survey.errors[key]}",
            "give preflight's credentials get/list on it (or run as cluster admin)",
        )
    if installed(survey):
        return Check(
            name,
            "fail",
            f"{what} not found",
            "apply the root you installed (kubectl apply -k deploy/<root>)",
        )
    return Check(name, "skip", f"{what}: not installed yet")


def gpu_nodes(survey: Survey) -> dict[str, list[str]]:
    """GPU nodes by name, with how each was recognised."""
    found: dict[str, list[str]] = {}
    for node in survey.nodes:
        labels = _labels(node)
        ways = []
        if labels.get(GFD_LABEL) == "true":
            ways.append("GFD label")
        if labels.get(GKE_LABEL):
            ways.append("GKE label")
        if INVENTORY_KEY in (_meta(node).get("annotations") or {}):
            ways.append("agent inventory")
        if ways:
            found[str(_meta(node).get("name", ""))] = ways
    return found


def check_gpu_nodes(survey: Survey) -> Check:
    name = "gpu-nodes"
    found = gpu_nodes(survey)
    if not found:
        if "nodes" in survey.errors:
            return Check(
                name,
                "fail",
                f"cannot list nodes: {survey.errors['nodes']}",
                "give preflight's credentials list on nodes",
            )
        return Check(
            name,
            "fail",
            f"no GPU node: no node has {GFD_LABEL}=true (GPU Feature Discovery), "
            f"{GKE_LABEL} (GKE) or the agent's {INVENTORY_KEY} inventory",
            "install GPU Feature Discovery (or the NVIDIA GPU Operator), or label each GPU "
            f"node: kubectl label node NODE {GFD_LABEL}=true",
        )
    counts = {
        way: sum(way in ways for ways in found.values())
        for way in ("GFD label", "GKE label", "agent inventory")
    }
    how = ", ".join(f"{n} by {way}" for way, n in counts.items() if n)
    return Check(name, "ok", f"{len(found)} GPU node{'s' * (len(found) != 1)} ({how})")


def _ready(pod: JsonObject) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def check_agent(survey: Survey) -> Check:
    """A ready agent pod of the DaemonSet on every GPU node."""
    name = "agent"
    nodes = gpu_nodes(survey)
    daemonset = survey.agent_daemonset
    if daemonset is None:
        return absent(
            survey,
            name,
            f"DaemonSet {survey.names.agent_namespace}/{survey.names.agent}",
            "agent_daemonset",
        )
    if not nodes:
        return Check(name, "skip", "no GPU node to run on")
    spec = daemonset.get("spec") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or {}
    node_selector = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    pods = {
        (p.get("spec") or {}).get("nodeName"): p
        for p in survey.pods
        if _meta(p).get("namespace") == survey.names.agent_namespace and _selects(match, _labels(p))
    }
    labels = {_meta(n).get("name"): _labels(n) for n in survey.nodes}
    problems = []
    for node in sorted(nodes):
        pod = pods.get(node)
        if pod is not None and _ready(pod):
            continue
        if pod is not None:
            problems.append(f"{node}: pod {_meta(pod).get('name')} not ready")
        elif not _selects(node_selector, labels.get(node) or {}):
            wanted = ",".join(f"{k}={v}" for k, v in node_selector.items())
            problems.append(f"{node}: not selected by the DaemonSet's nodeSelector {wanted}")
        else:
            problems.append(f"{node}: no agent pod")
    if problems:
        return Check.failed(
            name,
            problems,
            f"kubectl -n {survey.names.agent_namespace} describe pod POD and its logs "
            "(the agent's Events are on its Node: kubectl describe node NODE); "
            "label a GPU node the nodeSelector misses",
        )
    return Check(name, "ok", f"ready on all {len(nodes)} GPU nodes")


def _agent_record(node: JsonObject) -> Mapping[str, Any] | None:
    raw = (_meta(node).get("annotations") or {}).get(AGENT_KEY)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, Mapping) else None


def check_runtime(survey: Survey) -> Check:
    """Evidence that containers on each GPU node get the NVIDIA driver: the driver version the
    agent read through NVML in its own container (`mpsched.io/agent`); where no agent has
    published yet, GFD's driver labels (GFD reads them through the runtime) or the
    RuntimeClass `nvidia`."""
    name = "nvidia-runtime"
    nodes = gpu_nodes(survey)
    if not nodes:
        return Check(name, "skip", "no GPU node to look at")
    by_name = {_meta(n).get("name"): n for n in survey.nodes}
    seen: Counter[str] = Counter()
    problems = []
    for node_name in sorted(nodes):
        node = by_name[node_name]
        record = _agent_record(node)
        if record is not None:
            if record.get("driver"):
                seen["the agent (NVML reached the driver)"] += 1
            else:
                why = record.get("reason") or "no reason given"
                problems.append(f"{node_name}: the agent found no NVIDIA driver ({why})")
        elif any(k.startswith(GFD_DRIVER_PREFIX) for k in _labels(node)):
            seen["GFD driver labels"] += 1
        elif survey.runtime_class is not None:
            seen[f"RuntimeClass {survey.names.runtime_class}"] += 1
        else:
            problems.append(f"{node_name}: no agent record, no GFD driver label")
    if problems:
        return Check.failed(
            name,
            problems,
            "install the NVIDIA driver and container toolkit with the NVIDIA runtime "
            "as the node's default (the GPU Operator does both), or create RuntimeClass "
            f"{survey.names.runtime_class} and set webhook.runtimeClassName",
        )
    return Check(name, "ok", ", ".join(f"{n} by {how}" for how, n in seen.items()))


def asks_mpsched(pod: JsonObject) -> bool:
    """Whether a container or init container asks for an mpsched.io/ resource."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            if any(str(k).startswith(MPSCHED_RESOURCE_PREFIX) for k in resources.get(part) or {}):
                return True
    return False


def check_pod_security(survey: Survey) -> Check:
    """Every namespace holding GPU pods enforces a level their specs meet."""
    name = "pod-security"
    namespaces = {_meta(n).get("name"): n for n in survey.namespaces}
    by_namespace: dict[str, list[JsonObject]] = {}
    for pod in survey.pods:
        if asks_mpsched(pod):
            by_namespace.setdefault(str(_meta(pod).get("namespace")), []).append(pod)
    problems = []
    for namespace, pods in sorted(by_namespace.items()):
        level = enforced_level(namespaces.get(namespace))
        refused = [
            f"{_meta(p).get('name')}: {', '.join(found)}"
            for p in pods
            if (found := violations(p.get("spec") or {}, level))
        ]
        if refused:
            problems.append(
                f"namespace {namespace} enforces {level}, which refuses "
                f"{len(refused)} GPU pod(s): {'; '.join(refused[:3])}"
            )
    if problems:
        return Check(
            name,
            "fail",
            " | ".join(problems),
            "share pods need hostIPC and the MPS pipe directory's hostPath, which "
            "baseline and restricted refuse: run GPU pods in a namespace labelled "
            "pod-security.kubernetes.io/enforce=privileged",
        )
    count = sum(len(p) for p in by_namespace.values())
    return Check(
        name,
        "ok",
        f"{count} GPU pod(s) in {len(by_namespace)} namespace(s), each at a level its pods meet",
    )


def check_extender(survey: Survey) -> Check:
    name = "extender"
    deployment = survey.extender_deployment
    if deployment is None:
        return absent(
            survey,
            name,
            f"Deployment {survey.names.namespace}/{survey.names.extender}",
            "extender_deployment",
        )
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    if ready < 1:
        return Check(
            name,
            "fail",
            f"0 of {wanted} replicas ready: GPU pods are not scheduled",
            f"kubectl -n {survey.names.namespace} describe deployment "
            f"{survey.names.extender}; its logs say why /readyz answers 503",
        )
    return Check(name, "ok", f"{ready} of {wanted} replicas ready")
