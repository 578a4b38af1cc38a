"""`mpsched preflight` against the fake API server: a healthy cluster is all ✓; each broken case
of the issue (no GPU labels, an agent not ready, the webhook without endpoints, a certificate
expiring in 10 days, kube-scheduler newer than the API server, GPU pods in a `restricted`
namespace) fails exactly its own check, with what to do; before install, what is not there yet
does not apply; the command prints a table or JSON and exits 1 on a failure."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from extender import cli
from extender.commands.preflight import preflight
from extender.commands.preflight_checks import Check
from tests.kube.fake_apiserver import FakeApiServer, serving

GPU_NODES = ("gpu-1", "gpu-2")
AGENT_LABELS = {"app.kubernetes.io/name": "mpsched-agent"}


def certificate_pem(days: float) -> str:
    """A self-signed certificate, PEM, that expires `days` from now."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mpsched-webhook")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM).decode()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def namespace(name: str, level: str | None) -> dict[str, Any]:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def agent_pod(node: str, *, ready: bool = True) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": f"mpsched-agent-{node}", "namespace": "mpsched-node",
                     "uid": f"u-{node}", "labels": dict(AGENT_LABELS)},
        "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


def gpu_pod() -> dict[str, Any]:
    """A share pod as the webhook leaves it: hostIPC and the MPS pipe directory's hostPath."""
    return {
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-train"},
        "spec": {
            "hostIPC": True,
            "nodeName": "gpu-1",
            "volumes": [{"name": "mpsched-mps-pipe", "hostPath": {"path": "/tmp/nvidia-mps"}}],
            "containers": [{"name": "app", "resources": {"limits": {"mpsched.io/threads": "30"}}}],
        },
        "status": {"phase": "Running"},
    }


def healthy(*, server: str = "v1.33.4", scheduler: str = "v1.33.4") -> FakeApiServer:
    """A cluster with mpsched installed (own-scheduler) and everything well."""
    fake = FakeApiServer()
    store = fake.objects
    minor = server.split(".")[1]
    store.version = {"major": "1", "minor": minor, "gitVersion": server}
    record = json.dumps({"driver": "550.54.15", "cuda": "12.4", "mps": "ready", "reason": ""})
    for node in GPU_NODES:
        fake.add_node(
            node,
            labels={"nvidia.com/gpu.present": "true"},
            annotations={"mpsched.io/gpus": "{}", "mpsched.io/agent": record},
        )
        fake.put(agent_pod(node))
    fake.add_node("cpu-1", labels={})
    fake.put(gpu_pod())
    for name, level in (("mpsched-system", "restricted"), ("mpsched-node", "privileged"),
                        ("ml", None)):  # fmt: skip
        store.put(namespace(name, level))
    store.put({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "mpsched-agent", "namespace": "mpsched-node"},
        "spec": {"selector": {"matchLabels": dict(AGENT_LABELS)},
                 "template": {"spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"}}}},
    })  # fmt: skip
    store.put({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "mpsched", "namespace": "mpsched-system"},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "extender", "image": "registry.example/mpsched:0.1.0"},
            {"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:{scheduler}"},
        ]}}},
        "status": {"replicas": 2, "readyReplicas": 2},
    })  # fmt: skip
    ca = b64(certificate_pem(365))
    service = {"name": "mpsched-webhook", "namespace": "mpsched-system", "port": 443}
    for kind, hook in (("MutatingWebhookConfiguration", "mutate.mpsched.io"),
                       ("ValidatingWebhookConfiguration", "validate.mpsched.io")):  # fmt: skip
        store.put({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": "mpsched"},
            "webhooks": [{"name": hook, "failurePolicy": "Fail",
                          "clientConfig": {"service": service, "caBundle": ca}}],
        })  # fmt: skip
    store.put(endpoint_slice(ready=True))
    store.put({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "mpsched-webhook-tls", "namespace": "mpsched-system"},
        "data": {"tls.crt": b64(certificate_pem(300)), "tls.key": b64("k"), "ca.crt": ca},
    })  # fmt: skip
    return fake


def endpoint_slice(*, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "mpsched-webhook-abc", "namespace": "mpsched-system",
                     "labels": {"kubernetes.io/service-name": "mpsched-webhook"}},
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}
                      for ip in ("10.0.0.5", "10.0.1.7")],
    }  # fmt: skip


async def checks_of(
    fake: FakeApiServer, tmp_path: Path, *, scheduler_minor: int | None = None
) -> dict[str, Check]:
    async with serving(fake, tmp_path) as served:
        found = await preflight(
            kubeconfig=served.kubeconfig, context=None, timeout_s=5.0,
            scheduler_minor=scheduler_minor,
        )  # fmt: skip
    return {c.name: c for c in found}


def failed(checks: dict[str, Check]) -> list[str]:
    return [name for name, c in checks.items() if c.status == "fail"]


