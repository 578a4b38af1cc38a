"""The webhook's /metrics: reviews counted by endpoint and outcome (allowed, denied, error,
rejected) with their latency, over HTTP; the serving certificate's seconds to expiry, read from
the file at scrape time (a rotated file shows at once), 0 when it cannot be read; the DER
reading of notAfter agrees with `cryptography` for both ASN.1 time forms."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography import x509

from extender.certificates import CertificateError, pem_not_after
from extender.config import Config
from extender.webhook import app as webhook_app
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app, make_metrics_app
from extender.webhook.metrics import WebhookMetrics
from extender.webhook.review import AdmissionRequest, Decision
from tests.observability.served import samples, value
from tests.webhook.reviews import container, pod_object, review

Client = TestClient[web.Request, web.Application]
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
SETTINGS = AdmissionSettings.from_config(Config.default())


def _cert(tmp_path: Path, expires: dt.datetime, name: str = "tls.crt") -> Path:
    ca = trustme.CA()
    cert = ca.issue_cert("mpsched-webhook.mpsched-system.svc", not_after=expires)
    path = tmp_path / name
    path.write_bytes(cert.cert_chain_pems[0].bytes())
    return path


async def _post(client: Client, path: str, body: bytes) -> None:
    async with client.post(path, data=body) as r:
        await r.read()


async def test_reviews_are_counted_by_outcome_with_their_latency(
    aiohttp_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert = _cert(tmp_path, dt.datetime(2026, 12, 11))  # 10 days left
    metrics = WebhookMetrics(cert_file=str(cert), clock=NOW.timestamp)
    client: Client = await aiohttp_client(make_app(SETTINGS, metrics=metrics))
    share = pod_object(container(limits={"mpsched.io/threads": "10"}))
    forged = pod_object(container(limits={"mpsched.io/threads": "10"}))
    forged["metadata"]["annotations"] = {"mpsched.io/allocation": "{}"}
    await _post(client, "/mutate", orjson.dumps(review(share)))
    await _post(client, "/validate", orjson.dumps(review(share)))
    await _post(client, "/validate", orjson.dumps(review(forged)))
    await _post(client, "/mutate", b"{not json")

    def broken(endpoint: str, request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
        raise RuntimeError("a bug")

    monkeypatch.setattr(webhook_app, "decide", broken)
    await _post(client, "/validate", orjson.dumps(review(share)))
    async with client.get("/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        found = samples(await r.text())
    counts = {
        (endpoint, outcome): value(
            found, "mpsched_webhook_admissions_total", endpoint=endpoint, outcome=outcome
        )
        for endpoint in ("mutate", "validate")
        for outcome in ("allowed", "denied", "error", "rejected")
    }
    assert {k: v for k, v in counts.items() if v} == {
        ("mutate", "allowed"): 1,
        ("mutate", "rejected"): 1,
        ("validate", "allowed"): 1,
        ("validate", "denied"): 1,
        ("validate", "error"): 1,
    }
    assert (
        value(found, "mpsched_webhook_admission_duration_seconds_count", endpoint="validate") == 3
    )
    assert value(found, "mpsched_webhook_certificate_expiry_seconds") == 10 * 86400


async def test_the_metrics_listener_follows_a_rotated_certificate(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    cert = _cert(tmp_path, dt.datetime(2026, 12, 2))
    metrics = WebhookMetrics(cert_file=str(cert), clock=NOW.timestamp)
    client: Client = await aiohttp_client(make_metrics_app(metrics))

    async def expiry() -> float:
        async with client.get("/metrics") as r:
            return value(samples(await r.text()), "mpsched_webhook_certificate_expiry_seconds")

    assert await expiry() == 86400
    cert.write_bytes(_cert(tmp_path, dt.datetime(2027, 12, 1), "new.crt").read_bytes())
    assert await expiry() == 365 * 86400
    cert.write_text("not a certificate")
    assert await expiry() == 0
    cert.unlink()
    assert await expiry() == 0


@pytest.mark.parametrize("year", [2027, 2049, 2050, 2100])
def test_not_after_agrees_with_cryptography(year: int) -> None:
    # Before 2050 the certificate says UTCTime, from 2050 GeneralizedTime.
    ca = trustme.CA()
    pem = ca.issue_cert("x.example", not_after=dt.datetime(year, 3, 4, 5, 6, 7)).cert_chain_pems
    text = pem[0].bytes()
    expected = x509.load_pem_x509_certificate(text).not_valid_after_utc
    assert pem_not_after(text) == expected == dt.datetime(year, 3, 4, 5, 6, 7, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    ],
)
def test_what_is_no_certificate_is_an_error(text: bytes) -> None:
    with pytest.raises(CertificateError):
        pem_not_after(text)
