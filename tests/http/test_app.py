"""The extender over HTTP, as kube-scheduler calls it: every verb in both nodeCacheCapable
modes, under a URL prefix, with lowercase keys; health, readiness, status and metrics; and bad
input (truncated, wrongly typed, oversized) answered with a 4xx and a JSON reason."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.cluster import FollowItem, Synced
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import SERVICE, HttpSettings
from extender.packing.codec import ALLOCATION_KEY
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, plain_node, pod

Json = dict[str, Any]
LIMIT = 256 * 1024


async def _client(
    aiohttp_client: Any, objects: Sequence[Json]
) -> tuple[TestClient[web.Request, web.Application], ExtenderService]:
    cluster = EmbeddedCluster.from_objects(objects)
    service = ExtenderService(cluster=cluster, config=Config.default())
    client = await aiohttp_client(make_app(service, HttpSettings(max_body_bytes=LIMIT)))
    await asyncio.wait_for(service.wait_ready(), 10)
    return client, service


OBJECTS: list[Json] = [
    gpu_node("a", gpus=2),
    gpu_node("b", gpus=1),
    plain_node("cpu"),
    pod("p25", threads=25),
    pod("whole2", gpus=2),
]


@pytest.fixture
async def client(aiohttp_client: Any) -> TestClient[web.Request, web.Application]:
    c, _ = await _client(aiohttp_client, OBJECTS)
    return c


def _pod(client: TestClient[web.Request, web.Application], name: str) -> Json:
    cluster = _service(client).cluster
    assert isinstance(cluster, EmbeddedCluster)
    found = cluster.pod("default", name)
    assert found is not None
    return found


def _service(client: TestClient[web.Request, web.Application]) -> ExtenderService:
    app = client.app
    assert app is not None
    return app[SERVICE]


async def _post(
    client: TestClient[web.Request, web.Application], path: str, body: object
) -> tuple[int, Any]:
    resp = await client.post(path, data=orjson.dumps(body))
    return resp.status, orjson.loads(await resp.read())


async def test_filter_node_names(client: TestClient[web.Request, web.Application]) -> None:
    p = _pod(client, "whole2")
    status, reply = await _post(
        client, "/filter", {"Pod": p, "Nodes": None, "NodeNames": ["a", "b", "cpu"]}
    )
    assert status == 200
    assert list(reply) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == ["a"]
    assert reply["FailedNodes"] == {}
    assert set(reply["FailedAndUnresolvableNodes"]) == {"b", "cpu"}
    assert reply["Error"] == ""


async def test_filter_full_nodes_echoes_the_passing_objects(
    client: TestClient[web.Request, web.Application],
) -> None:
    nodes: Json = {
        "metadata": {"resourceVersion": "7"},
        "items": [gpu_node("a", gpus=2), gpu_node("b", gpus=1)],
    }
    status, reply = await _post(
        client, "/filter", {"Pod": _pod(client, "whole2"), "Nodes": nodes, "NodeNames": None}
    )
    assert status == 200
    assert reply["NodeNames"] is None
    assert reply["Nodes"]["metadata"] == {"resourceVersion": "7"}
    assert reply["Nodes"]["items"] == [nodes["items"][0]]


async def test_verbs_under_a_prefix_and_lowercase_keys(
    client: TestClient[web.Request, web.Application],
) -> None:
    p = _pod(client, "p25")
    status, reply = await _post(client, "/scheduler/v1/filter", {"pod": p, "nodenames": ["a"]})
    assert status == 200 and reply["NodeNames"] == ["a"]
    status, reply = await _post(client, "/scheduler/prioritize", {"POD": p, "NodeNames": ["a"]})
    assert status == 200 and reply == [{"Host": "a", "Score": 10}]


async def test_prioritize_scores_are_integers(
    client: TestClient[web.Request, web.Application],
) -> None:
    p = _pod(client, "p25")
    _, filtered = await _post(client, "/filter", {"Pod": p, "NodeNames": ["a", "b"]})
    status, reply = await _post(
        client, "/prioritize", {"Pod": p, "NodeNames": filtered["NodeNames"]}
    )
    assert status == 200
    assert [h["Host"] for h in reply] == ["a", "b"]
    assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in reply)
    resp = await client.post("/prioritize", data=orjson.dumps({"Pod": p, "NodeNames": ["a"]}))
    assert b'"Score":' in await resp.read() and b"." not in await resp.read()


async def test_prioritize_after_filter_answers_as_a_fresh_extender_would(
    aiohttp_client: Any,
) -> None:
    """kube-scheduler's pair (same Pod bytes, the filter's NodeNames sent back) takes the
    decoder's and the service's shortcuts; the answer must be what an extender that never saw
    the filter gives, also when the cluster changed between the two calls."""
    objects = [gpu_node("a", gpus=2), gpu_node("b", gpus=2), gpu_node("c", gpus=1)]
    objects += [pod("p25", threads=25), pod("p50", threads=50), pod("q50", threads=50)]
    paired, _ = await _client(aiohttp_client, objects)
    fresh, _ = await _client(aiohttp_client, objects)
    p = _pod(paired, "p25")

    async def pair(client: TestClient[web.Request, web.Application]) -> tuple[Any, Any]:
        # Go's json.Marshal order: Pod, Nodes, NodeNames.
        _, filtered = await _post(
            client, "/filter", {"Pod": p, "Nodes": None, "NodeNames": ["a", "b", "c"]}
        )
        names = filtered["NodeNames"]
        _, scores = await _post(
            client, "/prioritize", {"Pod": p, "Nodes": None, "NodeNames": names}
        )
        return names, scores

    names, scores = await pair(paired)
    _, alone = await _post(fresh, "/prioritize", {"Pod": p, "Nodes": None, "NodeNames": names})
    assert scores == alone and len(names) == 3
    # A bind between filter and prioritize changes the scores; the shortcut must see it.
    _, filtered = await _post(paired, "/filter", {"Pod": p, "Nodes": None, "NodeNames": names})
    for client in (paired, fresh):
        args = {"PodName": "p50", "PodNamespace": "default", "PodUID": "uid-default-p50"}
        assert await _post(client, "/bind", {**args, "Node": "c"}) == (200, {"Error": ""})
    body = {"Pod": p, "Nodes": None, "NodeNames": filtered["NodeNames"]}
    _, after = await _post(paired, "/prioritize", body)
    _, after_fresh = await _post(fresh, "/prioritize", body)
    assert after == after_fresh


async def test_bind_creates_the_binding_with_annotations(
    client: TestClient[web.Request, web.Application],
) -> None:
    args = {"PodName": "p25", "PodNamespace": "default", "PodUID": "uid-default-p25", "Node": "a"}
    status, reply = await _post(client, "/bind", args)
    assert (status, reply) == (200, {"Error": ""})
    bound = _pod(client, "p25")
    assert bound["spec"]["nodeName"] == "a"
    assert ALLOCATION_KEY in bound["metadata"]["annotations"]
    # The scheduler's retry after a lost answer is a success.
    assert await _post(client, "/bind", args) == (200, {"Error": ""})
    # A refusal is a 200 with Error, as the protocol wants.
    status, reply = await _post(client, "/bind", {**args, "Node": "b"})
    assert status == 200 and "already holds GPUs" in reply["Error"]
    status, reply = await _post(
        client, "/bind", {"PodName": "x", "PodNamespace": "d", "PodUID": "u", "Node": "a"}
    )
    assert status == 200 and "not found" in reply["Error"]


async def test_preempt_answers_meta_victims(aiohttp_client: Any) -> None:
    objects = [
        gpu_node("n", gpus=1),
        pod("lo", threads=60, priority=1),
        pod("big", threads=80, priority=10),
    ]
    client, service = await _client(aiohttp_client, objects)
    await service.bind(name="lo", namespace="default", uid="uid-default-lo", node="n")
    status, reply = await _post(
        client,
        "/preempt",
        {
            "Pod": _pod(client, "big"),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "n": {"Pods": [{"UID": "uid-default-lo"}], "NumPDBViolations": 0}
            },
        },
    )
    assert status == 200
    assert reply == {
        "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "uid-default-lo"}], "NumPDBViolations": 0}}
    }
    # The scheduler's dry run cannot see GPU shares and proposes nobody: the extender adds the
    # lower-priority GPU pod itself.
    empty = {"Pod": _pod(client, "big"), "NodeNameToMetaVictims": {"n": {"Pods": []}}}
    status, reply = await _post(client, "/preempt", empty)
    assert status == 200
    assert reply["NodeNameToMetaVictims"]["n"]["Pods"] == [{"UID": "uid-default-lo"}]
    # Drawing from the proposal only, no victim set works: the node is left out.
    service.preempt_extra_victims = False
    status, reply = await _post(client, "/preempt", empty)
    assert (status, reply) == (200, {"NodeNameToMetaVictims": {}})


async def test_health_ready_status(client: TestClient[web.Request, web.Application]) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    resp = await client.get("/status")
    doc = orjson.loads(await resp.read())
    assert set(doc) == {"nodes", "summary", "config"}
    assert doc["summary"]["nodes"] == 2
    resp = await client.get("/status?node=b")
    assert [n["name"] for n in orjson.loads(await resp.read())["nodes"]] == ["b"]


class _StuckStream:
    """A follow stream whose first list never arrives."""

    restarts = 0

    def __aiter__(self) -> AsyncIterator[FollowItem]:
        return self._never()

    async def _never(self) -> AsyncIterator[FollowItem]:
        await asyncio.Event().wait()
        yield Synced()

    def close(self) -> None:
        pass


class _StuckCluster(EmbeddedCluster):
    """A cluster whose node list never arrives: the service stays not ready."""

    def follow(self) -> _StuckStream:  # type: ignore[override]
        return _StuckStream()


async def test_not_ready_is_reported(aiohttp_client: Any) -> None:
    service = ExtenderService(cluster=_StuckCluster(), config=Config.default())
    client = await aiohttp_client(make_app(service, HttpSettings()))
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 503
    status, reply = await _post(client, "/filter", {"Pod": {}, "NodeNames": ["a"]})
    assert status == 200 and "starting" in reply["Error"]
    status, _ = await _post(client, "/prioritize", {"Pod": {}, "NodeNames": ["a"]})
    assert status == 503
    status, reply = await _post(
        client, "/bind", {"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": "a"}
    )
    assert status == 200 and "starting" in reply["Error"]


async def test_metrics_are_valid_prometheus_text(
    client: TestClient[web.Request, web.Application],
) -> None:
    p = _pod(client, "p25")
    await _post(client, "/filter", {"Pod": p, "NodeNames": ["a"]})
    await _post(client, "/bind", {"PodName": "x", "PodNamespace": "d", "PodUID": "", "Node": "a"})
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = (await resp.read()).decode()
    assert 'mpsched_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert 'mpsched_bind_failures_total{reason="not_found"} 1.0' in text
    assert 'mpsched_gpu_mps_clients_capacity{node="a",gpu="0"} 48' in text
    assert "mpsched_request_duration_seconds_bucket" in text
    assert "mpsched_fragmentation_ratio" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (apt-get install prometheus provides it)")
    check = await asyncio.create_subprocess_exec(
        promtool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(check.communicate(text.encode()), 30)
    assert check.returncode == 0, output.decode()


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b'{"Pod": {"metadata":', 400, "not valid JSON"),
        (b'"just a string"', 400, "JSON str"),
        (b'{"NodeNames": ["a"]}', 400, "Pod is required"),
        (b'{"Pod": 3, "NodeNames": ["a"]}', 400, "Pod must be an object"),
        (b'{"Pod": {}, "NodeNames": [["a"]]}', 400, "only strings"),
        (b"\xff\xfe garbage", 400, "not valid JSON"),
        (b"[" * 100_000, 400, "not valid JSON"),
    ],
)
async def test_bad_requests_get_a_4xx_with_a_reason(
    client: TestClient[web.Request, web.Application], body: bytes, status: int, reason: str
) -> None:
    for verb in ("filter", "prioritize"):
        resp = await client.post(f"/{verb}", data=body)
        assert resp.status == status
        assert reason in orjson.loads(await resp.read())["Error"]
    resp = await client.post("/bind", data=b'{"PodName": 1}')
    assert resp.status == 400
    resp = await client.post("/preempt", data=b'{"Pod": {}, "NodeNameToMetaVictims": []}')
    assert resp.status == 400
    assert (await client.get("/filter")).status == 405


async def test_unknown_nodes_and_pods_are_not_errors(
    client: TestClient[web.Request, web.Application],
) -> None:
    status, reply = await _post(
        client, "/filter", {"Pod": pod("ghost", threads=10), "NodeNames": ["zz", "a"]}
    )
    assert status == 200
    assert reply["NodeNames"] == ["a"]
    assert "unknown" in reply["FailedAndUnresolvableNodes"]["zz"]


def _raw_exchange(port: int, head: bytes, chunks: Sequence[bytes]) -> tuple[bytes, float]:
    """Send a request on a bare socket and read the answer: the test controls exactly how much
    of the body goes out (a 100 MB body is announced, never sent)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the body ended: that is the point
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                more = sock.recv(65536)
                if not more:
                    break
                data += more
        except ConnectionResetError:
            pass
    return data, time.monotonic() - started


async def test_oversized_body_is_refused_before_it_is_read(
    client: TestClient[web.Request, web.Application],
) -> None:
    port = client.port
    assert port is not None
    head = (
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000000\r\n\r\n"
    )
    data, took = await asyncio.to_thread(_raw_exchange, port, head, [b"{" * 4096])
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert took < 2.0
    # Without Content-Length (chunked), reading stops at the limit.
    head = (
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    data, took = await asyncio.to_thread(_raw_exchange, port, head, [chunk] * 64)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert took < 5.0
