"""The pure rules under `mpsched preflight`: a certificate's expiry read from its DER (both
time encodings RFC 5280 uses, checked against the cryptography library's reading), and what
each Pod Security level refuses."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from extender.certificates import CertificateError, not_after, pem_certificates
from extender.commands.pod_security import enforced_level, violations
from extender.commands.preflight_versions import scheduler_skew


def _pem(end: dt.datetime) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(end)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(Encoding.PEM).decode()


@pytest.mark.parametrize(
    "end",
    [
        dt.datetime(2027, 3, 4, 5, 6, 7, tzinfo=dt.UTC),  # UTCTime
        dt.datetime(2051, 1, 2, 3, 4, 5, tzinfo=dt.UTC),  # GeneralizedTime (2050 and later)
    ],
)
def test_not_after_reads_both_time_encodings(end: dt.datetime) -> None:
    pem = _pem(end)
    (der,) = pem_certificates(pem)
    assert not_after(der) == end == x509.load_pem_x509_certificate(pem.encode()).not_valid_after_utc


def test_a_bundle_gives_every_certificate_and_garbage_is_refused() -> None:
    ends = [dt.datetime(2027, 1, 1, tzinfo=dt.UTC), dt.datetime(2028, 1, 1, tzinfo=dt.UTC)]
    bundle = "".join(_pem(e) for e in ends)
    assert [not_after(d) for d in pem_certificates(bundle)] == ends
    with pytest.raises(CertificateError):
        not_after(b"\x30\x82\xff")
    with pytest.raises(CertificateError):
        pem_certificates("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----")


SHARE_POD = {
    "hostIPC": True,
    "volumes": [
        {"name": "pipe", "hostPath": {"path": "/tmp/nvidia-mps"}},
        {"name": "c", "configMap": {}},
    ],
    "containers": [{"name": "app"}],
}
HARDENED = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "volumes": [{"name": "c", "configMap": {}}],
    "containers": [
        {
            "name": "app",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
}


def test_levels_refuse_what_pod_security_refuses() -> None:
    assert violations(SHARE_POD, "privileged") == []
    assert violations(SHARE_POD, "baseline") == ["hostIPC", "hostPath volume pipe"]
    assert violations(HARDENED, "restricted") == []
    assert violations(HARDENED, "baseline") == []
    added = {"name": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}}
    assert violations({"containers": [added]}, "baseline") == [
        "container x: adds capabilities SYS_ADMIN"
    ]
    nfs = {**HARDENED, "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}
    assert violations(nfs, "restricted") == ["nfs volume n"]


def test_a_namespace_without_a_label_is_privileged() -> None:
    assert enforced_level(None) == "privileged"
    assert enforced_level({"metadata": {"labels": {}}}) == "privileged"
    labelled = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    assert enforced_level(labelled) == "baseline"


def test_the_scheduler_skew_rule() -> None:
    assert scheduler_skew(33, 33) is None
    assert scheduler_skew(33, 32) is None
    assert scheduler_skew(31, 32) == "kube-scheduler 1.32 is newer than the API server 1.31"
    assert "2 minors older" in (scheduler_skew(33, 31) or "")
