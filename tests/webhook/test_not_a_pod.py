"""Issue 29 item 9: a review that is not about a Pod, or whose object (or oldObject) is not a
Pod, is denied by /mutate and /validate with a reason, over HTTP; a Pod review passes on."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.config import Config
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app
from tests.webhook.reviews import Json, container, pod_object, review

Client = TestClient[web.Request, web.Application]
SHARE = {"mpsched.io/threads": "10"}
CONFIG_MAP: Json = {
    "kind": "ConfigMap",
    "apiVersion": "v1",
    "metadata": {"name": "gpu-env", "namespace": "team-a"},
    "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
}


def _forged(obj: object, *, field: str = "object", kind: str | None = None) -> Json:
    """A pod review (request.kind Pod unless `kind`) carrying `obj` in `field`."""
    body = review(pod_object(container(limits=SHARE)))
    request = body["request"]
    request[field] = obj
    if field == "oldObject":
        request["operation"] = "UPDATE"
    if kind is not None:
        request["kind"] = request["requestKind"] = {"group": "", "version": "v1", "kind": kind}
    return body


CASES = {
    "a ConfigMap under a pod review": (_forged(CONFIG_MAP), "request.object must be a v1 Pod"),
    "a ConfigMap as the old object": (
        _forged(CONFIG_MAP, field="oldObject"),
        "request.oldObject must be a v1 Pod",
    ),
    "an object without a kind": (
        _forged({"metadata": {}, "spec": {"containers": []}}),
        "request.object must be a v1 Pod, got kind None",
    ),
    "a list as the object": (_forged([1]), "got list"),
    "a Pod of another API version": (
        _forged({**pod_object(), "apiVersion": "v2"}),
        "request.object must be a v1 Pod",
    ),
    "a review of ConfigMaps": (
        _forged(CONFIG_MAP, kind="ConfigMap"),
        "request.kind is 'ConfigMap'",
    ),
}


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@pytest.mark.parametrize("case", CASES)
async def test_a_review_of_something_else_than_a_pod_is_denied(
    aiohttp_client: Any, endpoint: str, case: str
) -> None:
    body, reason = CASES[case]
    client: Client = await aiohttp_client(make_app(AdmissionSettings.from_config(Config.default())))
    async with client.post(endpoint, data=orjson.dumps(body)) as r:
        assert r.status == 200
        answer = orjson.loads(await r.read())["response"]
    assert answer["allowed"] is False
    assert reason in answer["status"]["message"], answer
    assert "patch" not in answer


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
async def test_a_pod_review_is_still_decided(aiohttp_client: Any, endpoint: str) -> None:
    client: Client = await aiohttp_client(make_app(AdmissionSettings.from_config(Config.default())))
    body = review(pod_object(container(limits=SHARE)))
    async with client.post(endpoint, data=orjson.dumps(body)) as r:
        answer = orjson.loads(await r.read())["response"]
    assert answer["allowed"] is True
    # A DELETE carries no object: nothing to check, nothing to deny.
    body["request"].update(operation="DELETE", object=None, oldObject=pod_object())
    async with client.post(endpoint, data=orjson.dumps(body)) as r:
        assert orjson.loads(await r.read())["response"]["allowed"] is True
