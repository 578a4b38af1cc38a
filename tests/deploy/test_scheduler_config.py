"""Every KubeSchedulerConfiguration mpsched ships (own-scheduler's, config/kube-scheduler.yaml
for the cluster's scheduler, and the extender entry scripts/make-certs writes) passes the v1
rules of `scheduler_config`, and each points at where its mode's extender listens; the
checker itself refuses each rule's breach."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.commands.preflight_versions import DEFAULT_SCHEDULER_MINOR, SUPPORTED_MINORS
from extender.config import load_config_text
from tests.deploy.manifests import (
    CLUSTER,
    DEPLOY,
    OWN,
    REPO,
    containers,
    one,
    overlay,
    pod_spec,
    render_dir,
)
from tests.deploy.scheduler_config import problems

CLUSTER_CONFIG = REPO / "config" / "kube-scheduler.yaml"
MANAGED = {f"mpsched.io/{r}" for r in ("threads", "memory", "units", "gpus", "clients")}


COMPONENTS = "components/kube-scheduler-1.{}"


def test_there_is_one_component_per_supported_minor() -> None:
    found = sorted(p.name for p in (DEPLOY / "components").glob("kube-scheduler-1.*"))
    assert found == [f"kube-scheduler-1.{m}" for m in SUPPORTED_MINORS]
    assert SUPPORTED_MINORS[0] == DEFAULT_SCHEDULER_MINOR


@pytest.mark.parametrize("root", [OWN, "overlays/own-scheduler-cert-manager"])
@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_each_minors_component_runs_that_scheduler_on_a_config_it_loads(
    root: str, minor: int, tmp_path: Path
) -> None:
    rendered = render_dir(overlay(tmp_path, root, components=[COMPONENTS.format(minor)]))
    (deployment,) = [
        d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == "mpsched"
    ]
    (scheduler,) = [c for c in containers(pod_spec(deployment)) if c["name"] == "kube-scheduler"]
    assert re.fullmatch(rf"registry\.k8s\.io/kube-scheduler:v1\.{minor}\.\d+", scheduler["image"])
    (config_map,) = [d for d in rendered if d["metadata"]["name"] == "mpsched-scheduler-config"]
    doc = yaml.safe_load(config_map["data"]["kube-scheduler.yaml"])
    assert problems(doc, minor=minor) == []
    # The cluster-scheduler's configuration, merged into a control plane of that minor.
    assert problems(yaml.safe_load(CLUSTER_CONFIG.read_text()), minor=minor) == []


def test_the_checker_knows_fields_by_minor() -> None:
    doc = {**_own(), "delayCacheUntilActive": True}
    assert problems(doc, minor=30) == []
    assert problems(doc, minor=27) == [
        "kube-scheduler 1.27 is not a minor mpsched supports",
        "delayCacheUntilActive: unknown to kube-scheduler 1.27 (added in 1.28)",
    ]


def _own() -> dict[str, Any]:
    data = one(OWN, "ConfigMap", "mpsched-scheduler-config")["data"]["kube-scheduler.yaml"]
    doc: dict[str, Any] = yaml.safe_load(data)
    return doc


def _mpsched(root: str) -> Any:
    cm = one(root, "ConfigMap", "mpsched-config", "mpsched-system")
    return load_config_text(cm["data"]["mpsched.yaml"])


def _common(extender: dict[str, Any]) -> None:
    assert {r["name"] for r in extender["managedResources"]} == MANAGED
    assert all(r["ignoredByScheduler"] for r in extender["managedResources"])
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert extender["bindVerb"] == "bind"


def test_own_scheduler_config_is_valid_and_calls_the_sidecar_on_loopback() -> None:
    doc = _own()
    assert problems(doc) == []
    (profile,) = doc["profiles"]
    config = _mpsched(OWN)
    assert profile["schedulerName"] == config.webhook.scheduler_name == "mpsched"
    (extender,) = doc["extenders"]
    _common(extender)
    assert extender["urlPrefix"] == f"http://127.0.0.1:{config.server.port}"
    assert config.server.host == "127.0.0.1" and config.tls.client_ca_file is None
    # Above the extender's whole-bind deadline.
    assert float(extender["httpTimeout"].rstrip("s")) > config.api.bind_timeout_seconds
    # The extender follows the scheduler's election; the scheduler's Lease is one RBAC grants.
    assert not config.leader_election.enabled
    election = doc["leaderElection"]
    assert election["leaderElect"] is True and election["resourceLock"] == "leases"
    role = one(OWN, "Role", "mpsched-scheduler-lease")
    assert role["metadata"]["namespace"] == election["resourceNamespace"]
    assert role["rules"][0]["resourceNames"] == [election["resourceName"]]
    # The Deployment runs that file with the pinned upstream scheduler, by default the minor
    # preflight assumes (the oldest supported: never newer than a supported control plane).
    spec = pod_spec(one(OWN, "Deployment", "mpsched"))
    scheduler = next(c for c in containers(spec) if c["name"] == "kube-scheduler")
    assert scheduler["image"].startswith(
        f"registry.k8s.io/kube-scheduler:v1.{DEFAULT_SCHEDULER_MINOR}."
    )
    mount = next(m for m in scheduler["volumeMounts"] if m["name"] == "scheduler-config")
    assert f"--config={mount['mountPath']}/kube-scheduler.yaml" in scheduler["command"]


def test_cluster_scheduler_config_is_valid_and_calls_the_fixed_cluster_ip() -> None:
    doc = yaml.safe_load(CLUSTER_CONFIG.read_text())
    assert problems(doc) == []
    (extender,) = doc["extenders"]
    _common(extender)
    service = one(CLUSTER, "Service", "mpsched")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "extender")
    assert extender["urlPrefix"] == f"https://{service['spec']['clusterIP']}:{port}"
    config = _mpsched(CLUSTER)
    assert port == config.server.port and config.tls.client_ca_file is not None
    assert float(extender["httpTimeout"].rstrip("s")) > config.api.bind_timeout_seconds


def test_make_certs_writes_a_valid_extender_entry_for_the_cluster_scheduler(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [REPO / "scripts" / "make-certs", CLUSTER, "--out", tmp_path, "--dry-run"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    entry = yaml.safe_load((tmp_path / "kube-scheduler-extender.yaml").read_text())
    merged = yaml.safe_load(CLUSTER_CONFIG.read_text())
    merged["extenders"] = entry["extenders"]
    assert problems(merged) == []
    (written,) = entry["extenders"]
    (shipped,) = yaml.safe_load(CLUSTER_CONFIG.read_text())["extenders"]
    # The same entry, with the files inline.
    del shipped["tlsConfig"], written["tlsConfig"]
    assert written == shipped


def _breaking(change: str) -> dict[str, Any]:
    doc = _own()
    extender = doc["extenders"][0]
    match change:
        case "misspelt key":
            extender["enableHttps"] = extender.pop("enableHTTPS")
        case "extenders in a profile":
            doc["profiles"][0]["extenders"] = doc.pop("extenders")
        case "no weight":
            del extender["weight"]
        case "two binders":
            doc["extenders"].append({**copy.deepcopy(extender), "managedResources": []})
        case "kubernetes.io resource":
            extender["managedResources"][0]["name"] = "kubernetes.io/threads"
        case "unprefixed resource":
            extender["managedResources"][0]["name"] = "threads"
        case "duplicate resource":
            extender["managedResources"].append(dict(extender["managedResources"][0]))
        case "timeout as a number":
            extender["httpTimeout"] = 10
        case "https without a CA":
            extender["urlPrefix"] = "https://10.96.0.88:8888"
            extender["enableHTTPS"] = True
        case "weight as a bool":
            extender["weight"] = True
        case "old apiVersion":
            doc["apiVersion"] = "kubescheduler.config.k8s.io/v1beta3"
        case "NodeResourcesFit disabled":
            plugins = {"multiPoint": {"disabled": [{"name": "NodeResourcesFit"}]}}
            doc["profiles"][0]["plugins"] = plugins
    return doc


@pytest.mark.parametrize(
    "change",
    [
        "misspelt key", "extenders in a profile", "no weight", "two binders",
        "kubernetes.io resource", "unprefixed resource", "duplicate resource",
        "timeout as a number", "https without a CA", "weight as a bool", "old apiVersion",
        "NodeResourcesFit disabled",
    ],
)  # fmt: skip
def test_the_checker_refuses_each_breach(change: str) -> None:
    assert problems(_breaking(change)) != []
