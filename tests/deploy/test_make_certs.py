"""scripts/make-certs --dry-run: the certificates chain to one CA, reused on a second run; the
webhook's and the extender's serving certificates name what their clients dial (the Service
DNS names, and the fixed ClusterIP the host-network scheduler uses) and serve only; the
scheduler's is a client certificate; the Secrets it would apply validate against 1.33 and are
the ones the manifests mount; bad usage exits 2."""

from __future__ import annotations

import base64
import ipaddress
import subprocess
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]  # ships no types
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.deploy.manifests import CLUSTER, OWN, REPO, one

SCRIPT = REPO / "scripts" / "make-certs"


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=30, check=False)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _usage(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName), [
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    ]


def test_cluster_scheduler_certificates(tmp_path: Path) -> None:
    done = _run(CLUSTER, "--out", tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    ca = _cert(tmp_path / "ca.crt")
    for name in ("webhook", "extender", "scheduler"):
        leaf = _cert(tmp_path / f"{name}.crt")
        leaf.verify_directly_issued_by(ca)
        constraints = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert not constraints.ca
    assert _usage(_cert(tmp_path / "scheduler.crt")) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    for name in ("webhook", "extender"):
        assert _usage(_cert(tmp_path / f"{name}.crt")) == {ExtendedKeyUsageOID.SERVER_AUTH}
    webhook = one(OWN, "Service", "mpsched-webhook")
    dns, _ = _names(_cert(tmp_path / "webhook.crt"))
    assert f"{webhook['metadata']['name']}.{webhook['metadata']['namespace']}.svc" in dns
    service = one(CLUSTER, "Service", "mpsched")
    dns, ips = _names(_cert(tmp_path / "extender.crt"))
    assert "mpsched.mpsched-system.svc" in dns
    assert ips == [service["spec"]["clusterIP"]]
    secrets = [d for d in yaml.safe_load_all((tmp_path / "secrets.yaml").read_text()) if d]
    assert {s["metadata"]["name"] for s in secrets} == {"mpsched-webhook-tls", "mpsched-tls"}
    for secret in secrets:
        kubernetes_validate.validate(secret, "1.33", strict=True)
        # ca.crt is what the extender trusts for client certificates: the scheduler's CA.
        assert base64.b64decode(secret["data"]["ca.crt"]) == (tmp_path / "ca.crt").read_bytes()
    # A second run keeps the CA (what trusts it goes on trusting) and renews the leaves.
    first = (tmp_path / "webhook.crt").read_bytes()
    assert _run(CLUSTER, "--out", tmp_path, "--dry-run").returncode == 0
    assert _cert(tmp_path / "ca.crt") == ca
    assert (tmp_path / "webhook.crt").read_bytes() != first
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0


def test_own_scheduler_needs_the_webhooks_only(tmp_path: Path) -> None:
    assert _run(OWN, "--out", tmp_path, "--dry-run", "--cluster-ip", "10.0.0.9").returncode == 0
    assert not (tmp_path / "extender.crt").exists()
    (secret,) = [d for d in yaml.safe_load_all((tmp_path / "secrets.yaml").read_text()) if d]
    assert secret["metadata"]["name"] == "mpsched-webhook-tls"


def test_another_cluster_ip_goes_into_the_certificate(tmp_path: Path) -> None:
    assert _run(CLUSTER, "--out", tmp_path, "--dry-run", "--cluster-ip", "10.0.0.9").returncode == 0
    _, ips = _names(_cert(tmp_path / "extender.crt"))
    assert [ipaddress.ip_address(ip) for ip in ips] == [ipaddress.ip_address("10.0.0.9")]
    entry = yaml.safe_load((tmp_path / "kube-scheduler-extender.yaml").read_text())
    assert entry["extenders"][0]["urlPrefix"] == "https://10.0.0.9:8888"


def test_bad_usage_exits_2_with_one_line(tmp_path: Path) -> None:
    for args in ([], ["bogus"], [OWN, "--days", "x"], [CLUSTER, "--cluster-ip", "nope"]):
        done = _run(*args, "--out", tmp_path) if args else _run()
        assert done.returncode == 2, args
        assert len(done.stderr.strip().splitlines()) == 1, args
