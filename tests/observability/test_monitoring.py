"""deploy/monitoring/ against what the processes export: every metric name in every dashboard
expression and alert rule is on a running `mpsched serve`'s /metrics (against the fake API
server: leader election, API requests and binds are real) or the agent's (`AgentMetrics` on a
snapshot); the rules pass promtool where it is installed; the kustomization renders."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from extender.agent.metrics import AgentMetrics
from extender.webhook.metrics import WebhookMetrics
from tests.agent.test_agent_metrics import SNAPSHOT
from tests.http.kube_objects import gpu_node, pod
from tests.kube.fake_apiserver import FakeApiServer, serving
from tests.observability.promql import metric_names
from tests.observability.served import exported_names, samples, scrape, serve, value, wait_for

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
#: Series Prometheus itself adds to every target, not exported by anyone.
PROMETHEUS_OWN = {"up"}


def _dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def agent_names() -> set[str]:
    metrics = AgentMetrics()
    metrics.update(SNAPSHOT)
    return exported_names(metrics.render().decode())


async def test_every_dashboard_and_alert_metric_is_exported(
    tmp_path: Path, agent_names: set[str]
) -> None:
    fake = FakeApiServer()
    fake.put(gpu_node("gpu-a", gpus=1))
    fake.put(pod("first", uid="uid-first", threads=60))
    async with (
        serving(fake, tmp_path) as served,
        serve("--kubeconfig", served.kubeconfig) as proc,
    ):
        await wait_for(f"{proc.metrics}/readyz")
        async with aiohttp.ClientSession() as http:
            for name, uid in (("first", "uid-first"), ("gone", "uid-gone")):
                args = {"PodName": name, "PodNamespace": "default", "PodUID": uid}
                async with http.post(f"{proc.base}/bind", json={**args, "Node": "gpu-a"}) as r:
                    assert r.status == 200
        text = await scrape(proc.metrics)
    found = samples(text)
    # The figures the rules read are there and true of this run.
    assert value(found, "mpsched_leader") == 1
    assert value(found, "mpsched_ready") == 1
    assert value(found, "mpsched_config_valid") == 1
    assert value(found, "mpsched_watch_restarts_total") == 0
    assert value(found, "mpsched_build_info", version="0.1.0") == 1
    assert value(found, "mpsched_api_requests_total", verb="list", resource="pods", code="200") >= 1
    assert (
        value(found, "mpsched_api_requests_total", verb="watch", resource="nodes", code="200") >= 1
    )
    binds = value(
        found, "mpsched_api_requests_total", verb="create", resource="pods/binding", code="201"
    )
    assert binds == 1
    assert (
        value(found, "mpsched_api_requests_total", verb="get", resource="leases", code="404") == 1
    )
    assert (
        value(found, "mpsched_api_requests_total", verb="create", resource="leases", code="201")
        == 1
    )
    assert value(found, "mpsched_requests_total", verb="bind", outcome="ok") == 1
    webhook = exported_names(WebhookMetrics(cert_file=__file__).render().decode())
    exported = exported_names(text) | agent_names | webhook | PROMETHEUS_OWN
    checked = 0
    for where, exprs in (
        ("dashboard.json", _dashboard_expressions()),
        ("prometheus-rule.yaml", [r["expr"] for r in _rules()]),
    ):
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            assert names <= exported, f"{where}: {sorted(names - exported)} not exported: {expr!r}"
            checked += 1
    assert checked > 30


def test_alerts_cover_what_operators_must_hear_about() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(set(names)) == len(names)
    used = set().union(*(metric_names(r["expr"]) for r in rules))
    for metric in (
        "up",
        "mpsched_leader",
        "mpsched_over_budget_gpus",
        "mpsched_allocations",
        "mpsched_watch_restarts_total",
        "mpsched_api_requests_total",
        "mpsched_config_valid",
        "mpsched_bind_failures_total",
        "mpsched_agent_mps_daemon_up",
        "mpsched_agent_pod_over_share",
        "mpsched_webhook_admissions_total",
        "mpsched_webhook_certificate_expiry_seconds",
    ):
        assert metric in used, metric
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert "for" in rule


def test_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    doc = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    assert dashboard["uid"] == "mpsched"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24


def test_the_kustomization_renders() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "PodMonitor",
        "PrometheusRule",
        "ServiceMonitor",
        "ServiceMonitor",
    ]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["mpsched.json"])["uid"] == "mpsched"
