"""HTTPS with certificates made in the test (trustme): kube-scheduler's `enableHTTPS` with a CA
verifies the extender; a rotated certificate is served to new connections without a restart,
and a half-written rotation keeps the old certificate in force."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.service import ExtenderService
from extender.tls import CertificateReloader


def _write(ca: trustme.CA, directory: Path) -> tuple[str, str]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    return str(cert_file), str(key_file)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[int, CertificateReloader, trustme.CA]]:
    ca = trustme.CA()
    cert_file, key_file = _write(ca, tmp_path)
    reloader = CertificateReloader(cert_file, key_file, interval_s=3600)
    service = ExtenderService(cluster=EmbeddedCluster.from_objects([]), config=Config.default())
    app = make_app(service, HttpSettings())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    yield port, reloader, ca
    await runner.cleanup()


async def _get(port: int, ca: trustme.CA) -> int:
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    # A fresh connector per call: each request is a new TLS handshake.
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as session,
        session.get(f"https://127.0.0.1:{port}/healthz") as resp,
    ):
        return resp.status


Server = tuple[int, CertificateReloader, trustme.CA]


async def test_https_with_a_ca_verifies(server: Server) -> None:
    port, _, ca = server
    assert await _get(port, ca) == 200
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _get(port, trustme.CA())


async def test_rotated_certificate_is_served_without_restart(
    server: tuple[int, CertificateReloader, trustme.CA], tmp_path: Path
) -> None:
    port, reloader, old_ca = server
    assert not reloader.check()  # nothing changed yet
    new_ca = trustme.CA()
    _write(new_ca, tmp_path)
    assert reloader.check()
    assert reloader.reloads == 1
    assert await _get(port, new_ca) == 200
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _get(port, old_ca)


async def test_half_written_rotation_keeps_the_old_certificate(
    server: tuple[int, CertificateReloader, trustme.CA], tmp_path: Path
) -> None:
    port, reloader, ca = server
    # A new certificate with the old key (the key file not replaced yet): does not load.
    other = trustme.CA().issue_cert("127.0.0.1")
    other.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    assert not reloader.check()
    assert await _get(port, ca) == 200


async def test_a_client_certificate_is_required_when_a_client_ca_is_set(tmp_path: Path) -> None:
    ca, scheduler_ca = trustme.CA(), trustme.CA()
    cert_file, key_file = _write(ca, tmp_path)
    client_ca = tmp_path / "client-ca.crt"
    scheduler_ca.cert_pem.write_to_path(str(client_ca))
    reloader = CertificateReloader(cert_file, key_file, client_ca_file=str(client_ca))
    service = ExtenderService(cluster=EmbeddedCluster.from_objects([]), config=Config.default())
    runner = web.AppRunner(make_app(service, HttpSettings()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # No client certificate, or one another CA signed: the handshake fails.
        with pytest.raises(aiohttp.ClientError):
            await _get(port, ca)
        stranger = ssl.create_default_context()
        ca.configure_trust(stranger)
        trustme.CA().issue_cert("intruder").configure_cert(stranger)
        with pytest.raises(aiohttp.ClientError):
            await _get_with(port, stranger)
        # kube-scheduler's certificate (its extender tlsConfig.certFile/keyFile): answered.
        scheduler = ssl.create_default_context()
        ca.configure_trust(scheduler)
        scheduler_ca.issue_cert("kube-scheduler").configure_cert(scheduler)
        assert await _get_with(port, scheduler) == 200
    finally:
        await runner.cleanup()


async def _get_with(port: int, context: ssl.SSLContext) -> int:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(f"https://127.0.0.1:{port}/healthz") as resp,
    ):
        return resp.status