async def test_a_healthy_cluster_is_all_ok(tmp_path: Path) -> None:
    checks = await checks_of(healthy(), tmp_path)
    assert list(checks) == [
        "versions", "gpu-nodes", "agent", "nvidia-runtime", "webhook", "webhook-endpoints",
        "certificates", "pod-security", "extender",
    ]  # fmt: skip
    assert {c.status for c in checks.values()} == {"ok"}, checks
    assert checks["gpu-nodes"].detail == "2 GPU nodes (2 by GFD label, 2 by agent inventory)"
    assert checks["webhook-endpoints"].detail.endswith("2 ready endpoints")
    assert checks["nvidia-runtime"].detail == "2 by the agent (NVML reached the driver)"


def _no_gpu_labels(fake: FakeApiServer) -> None:
    # Without GFD the DaemonSet selects no node: no agent ran, nothing was published.
    for node in GPU_NODES:
        fake.update_node(
            node,
            labels={"nvidia.com/gpu.present": None},
            annotations={"mpsched.io/gpus": None, "mpsched.io/agent": None},
        )
        fake.delete_pod("mpsched-node", f"mpsched-agent-{node}")


def _agent_not_ready(fake: FakeApiServer) -> None:
    fake.put(agent_pod("gpu-2", ready=False))


def _webhook_without_endpoints(fake: FakeApiServer) -> None:
    fake.objects.put(endpoint_slice(ready=False))


def _certificate_in_ten_days(fake: FakeApiServer) -> None:
    secret = fake.objects.objects[("/api/v1", "mpsched-system", "secrets", "mpsched-webhook-tls")]
    secret["data"]["tls.crt"] = b64(certificate_pem(10.5))


def _scheduler_client_certificate_in_ten_days(fake: FakeApiServer) -> None:
    # cluster-scheduler with cert-manager: the client certificate copied to the control plane.
    fake.objects.put({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "mpsched-scheduler-client", "namespace": "mpsched-system"},
        "data": {"tls.crt": b64(certificate_pem(10.5)), "tls.key": b64("k")},
    })  # fmt: skip


def _restricted_gpu_namespace(fake: FakeApiServer) -> None:
    fake.objects.put(namespace("ml", "restricted"))


BROKEN = {
    "no GPU labels": (
        _no_gpu_labels, "gpu-nodes", "kubectl label node NODE nvidia.com/gpu.present=true"
    ),
    "agent not ready": (_agent_not_ready, "agent", "kubectl -n mpsched-node describe pod"),
    "webhook without endpoints": (
        _webhook_without_endpoints, "webhook-endpoints", "app.kubernetes.io/name=mpsched-webhook"
    ),
    "certificate expiring in 10 days": (
        _certificate_in_ten_days, "certificates", "scripts/make-certs"
    ),
    "kube-scheduler's client certificate expiring": (
        _scheduler_client_certificate_in_ten_days, "certificates", "copy kube-scheduler's renewed"
    ),
    "GPU pods in a restricted namespace": (
        _restricted_gpu_namespace, "pod-security", "enforce=privileged"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BROKEN))
async def test_each_broken_cluster_fails_exactly_its_check(case: str, tmp_path: Path) -> None:
    breaks, check, fix = BROKEN[case]
    fake = healthy()
    breaks(fake)
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == [check], checks
    assert fix in checks[check].fix


async def test_the_details_name_what_is_broken(tmp_path: Path) -> None:
    fake = healthy()
    _agent_not_ready(fake)
    _certificate_in_ten_days(fake)
    _restricted_gpu_namespace(fake)
    checks = await checks_of(fake, tmp_path)
    assert checks["agent"].detail == "gpu-2: pod mpsched-agent-gpu-2 not ready"
    assert checks["certificates"].detail.startswith(
        "Secret mpsched-system/mpsched-webhook-tls tls.crt expires in 10 days"
    )
    assert checks["pod-security"].detail == (
        "namespace ml enforces restricted, which refuses 1 GPU pod(s): train-0: hostIPC, "
        "hostPath volume mpsched-mps-pipe, container app: allowPrivilegeEscalation != false, "
        "container app: runAsNonRoot != true, container app: no seccompProfile RuntimeDefault "
        "or Localhost, container app: capabilities do not drop ALL"
    )


async def test_a_scheduler_newer_than_the_api_server_fails_the_version_check(
    tmp_path: Path,
) -> None:
    checks = await checks_of(healthy(server="v1.31.9", scheduler="v1.33.4"), tmp_path)
    assert failed(checks) == ["versions"]
    assert "kube-scheduler 1.33 is newer than the API server 1.31" in checks["versions"].detail
    assert "deploy/components/kube-scheduler-1.31" in checks["versions"].fix
    # One minor older is within the policy; two are not.
    ok = await checks_of(healthy(server="v1.33.4", scheduler="v1.32.8"), tmp_path)
    assert failed(ok) == []
    old = await checks_of(healthy(server="v1.33.4", scheduler="v1.31.12"), tmp_path)
    assert failed(old) == ["versions"]
    assert "2 minors older" in old["versions"].detail


