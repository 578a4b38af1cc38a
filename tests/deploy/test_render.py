"""Every deploy/ root renders with `kubectl kustomize`, and every object it renders validates
strictly (unknown fields are errors) against the OpenAPI schemas of every Kubernetes minor
mpsched supports (1.30 to 1.33: `SUPPORTED_MINORS`); the only
objects without a schema there are cert-manager's, named here. Every pod in mpsched-system
meets Pod Security `restricted`, which that namespace enforces, and only the node agent runs
in the privileged namespace; every ConfigMap a pod mounts is rendered beside it in its
namespace and holds a valid configuration; every Secret a pod mounts is one that
scripts/make-certs or the cert-manager overlay writes."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no types
import pytest

from extender.commands.preflight_versions import SUPPORTED_MINORS
from extender.config import load_config_text
from tests.deploy.manifests import CLUSTER, OWN, Json, containers, pod_spec, render, roots

#: Kinds the Kubernetes schemas do not know (CRDs), with what must be installed for them.
CUSTOM = {("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer")}
WORKLOADS = ("Deployment", "DaemonSet")
#: Secrets no root renders, and who writes them (scripts/make-certs writes both).
SECRETS_WRITTEN = {"mpsched-webhook-tls": "webhook", "mpsched-tls": "extender"}


def test_there_are_the_two_roots_and_their_cert_manager_overlays() -> None:
    assert roots() == [
        CLUSTER,
        "overlays/cluster-scheduler-cert-manager",
        "overlays/own-scheduler-cert-manager",
        OWN,
    ]


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
@pytest.mark.parametrize("root", roots())
def test_every_object_validates_strictly_against_each_supported_kubernetes(
    root: str, minor: int
) -> None:
    problems = []
    for doc in render(root):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            assert "cert-manager" in root, f"{root} needs cert-manager for {doc['kind']}"
            continue
        try:
            kubernetes_validate.validate(doc, f"1.{minor}", strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {exc.message}")
    assert not problems


def _workloads(root: str) -> list[Json]:
    return [d for d in render(root) if d["kind"] in WORKLOADS]


def _restricted_problems(spec: Json) -> list[str]:
    """What Pod Security `restricted` (v1.33) would refuse in a pod spec."""
    found = []
    pod = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(key)
    found += [f"hostPath {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    for c in containers(spec):
        sc: dict[str, Any] = c.get("securityContext", {})
        name = c["name"]
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc["capabilities"].get("add"):
            found.append(f"{name}: capabilities")
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        found += [f"{name}: hostPort" for p in c.get("ports", []) if p.get("hostPort")]
    return found


@pytest.mark.parametrize("root", roots())
def test_namespaces_carry_pod_security_levels_and_pods_meet_them(root: str) -> None:
    levels = {
        d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for d in render(root)
        if d["kind"] == "Namespace"
    }
    assert levels == {"mpsched-system": "restricted", "mpsched-node": "privileged"}
    for workload in _workloads(root):
        namespace = workload["metadata"]["namespace"]
        spec = pod_spec(workload)
        if namespace == "mpsched-node":
            assert workload["metadata"]["name"] == "mpsched-agent"
            continue
        assert namespace == "mpsched-system"
        assert _restricted_problems(spec) == [], workload["metadata"]["name"]
        # Beyond `restricted`: hardened as the issue asks.
        for c in containers(spec):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), c["name"]
            assert "memory" in resources["limits"], c["name"]


def test_the_restricted_check_refuses_what_restricted_refuses() -> None:
    spec = {
        "hostPID": True,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"privileged": True, "runAsUser": 0}}],
    }
    assert _restricted_problems(spec) == [
        "hostPID",
        "hostPath h",
        "c: runAsUser 0",
        "c: allowPrivilegeEscalation",
        "c: capabilities",
        "c: privileged",
    ]


@pytest.mark.parametrize("root", roots())
def test_mounted_config_maps_exist_beside_the_pods_and_secrets_are_the_known_ones(
    root: str,
) -> None:
    config_maps = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["data"]
        for d in render(root)
        if d["kind"] == "ConfigMap"
    }
    cert_manager = {d["spec"]["secretName"] for d in render(root) if d["kind"] == "Certificate"}
    for workload in _workloads(root):
        namespace = workload["metadata"]["namespace"]
        for volume in pod_spec(workload).get("volumes", []):
            if "configMap" in volume:
                assert (namespace, volume["configMap"]["name"]) in config_maps, volume
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert name in SECRETS_WRITTEN, name
                if cert_manager:
                    assert name in cert_manager, f"{root}: no Certificate writes {name}"
    for (_namespace, name), data in config_maps.items():
        if name == "mpsched-config":
            load_config_text(data["mpsched.yaml"])  # raises on any problem
    # The agent's copy is the extender's.
    assert (
        config_maps[("mpsched-node", "mpsched-config")]
        == config_maps[("mpsched-system", "mpsched-config")]
    )
