"""The deployment manifests hang together: every file kustomize lists exists and parses, the
ConfigMap's configuration passes validation, the Deployment serves it on the probed port, and
RBAC grants exactly the API calls the Kubernetes adapter makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from extender.config import load_config_text

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SCHEDULER_CONFIG = DEPLOY.parent / "config" / "kube-scheduler.yaml"


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return docs


def _one(kind: str, name: str = "mpsched") -> dict[str, Any]:
    """The one object of `kind` named `name` (the webhook's objects sit beside the extender's)."""
    (doc,) = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_configmap_is_a_valid_configuration_and_the_deployment_serves_it() -> None:
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
    assert config.leader_election.enabled
    assert config.leader_election.namespace == "mpsched-system"
    container = _one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["serve", "--config"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"][2] == f"{mounts['config']}/mpsched.yaml"
    assert config.tls.cert_file is not None
    assert config.tls.cert_file.startswith(mounts["tls"])
    assert container["ports"][0]["containerPort"] == config.server.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The verbs' port wants kube-scheduler's client certificate: probes use the metrics port.
    assert config.tls.client_ca_file is not None and config.server.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.server.metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    service = _one("Service")
    assert service["spec"]["ports"][0]["port"] == config.server.port


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def test_rbac_grants_what_the_adapter_calls() -> None:
    cluster_rules = next(d for d in _documents() if d["kind"] == "ClusterRole")["rules"]
    needed = [
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "get"),
        ("", "pods/binding", "create"), ("", "events", "create"),
    ]  # fmt: skip
    for group, resource, verb in needed:
        assert _allowed(cluster_rules, group, resource, verb), (resource, verb)
    # Nothing that could change a pod's spec or delete anything.
    assert not any(v in r["verbs"] for r in cluster_rules for v in ("update", "delete"))
    role = next(d for d in _documents() if d["kind"] == "Role")
    for verb in ("get", "create", "update"):
        assert _allowed(role["rules"], "coordination.k8s.io", "leases", verb)


def test_scheduler_config_points_at_the_service_and_manages_every_resource() -> None:
    scheduler = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = scheduler["extenders"]
    service = _one("Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert extender["urlPrefix"] == f"https://{host}:{service['spec']['ports'][0]['port']}"
    assert extender["nodeCacheCapable"] is True
    assert extender["weight"] > 0
    managed = {r["name"] for r in extender["managedResources"]}
    assert managed == {f"mpsched.io/{r}" for r in ("threads", "memory", "units", "gpus", "clients")}