async def test_an_unsupported_api_server_fails(tmp_path: Path) -> None:
    checks = await checks_of(healthy(server="v1.29.15", scheduler="v1.29.15"), tmp_path)
    assert failed(checks) == ["versions"]
    assert "mpsched supports 1.30 to 1.33" in checks["versions"].detail


def _bare(server: str) -> FakeApiServer:
    """GPU nodes labelled by GFD, nothing of mpsched yet."""
    fake = FakeApiServer()
    fake.objects.version = {"major": "1", "minor": server.split(".")[1], "gitVersion": server}
    fake.add_node("gpu-1", labels={"nvidia.com/gpu.present": "true",
                                   "nvidia.com/cuda.driver.major": "550"})  # fmt: skip
    fake.objects.put(namespace("default", None))
    return fake


async def test_before_install_what_is_not_there_does_not_apply(tmp_path: Path) -> None:
    checks = await checks_of(_bare("v1.31.4"), tmp_path)
    assert failed(checks) == []
    skipped = [n for n, c in checks.items() if c.status == "skip"]
    assert skipped == ["agent", "webhook", "webhook-endpoints", "certificates", "extender"]
    assert checks["nvidia-runtime"].detail == "1 by GFD driver labels"
    # The default kube-scheduler (1.30) is too old for a 1.33 control plane: the check says
    # which component to install with, and passes once that minor is planned.
    checks = await checks_of(_bare("v1.33.1"), tmp_path)
    assert failed(checks) == ["versions"]
    assert "deploy/components/kube-scheduler-1.33" in checks["versions"].fix
    planned = await checks_of(_bare("v1.33.1"), tmp_path, scheduler_minor=33)
    assert failed(planned) == []


async def test_an_unreadable_certificate_fails_and_names_where(tmp_path: Path) -> None:
    fake = healthy()
    secret = fake.objects.objects[("/api/v1", "mpsched-system", "secrets", "mpsched-webhook-tls")]
    secret["data"]["tls.crt"] = b64("not a certificate")
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == ["certificates"]
    assert checks["certificates"].detail == (
        "Secret mpsched-system/mpsched-webhook-tls tls.crt: no PEM certificate in it"
    )


async def test_a_read_rbac_refuses_costs_its_check_only(tmp_path: Path) -> None:
    fake = healthy()
    fake.objects.forbidden = {"secrets"}
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == []
    assert checks["certificates"].detail.endswith(
        "(Secrets not readable: mpsched-scheduler-client, mpsched-tls, mpsched-webhook-tls)"
    )
    fake.objects.forbidden = {"daemonsets"}
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == ["agent"]
    assert checks["agent"].detail.startswith(
        "cannot read DaemonSet mpsched-node/mpsched-agent: daemonsets is forbidden"
    )
    assert "get/list" in checks["agent"].fix


async def test_cluster_scheduler_mode_uses_the_clusters_own_scheduler(tmp_path: Path) -> None:
    fake = healthy(server="v1.31.4")
    deployment = fake.objects.objects[("/apis/apps/v1", "mpsched-system", "deployments", "mpsched")]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    containers[:] = [c for c in containers if c["name"] != "kube-scheduler"]
    deployment["spec"]["replicas"] = 1
    deployment["status"]["readyReplicas"] = 1
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == []
    assert checks["versions"].detail == (
        "API server v1.31.4; the cluster's own kube-scheduler (cluster-scheduler mode)"
    )


async def test_a_missing_piece_fails_once_installed(tmp_path: Path) -> None:
    fake = healthy()
    fake.objects.delete("DaemonSet", "mpsched-agent", "mpsched-node")
    checks = await checks_of(fake, tmp_path)
    assert failed(checks) == ["agent"]
    assert checks["agent"].detail == "DaemonSet mpsched-node/mpsched-agent not found"


async def test_the_command_prints_json_and_exits_1_on_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = healthy()
    _webhook_without_endpoints(fake)
    async with serving(fake, tmp_path) as served:
        argv = ["preflight", "--kubeconfig", served.kubeconfig, "-o", "json"]
        code = await asyncio.to_thread(cli.main, argv)
        out = capsys.readouterr().out
        assert code == 1
        doc = json.loads(out)
        assert doc["ok"] is False
        assert [c["name"] for c in doc["checks"] if c["status"] == "fail"] == ["webhook-endpoints"]
        fake.objects.put(endpoint_slice(ready=True))
        code = await asyncio.to_thread(cli.main, ["preflight", "--kubeconfig", served.kubeconfig])
        table = capsys.readouterr().out
    assert code == 0
    assert table.splitlines()[0].startswith("✓ versions")
    assert table.splitlines()[-1] == "all checks passed"


def test_bad_usage_and_an_unreachable_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["preflight", "--scheduler-version", "1.29"]) == 2
    assert "not a Kubernetes minor from 1.30 to 1.33" in capsys.readouterr().err
    missing = str(tmp_path / "nope")
    assert cli.main(["preflight", "--kubeconfig", missing]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mpsched preflight: ") and len(err.strip().splitlines()) == 1
