"""The webhook's manifests hang together: kustomize lists them; both webhook configurations
call the Service on the paths `make_app` routes, with admissionReviewVersions [v1],
sideEffects None and a short timeout, scoped by matchConditions to pods that ask for
mpsched.io/* (containers and init containers, limits and requests); the mutating one fails
closed on CREATE only, the validating one is never a gate (Ignore, no UPDATE of pods); the
Deployment's two replicas have a PodDisruptionBudget and a scraped metrics port; its
arguments are valid `mpsched webhook` flags that serve on the probed port with the mounted
configuration and certificate; mpsched's service account is the one the validator trusts."""

from __future__ import annotations

from typing import Any

import yaml

from extender.cli import build_parser
from extender.config import Config, load_config_text
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app
from tests.deploy.manifests import DEPLOY, OWN, render

FILES = ("webhook-deployment.yaml", "webhook-configuration.yaml")
#: Both roots render the same webhook (deploy/base); checked in the one each test names.
ROOT = OWN


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert set(FILES) <= set(kustomization["resources"])
    return list(render(ROOT))


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [
        d
        for d in _documents()
        if d["kind"] == kind
        and d["metadata"]["name"] == name
        and d["metadata"].get("namespace", "mpsched-system") == "mpsched-system"
    ]
    return doc


def test_both_webhooks_call_the_service_on_routed_paths() -> None:
    service = _one("Service", "mpsched-webhook")
    routes = {r.resource.canonical for r in make_app(AdmissionSettings.from_config(Config()))
              .router.routes() if r.resource is not None}  # fmt: skip
    for kind, path, failure, rules in (
        ("MutatingWebhookConfiguration", "/mutate", "Fail", [(["CREATE"], ["pods"])]),
        (
            "ValidatingWebhookConfiguration",
            "/validate",
            "Ignore",
            [(["CREATE"], ["pods"]), (["UPDATE"], ["pods/ephemeralcontainers"])],
        ),
    ):
        (hook,) = _one(kind, "mpsched")["webhooks"]
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
        )
        assert ref["port"] == service["spec"]["ports"][0]["port"]
        assert ref["path"] == path and path in routes
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == failure
        assert 1 <= hook["timeoutSeconds"] <= 10
        assert [(r["operations"], r["resources"]) for r in hook["rules"]] == rules
        assert "objectSelector" not in hook  # labels are the pod author's: no opt-out


def test_match_conditions_scope_to_pods_asking_for_mpsched_resources() -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = _one(kind, "mpsched")["webhooks"]
        text = " ".join(c["expression"] for c in hook["matchConditions"])
        for where in ("object.spec.containers.exists(", "object.spec.initContainers.exists("):
            assert where in text
        for section in ("limits", "requests"):
            assert f"c.resources.{section}.exists(k, k.startsWith('mpsched.io/'))" in text
            assert f"has(c.resources.{section})" in text
        assert text.count("(") == text.count(")")
    (validating,) = _one("ValidatingWebhookConfiguration", "mpsched")["webhooks"]
    text = " ".join(c["expression"] for c in validating["matchConditions"])
    assert f"request.userInfo.username != '{Config().webhook.service_account}'" in text


def test_two_replicas_a_disruption_budget_and_a_scraped_metrics_port() -> None:
    deployment = _one("Deployment", "mpsched-webhook")
    assert deployment["spec"]["replicas"] == 2
    pdb = _one("PodDisruptionBudget", "mpsched-webhook")
    assert pdb["spec"]["maxUnavailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser("webhook").parse_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == args.metrics_port != args.port
    service = _one("Service", "mpsched-webhook")
    assert {"name": "metrics", "port": args.metrics_port, "targetPort": "metrics"} in service[
        "spec"
    ]["ports"]
    monitors = [
        d
        for d in yaml.safe_load_all((DEPLOY / "monitoring" / "service-monitor.yaml").read_text())
        if d["metadata"]["name"] == "mpsched-webhook"
    ]
    (monitor,) = monitors
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_trusted_service_account_is_mpscheds() -> None:
    config = load_config_text(_one("ConfigMap", "mpsched-config")["data"]["mpsched.yaml"])
    sa = _one("ServiceAccount", "mpsched")
    assert config.webhook.service_account == (
        f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    )
    # The webhook runs under an account of its own, without API access.
    spec = _one("Deployment", "mpsched-webhook")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "mpsched-webhook"
    assert spec["automountServiceAccountToken"] is False


def test_the_deployment_runs_valid_flags_on_the_probed_port() -> None:
    spec = _one("Deployment", "mpsched-webhook")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    args = build_parser("webhook").parse_args(c["args"])
    assert args.command == "webhook"
    assert c["ports"][0]["containerPort"] == args.port
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "webhook",
                                              "scheme": "HTTPS"}  # fmt: skip
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.config == f"{mounts['config']}/mpsched.yaml"
    assert args.tls_cert.startswith(mounts["tls"]) and args.tls_key.startswith(mounts["tls"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "mpsched-config"
    assert volumes["tls"]["secret"]["secretName"] == "mpsched-webhook-tls"
    service = _one("Service", "mpsched-webhook")
    assert service["spec"]["ports"][0]["targetPort"] == c["ports"][0]["name"]
