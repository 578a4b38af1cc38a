"""The webhook over HTTP as kube-apiserver calls it: AdmissionReview v1 in and out (uid echoed,
a base64 JSONPatch), over TLS once; malformed reviews (truncated, wrong apiVersion or kind, no
request, wrong types, 5 MB, deeply nested, announced but never sent) get a 4xx with a reason or
a denying review, never a 5xx or a hang; a decision that fails is a denial, not a 500."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.config import Config
from extender.tls import CertificateReloader
from extender.webhook import app as webhook_app
from extender.webhook.admission import THREADS_ENV, AdmissionSettings
from extender.webhook.app import make_app
from extender.webhook.review import ReviewError, parse_review
from extender.webhook.validation import decide
from tests.webhook.reviews import Json, apply_patch, container, patch_of, pod_object, review

Client = TestClient[web.Request, web.Application]
SETTINGS = AdmissionSettings.from_config(Config.default())
SHARE = {"mpsched.io/threads": "25"}


@pytest.fixture
async def client(aiohttp_client: Any) -> Client:
    c: Client = await aiohttp_client(make_app(SETTINGS))
    return c


async def _post(client: Client, path: str, body: bytes | Json) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with client.post(path, data=data, headers={"Content-Type": "application/json"}) as r:
        raw = await r.read()
        return r.status, orjson.loads(raw) if raw else None


async def test_mutate_answers_a_review_with_a_base64_json_patch(client: Client) -> None:
    obj = pod_object(container(limits=SHARE))
    status, answer = await _post(client, "/mutate", review(obj, uid="u-1"))
    assert status == 200
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    pod = apply_patch(obj, patch_of(answer))
    assert THREADS_ENV in {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    # Re-admission of the patched pod: allowed, no patch at all.
    status, again = await _post(client, "/mutate", review(pod))
    assert status == 200 and again["response"] == {"uid": again["response"]["uid"], "allowed": True}


async def test_a_pod_that_asks_for_nothing_gets_no_patch(client: Client) -> None:
    for path in ("/mutate", "/validate"):
        status, answer = await _post(client, path, review(pod_object(container())))
        assert status == 200
        assert answer["response"] == {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "allowed": True,
        }


async def test_validate_denies_with_the_reason_in_the_status(client: Client) -> None:
    obj = pod_object(container(limits=SHARE), nodeName="n1")
    status, answer = await _post(client, "/validate", review(obj, dry_run=True, uid="u-2"))
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "u-2" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith("spec.nodeName: ")
    assert "patch" not in response


BAD_BODIES = {
    "truncated": orjson.dumps(review(pod_object()))[:-20],
    "empty": b"",
    "not json": b"hello",
    "a list": b"[1, 2]",
    "v1beta1": orjson.dumps({**review(pod_object()), "apiVersion": "admission.k8s.io/v1beta1"}),
    "wrong kind": orjson.dumps({**review(pod_object()), "kind": "AdmissionResponse"}),
    "no request": orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    "request a list": orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}
    ),
    "uid a number": orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": 7, "operation": "CREATE"},
        }
    ),
    "bad operation": orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "PATCH"},
        }
    ),
    "deeply nested": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "invalid utf-8": b'{"apiVersion": "\xff"}',
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
async def test_malformed_reviews_get_a_400_with_a_reason(client: Client, name: str) -> None:
    for path in ("/mutate", "/validate"):
        status, answer = await _post(client, path, BAD_BODIES[name])
        assert status == 400, (name, answer)
        assert isinstance(answer["error"], str) and answer["error"]


async def test_wrongly_typed_pods_are_denied_inside_the_review(client: Client) -> None:
    bad = review(pod_object())
    bad["request"]["object"]["spec"]["containers"] = [{"name": "a", "resources": {"limits": 3}}]
    for path in ("/mutate", "/validate"):
        status, answer = await _post(client, path, bad)
        assert status == 200
        assert answer["response"]["allowed"] is False
        assert "resources.limits must be an object" in answer["response"]["status"]["message"]


async def test_a_5_mb_body_is_refused(client: Client) -> None:
    big = review(pod_object(container(limits=SHARE)))
    big["request"]["object"]["metadata"]["annotations"] = {"x": "y" * 5_000_000}
    status, answer = await _post(client, "/validate", big)
    assert status == 413 and "exceeds the limit" in answer["error"]


def _raw(port: int, head: bytes, body: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                break
            data += more
    return data, time.monotonic() - started


async def test_an_announced_large_body_is_refused_before_it_is_read(client: Client) -> None:
    assert client.port is not None
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000000\r\n\r\n"
    )
    data, took = await asyncio.to_thread(_raw, client.port, head, b"{")
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert took < 2.0


async def test_a_failing_decision_is_a_denial_not_a_500(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(webhook_app, "decide", broken)
    status, answer = await _post(client, "/validate", review(pod_object(container(limits=SHARE))))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert "internal error" in answer["response"]["status"]["message"]


async def test_health_and_readiness(client: Client) -> None:
    for path in ("/healthz", "/readyz"):
        async with client.get(path) as r:
            assert r.status == 200
    async with client.get("/mutate") as r:
        assert r.status == 405


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "spec",
                    "metadata",
                    "containers",
                    "initContainers",
                    "resources",
                    "limits",
                    "requests",
                    "name",
                    "env",
                    "annotations",
                    "nodeName",
                    "mpsched.io/threads",
                    "mpsched.io/gpus",
                    "volumes",
                    "volumeMounts",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_JSON, old=_JSON, operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
def test_any_object_gets_a_decision(obj: Any, old: Any, operation: str) -> None:
    doc = review(None, operation=operation)
    doc["request"]["object"], doc["request"]["oldObject"] = obj, old
    request = parse_review(json.loads(json.dumps(doc)))
    for endpoint in ("mutate", "validate"):
        decision = decide(endpoint, request, SETTINGS)
        assert decision.allowed or decision.message


@given(doc=_JSON)
def test_any_document_parses_or_is_a_review_error(doc: Any) -> None:
    with contextlib.suppress(ReviewError):
        parse_review(doc)


# --- TLS ----------------------------------------------------------------------------------


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, trustme.CA]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "mpsched-webhook.mpsched-system.svc")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    reloader = CertificateReloader(str(cert_file), str(key_file), interval_s=3600)
    runner = web.AppRunner(make_app(SETTINGS))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
    await site.start()
    yield runner.addresses[0][1], ca
    await runner.cleanup()


async def test_a_review_over_tls(tls_server: tuple[int, trustme.CA]) -> None:
    port, ca = tls_server
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    body = review(pod_object(container(limits=SHARE)))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust)) as session,
        session.post(f"https://127.0.0.1:{port}/mutate", json=body) as resp,
    ):
        assert resp.status == 200
        answer = await resp.json()
    assert answer["response"]["allowed"] is True
    assert json.loads(base64.b64decode(answer["response"]["patch"]))
