"""The checks of `mpsched preflight`, decided without I/O from one `Survey` of the cluster: each
says ✓, ✗ (with what to do) or – (does not apply yet: before install, or no GPU node).

Owns the Kubernetes versions mpsched supports (`SUPPORTED_MINORS`, which the docs cite), the
kube-scheduler skew rule, how a GPU node is recognised, what counts as evidence of the NVIDIA
container runtime, and how near a certificate's expiry fails. A check of a component that is
missing fails once anything of mpsched is installed, and does not apply before.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from extender.agent.inventory import AGENT_KEY
from extender.cluster import JsonObject
from extender.commands.certificates import CertificateError, not_after, pem_certificates
from extender.commands.pod_security import enforced_level, violations
from extender.kube.survey import Survey
from extender.packing.codec import INVENTORY_KEY

#: The Kubernetes minors (1.N) mpsched supports, for the API server and for the kube-scheduler
#: own-scheduler runs (deploy/components/kube-scheduler-1.N picks one): the oldest still served
#: by every managed offering to the newest whose KubeSchedulerConfiguration tests/deploy checks.
SUPPORTED_MINORS: Final = (30, 31, 32, 33)
#: The kube-scheduler minor deploy/own-scheduler runs unless a component picks another: the
#: oldest supported, so that by default it is never newer than a supported API server (a newer
#: scheduler may ask for APIs the server does not serve; an older one only lacks features).
DEFAULT_SCHEDULER_MINOR: Final = 30
#: How many minors kube-scheduler may be older than the API server (never newer): the
#: Kubernetes version skew policy for the control plane's components.
SCHEDULER_MINORS_BEHIND: Final = 1
#: A certificate that expires within this many days fails.
CERT_MIN_DAYS: Final = 21

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


def _absent(survey: Survey, name: str, what: str, key: str) -> Check:
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


# -- versions ----------------------------------------------------------------------------------


def _minor(text: str) -> int | None:
    """The minor of "v1.33.4", "1.33", "33+" (GKE's /version minor); None otherwise."""
    found = re.match(r"^v?(?:1\.)?(\d+)", text)
    return int(found.group(1)) if found else None


def scheduler_skew(api_minor: int, scheduler_minor: int) -> str | None:
    """Why this kube-scheduler may not run against this API server, or None."""
    if scheduler_minor > api_minor:
        return f"kube-scheduler 1.{scheduler_minor} is newer than the API server 1.{api_minor}"
    if api_minor - scheduler_minor > SCHEDULER_MINORS_BEHIND:
        return (
            f"kube-scheduler 1.{scheduler_minor} is {api_minor - scheduler_minor} minors older "
            f"than the API server 1.{api_minor} (at most {SCHEDULER_MINORS_BEHIND} allowed)"
        )
    return None


def _component(minor: int) -> str:
    return f"deploy/components/kube-scheduler-1.{minor}"


def _scheduler_image(deployment: JsonObject) -> str | None:
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        if container.get("name") == "kube-scheduler":
            return str(container.get("image", ""))
    return None


def check_versions(survey: Survey, *, planned_scheduler_minor: int | None = None) -> Check:
    """The API server's version is supported and kube-scheduler is within skew of it."""
    name = "versions"
    version = survey.version
    if version is None:
        why = survey.errors.get("version", "no answer")
        return Check(
            name,
            "fail",
            f"cannot read the API server's /version: {why}",
            "check the kubeconfig and that the API server answers",
        )
    git = str(version.get("gitVersion", ""))
    api_minor = _minor(str(version.get("minor", ""))) or _minor(git)
    supported = f"1.{SUPPORTED_MINORS[0]} to 1.{SUPPORTED_MINORS[-1]}"
    if api_minor is None or api_minor not in SUPPORTED_MINORS:
        return Check(
            name,
            "fail",
            f"API server {git or version}: mpsched supports {supported}",
            f"run mpsched on a Kubernetes {supported} control plane",
        )
    closest = min(max(api_minor, SUPPORTED_MINORS[0]), SUPPORTED_MINORS[-1])
    deployment = survey.extender_deployment
    if deployment is not None:
        image = _scheduler_image(deployment)
        if image is None:
            return Check(
                name,
                "ok",
                f"API server {git}; the cluster's own kube-scheduler (cluster-scheduler mode)",
            )
        scheduler_minor = _minor(image.rpartition(":")[2])
        where = f"kube-scheduler {image}"
    else:
        scheduler_minor = planned_scheduler_minor or DEFAULT_SCHEDULER_MINOR
        where = f"kube-scheduler 1.{scheduler_minor} (to be installed)"
    if scheduler_minor is None:
        return Check(
            name,
            "fail",
            f"{where}: no version in the image tag",
            f"run a tagged image: add the component {_component(closest)}",
        )
    problem = scheduler_skew(api_minor, scheduler_minor)
    if problem is not None:
        return Check(
            name,
            "fail",
            f"API server {git}; {problem}",
            f"install own-scheduler with the component {_component(closest)} "
            "(docs/installing.md, choosing the kube-scheduler version)",
        )
    return Check(name, "ok", f"API server {git}; {where}")


# -- GPU nodes, the agent, the runtime ---------------------------------------------------------


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
        return _absent(
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
        return Check(
            name,
            "fail",
            "; ".join(problems),
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
    seen: dict[str, int] = {}
    problems = []
    for node_name in sorted(nodes):
        node = by_name[node_name]
        record = _agent_record(node)
        if record is not None:
            if record.get("driver"):
                key = "the agent (NVML reached the driver)"
                seen[key] = seen.get(key, 0) + 1
            else:
                why = record.get("reason") or "no reason given"
                problems.append(f"{node_name}: the agent found no NVIDIA driver ({why})")
        elif any(k.startswith(GFD_DRIVER_PREFIX) for k in _labels(node)):
            seen["GFD driver labels"] = seen.get("GFD driver labels", 0) + 1
        elif survey.runtime_class is not None:
            key = f"RuntimeClass {survey.names.runtime_class}"
            seen[key] = seen.get(key, 0) + 1
        else:
            problems.append(f"{node_name}: no agent record, no GFD driver label")
    if problems:
        return Check(
            name,
            "fail",
            "; ".join(problems),
            "install the NVIDIA driver and container toolkit with the NVIDIA runtime "
            "as the node's default (the GPU Operator does both), or create RuntimeClass "
            f"{survey.names.runtime_class} and set webhook.runtimeClassName",
        )
    return Check(name, "ok", ", ".join(f"{n} by {how}" for how, n in seen.items()))


# -- the webhook, its certificates -------------------------------------------------------------


def _webhooks(survey: Survey) -> list[Mapping[str, Any]]:
    configs = (survey.mutating_webhook, survey.validating_webhook)
    return [w for c in configs if c is not None for w in c.get("webhooks") or []]


def check_webhook(survey: Survey) -> Check:
    name = "webhook"
    if survey.mutating_webhook is None:
        return _absent(
            survey,
            name,
            f"MutatingWebhookConfiguration {survey.names.webhook_configuration}",
            "mutating_webhook",
        )
    problems = [
        f"{w.get('name')}: no caBundle"
        for w in _webhooks(survey)
        if not (w.get("clientConfig") or {}).get("caBundle")
    ]
    if problems:
        return Check(
            name,
            "fail",
            "; ".join(problems),
            "scripts/make-certs MODE patches it in; with cert-manager, check that "
            "its cainjector runs",
        )
    hooks = ", ".join(
        f"{w.get('name')} (failurePolicy {w.get('failurePolicy', 'Fail')})"
        for w in _webhooks(survey)
    )
    return Check(name, "ok", hooks)


def _ready_endpoints(slices: tuple[JsonObject, ...]) -> int:
    # An endpoint whose `ready` is unset counts as ready (the EndpointSlice API's rule).
    return sum(
        len(e.get("addresses") or [])
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False
    )


def check_webhook_endpoints(survey: Survey) -> Check:
    name = "webhook-endpoints"
    service = f"Service {survey.names.namespace}/{survey.names.webhook_service}"
    if survey.mutating_webhook is None:
        return Check(name, "skip", "no webhook configuration to serve")
    if "webhook_endpoint_slices" in survey.errors:
        return Check(
            name,
            "fail",
            f"cannot list the EndpointSlices of {service}: "
            f"{survey.errors['webhook_endpoint_slices']}",
            "give preflight's credentials list on endpointslices",
        )
    ready = _ready_endpoints(survey.webhook_endpoint_slices)
    if ready == 0:
        return Check(
            name,
            "fail",
            f"{service} has no ready endpoint: the API server cannot reach the webhook, "
            "and new GPU pods are refused while it cannot",
            f"kubectl -n {survey.names.namespace} get pods -l "
            "app.kubernetes.io/name=mpsched-webhook, then describe the ones not ready "
            f"(their Secret {survey.names.webhook_secret} must exist)",
        )
    return Check(name, "ok", f"{service}: {ready} ready endpoint{'s' * (ready != 1)}")


def _secret_pem(secret: JsonObject, key: str) -> str:
    raw = (secret.get("data") or {}).get(key)
    try:
        return base64.b64decode(raw).decode("utf-8", "replace") if raw else ""
    except (binascii.Error, ValueError):
        return ""


def certificates(survey: Survey) -> list[tuple[str, str]]:
    """(where, PEM text) of every certificate mpsched's TLS depends on: the webhook
    configurations' caBundle, and the TLS Secrets (the webhook's; in cluster-scheduler mode the
    extender's and kube-scheduler's client certificate, the one copied to the control plane)."""
    found = []
    for hook in _webhooks(survey):
        bundle = (hook.get("clientConfig") or {}).get("caBundle")
        if bundle:
            found.append(
                (f"caBundle of {hook.get('name')}", _secret_pem({"data": {"b": bundle}}, "b"))
            )
    for name, secret in survey.secrets.items():
        where = f"Secret {survey.names.namespace}/{name}"
        found += [(f"{where} {key}", _secret_pem(secret, key)) for key in ("tls.crt", "ca.crt")]
    return [(where, pem) for where, pem in found if pem]


def check_certificates(survey: Survey, *, now: dt.datetime) -> Check:
    name = "certificates"
    found = certificates(survey)
    if not found:
        if survey.mutating_webhook is None and not installed(survey):
            return Check(name, "skip", "not installed yet")
        return Check(name, "skip", "no certificate found (see the webhook check)")
    problems, soonest = [], None
    for where, pem in found:
        try:
            ends = [not_after(der) for der in pem_certificates(pem)]
        except CertificateError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not ends:
            problems.append(f"{where}: no PEM certificate in it")
        for end in ends:
            days = (end - now).total_seconds() / 86400
            if soonest is None or end < soonest[0]:
                soonest = (end, where)
            if days < CERT_MIN_DAYS:
                when = (
                    f"expired {int(-days)} days ago" if days < 0 else f"expires in {int(days)} days"
                )
                problems.append(f"{where} {when} ({end:%Y-%m-%d})")
    if problems:
        return Check(
            name,
            "fail",
            "; ".join(problems),
            "renew now: scripts/make-certs MODE (the webhook reloads the files), or "
            "check cert-manager's Certificate mpsched-webhook; in cluster-scheduler "
            "mode copy kube-scheduler's renewed client certificate too",
        )
    assert soonest is not None  # every PEM held a certificate, or a problem was found
    unread = sorted(k.removeprefix("secret ") for k in survey.errors if k.startswith("secret "))
    detail = f"{len(found)} checked; the first to expire: {soonest[1]} on {soonest[0]:%Y-%m-%d}"
    if unread:
        detail += f" (Secrets not readable: {', '.join(unread)})"
    return Check(name, "ok", detail)


# -- Pod Security, the extender ----------------------------------------------------------------


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
        return _absent(
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


def run_checks(
    survey: Survey, *, now: dt.datetime, planned_scheduler_minor: int | None = None
) -> list[Check]:
    """Every check, in the order the table shows them."""
    checks: list[Callable[[Survey], Check]] = [
        check_gpu_nodes,
        check_agent,
        check_runtime,
        check_webhook,
        check_webhook_endpoints,
        check_pod_security,
        check_extender,
    ]
    return [
        check_versions(survey, planned_scheduler_minor=planned_scheduler_minor),
        *(c(survey) for c in checks[:5]),
        check_certificates(survey, now=now),
        *(c(survey) for c in checks[5:]),
    ]
