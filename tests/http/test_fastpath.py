"""The verbs' fast path (`extender.http.fastpath`) over real loopback sockets: it answers as
aiohttp's handlers do, byte for byte; it hands whatever is not a plain verb POST to aiohttp with
the bytes already read; requests on one connection are answered in order, and a filter ahead of
the steps already queued on the loop; a bind in flight at shutdown still gets its answer; and
`parse_head` refuses every head it does not fully understand."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import pytest
from aiohttp import web

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.app import make_app
from extender.http.fastpath import (
    MAX_HEAD,
    FastConnection,
    FastVerbs,
    Head,
    fast_verbs,
    parse_head,
)
from extender.http.keys import HttpSettings
from extender.http.listener import serving
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod
from tests.http.served import Served, closed_by_peer, served

pytestmark = pytest.mark.accelerator("fast_path")

Json = dict[str, Any]


def post(path: str, body: bytes, *headers: str) -> bytes:
    """A request as Go's client writes it (plus `headers`)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += headers
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lower-case names) and its Content-Length body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return status, headers, body


@contextlib.asynccontextmanager
async def connection(
    s: Served, *, on_aiohttp: bool = False
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A keep-alive connection; `on_aiohttp`: handed to aiohttp first (a GET is not a verb)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", s.site.port)
    try:
        if on_aiohttp:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, _, body = await response(reader)
            assert (status, body) == (200, b"ok")
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


OBJECTS = [pod("running", threads=30, node="node-0001", phase="Running")]


def _requests(s: Served) -> list[tuple[str, bytes]]:
    some = s.names[:5]
    probe = pod("probe", threads=40)
    preempt = {
        "Pod": pod("urgent", threads=90, priority=100),
        "NodeNameToMetaVictims": {"node-0001": {"Pods": [{"UID": "uid-default-running"}]}},
    }
    return [
        ("/filter", s.filter_body(probe, some)),
        ("/prioritize", s.filter_body(probe, some)),
        ("/scheduler/filter", s.filter_body(pod("whole", gpus=2), some)),
        ("/filter", s.filter_body(pod("too-big", threads=100, memory="900Gi"), some)),
        ("/preempt", orjson.dumps(preempt)),
        # Refused binds change nothing, so both servers see the same ledger.
        ("/bind", b'{"PodName":"ghost","PodNamespace":"default","PodUID":"u","Node":"node-0002"}'),
        ("/bind", b'{"PodName":"","PodNamespace":"default","PodUID":"u","Node":"node-0002"}'),
        ("/filter", b"{not json"),
        ("/filter", b""),
        ("/prioritize", b'{"Pod": {}, "NodeNames": [1, 2]}'),
    ]


async def test_fast_answers_are_aiohttps_byte_for_byte() -> None:
    async with served(HttpSettings(), nodes=8, objects=OBJECTS) as s:
        answers: dict[bool, list[tuple[int, str, bytes]]] = {}
        servers: dict[bool, set[str]] = {}
        for on_aiohttp in (False, True):
            async with connection(s, on_aiohttp=on_aiohttp) as (reader, writer):
                got = answers[on_aiohttp] = []
                for path, body in _requests(s):
                    writer.write(post(path, body, "Content-Type: application/json"))
                    status, headers, answer = await response(reader)
                    got.append((status, headers["content-type"], answer))
                    servers.setdefault(on_aiohttp, set()).add(headers.get("server", ""))
        assert answers[False] == answers[True]
        # Each connection was served by the path meant: aiohttp names itself, the fast path not.
        assert servers[False] == {""}
        assert all("aiohttp" in name for name in servers[True])
        statuses = [status for status, _, _ in answers[False]]
        assert statuses == [200] * 6 + [400] * 4
        filtered = orjson.loads(answers[False][0][2])
        assert filtered["NodeNames"] and filtered["Error"] == ""


async def test_requests_on_one_connection_are_answered_in_order() -> None:
    async with served(HttpSettings(), nodes=8) as s, connection(s) as (reader, writer):
        bind = orjson.dumps(
            {"PodName": "ghost", "PodNamespace": "default", "PodUID": "u", "Node": "node-0001"}
        )
        # A bind (answered after an await) first, then two filters, all in one write.
        writer.write(
            post("/bind", bind)
            + post("/filter", s.filter_body(names=s.names[:2]))
            + post("/filter", s.filter_body(names=s.names[:3]))
        )
        first, second, third = [await response(reader) for _ in range(3)]
        assert "not found" in orjson.loads(first[2])["Error"]
        assert orjson.loads(second[2])["NodeNames"] == s.names[:2]
        assert orjson.loads(third[2])["NodeNames"] == s.names[:3]


async def test_many_requests_pipelined_in_one_read_are_all_answered() -> None:
    # Answered inside the read that brought them, each must hand the next on to the loop: by a
    # call per request, 1,500 of them in one read ended in a RecursionError.
    async with served(HttpSettings(), nodes=4) as s, connection(s) as (reader, writer):
        count = 1500
        writer.write(post("/filter", s.filter_body(names=s.names[:1])) * count)
        for _ in range(count):
            status, _, body = await response(reader)
            assert status == 200 and orjson.loads(body)["NodeNames"] == s.names[:1]


class _Transport:
    """What a FastConnection writes to, in `events` beside what else happened."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data
        self.events.append("answer")

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.events.append("closed")


async def test_a_filter_is_answered_behind_the_steps_already_queued() -> None:
    # A Binding's answer and the next filter read in one poll: the bind's task step was queued
    # by the first. It goes first: the filter waits for what remains of that bind, where the
    # bind would wait for the whole filter (and the prioritize after it) the other way round.
    async with served(HttpSettings(), nodes=4) as s:
        settings = HttpSettings()
        verbs = FastVerbs(make_app(s.service, settings), settings)
        events: list[str] = []
        transport = _Transport(events)
        conn = FastConnection(verbs, transport, events.append)  # type: ignore[arg-type]
        try:
            asyncio.get_running_loop().call_soon(events.append, "queued step")
            conn.data_received(post("/filter", s.filter_body(names=s.names[:2])))
            assert events == []  # nothing decided inside the read
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        finally:
            conn.connection_lost()
        assert events == ["queued step", "answer"]
        body = transport.written.partition(b"\r\n\r\n")[2]
        assert orjson.loads(body)["NodeNames"] == s.names[:2]


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Chunked: aiohttp reads it (its large-body path, as its size is unknown).
        b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n",
        # A query string, which aiohttp's router ignores.
        b"POST /filter?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s",
        # HTTP/1.0 with keep-alive asked for.
        b"POST /filter HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%s",
    ],
    ids=["chunked", "query", "http/1.0"],
)
async def test_other_requests_are_handed_to_aiohttp_with_what_was_read(
    request_bytes: bytes,
) -> None:
    async with served(HttpSettings(), nodes=4) as s, connection(s) as (reader, writer):
        body = s.filter_body()
        writer.write(request_bytes % (len(body), body))
        status, _, answer = await response(reader)
        assert status == 200
        assert orjson.loads(answer)["NodeNames"] == s.names
        # aiohttp serves the rest of the connection.
        writer.write(post("/filter", body))
        status, _, answer = await response(reader)
        assert (status, orjson.loads(answer)["NodeNames"]) == (200, s.names)


async def test_aiohttps_refusals_stand_for_what_the_fast_path_does_not_take() -> None:
    async with served(HttpSettings(max_body_bytes=4096), nodes=4) as s:
        async with connection(s) as (reader, writer):
            writer.write(post("/nothing", b"{}"))
            assert (await response(reader))[0] == 404
        async with connection(s) as (reader, writer):
            writer.write(b"POST /filter HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            status, _, answer = await response(reader)
            assert status == 400 and b"Host" in answer
        async with connection(s) as (reader, writer):
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 9999\r\n\r\n")
            status, _, answer = await response(reader)
            assert status == 413 and b"limit of 4096 bytes" in answer
        async with connection(s) as (reader, writer):
            writer.write(b"POST /filter HTTP/1.1\r\n" + b"X-Long: " + b"a" * MAX_HEAD + b"\r\n\r\n")
            assert (await response(reader))[0] in (400, 431)


async def test_connection_close_is_honoured() -> None:
    async with served(HttpSettings(), nodes=4) as s, connection(s) as (reader, writer):
        writer.write(post("/filter", s.filter_body(), "Connection: close"))
        status, headers, _ = await response(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await closed_by_peer(reader) == b""


async def test_a_body_that_does_not_arrive_is_refused_and_the_connection_closed() -> None:
    settings = HttpSettings(body_timeout_s=0.3)
    async with served(settings, nodes=4) as s, connection(s) as (reader, writer):
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        status, _, answer = await response(reader)
        assert status == 408 and b"within 0.3s" in answer
        assert await closed_by_peer(reader) == b""


async def test_an_unexpected_failure_answers_500_and_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(HttpSettings(), nodes=4) as s, connection(s) as (reader, writer):

        def broken(*_: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(s.service, "filter", broken)
        with caplog.at_level(logging.ERROR):
            writer.write(post("/filter", s.filter_body()))
            status, _, answer = await response(reader)
        assert (status, orjson.loads(answer)) == (500, {"Error": "internal error"})
        assert "filter failed" in caplog.text and "a bug" in caplog.text
        # The connection still serves.
        monkeypatch.undo()
        writer.write(post("/filter", s.filter_body()))
        assert (await response(reader))[0] == 200


class _SlowBinds(EmbeddedCluster):
    """An embedded cluster whose Binding takes until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.started.set()
        await self.release.wait()
        await super().bind(
            namespace=namespace, name=name, uid=uid, node=node, annotations=annotations
        )


async def test_a_bind_in_flight_at_shutdown_is_answered_and_idle_connections_closed() -> None:
    cluster = _SlowBinds()
    cluster.apply(gpu_node("node-0001"))
    cluster.apply(pod("slow", threads=10))
    service = ExtenderService(cluster=cluster, config=Config.default())
    settings = HttpSettings()
    async with contextlib.AsyncExitStack() as stack:
        site = await stack.enter_async_context(
            serving(make_app(service, settings), settings, host="127.0.0.1", port=0)
        )
        await asyncio.wait_for(service.wait_ready(), 10)
        idle_reader, _ = await asyncio.open_connection("127.0.0.1", site.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        body = orjson.dumps(
            {
                "PodName": "slow",
                "PodNamespace": "default",
                "PodUID": "uid-default-slow",
                "Node": "node-0001",
            }
        )
        writer.write(post("/bind", body))
        await asyncio.wait_for(cluster.started.wait(), 10)
        shutdown = asyncio.create_task(stack.aclose())
        # The idle connection goes at once, while the bind is still waiting.
        assert await asyncio.wait_for(closed_by_peer(idle_reader), 5) == b""
        assert not shutdown.done()
        cluster.release.set()
        status, headers, answer = await response(reader)
        assert (status, orjson.loads(answer), headers["connection"]) == (
            200,
            {"Error": ""},
            "close",
        )
        await asyncio.wait_for(shutdown, 10)
    bound = cluster.pod("default", "slow")
    assert bound is not None and bound["spec"]["nodeName"] == "node-0001"


# -- parse_head -------------------------------------------------------------------------------


def _head(*lines: str) -> bytes:
    return "\r\n".join(lines).encode("latin-1")


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (
            _head("POST /filter HTTP/1.1", "Host: x", "Content-Length: 12"),
            Head("filter", 12, False),
        ),
        (_head("POST /a/b-c/bind HTTP/1.1", "content-length:3", "HOST:x"), Head("bind", 3, False)),
        (
            _head("POST /x/prioritize HTTP/1.1", "Host: x", "Connection: Close"),
            Head("prioritize", 0, True),
        ),
        (
            _head("POST /preempt HTTP/1.1", "Connection: keep-alive", "Host: x"),
            Head("preempt", 0, False),
        ),
        # What kube-scheduler's Go client writes, header for header.
        (
            _head(
                "POST /scheduler/filter HTTP/1.1",
                "Host: mpsched.kube-system:8888",
                "User-Agent: Go-http-client/1.1",
                "Content-Length: 2",
                "Content-Type: application/json",
                "Accept-Encoding: gzip",
            ),
            Head("filter", 2, False),
        ),
    ],
)
def test_parse_head_takes_plain_verb_posts(head: bytes, expected: Head) -> None:
    assert parse_head(head) == expected


@pytest.mark.parametrize(
    "lines",
    [
        ("GET /filter HTTP/1.1",),
        ("POST /filter HTTP/1.0",),
        ("POST /filter HTTP/1.1 extra",),
        ("POST  /filter HTTP/1.1",),
        ("POST /filter?x=1 HTTP/1.1",),
        ("POST /fil%74er HTTP/1.1",),
        ("POST //filter HTTP/1.1",),
        ("POST /filters HTTP/1.1",),
        ("POST /status HTTP/1.1",),
        ("POST filter HTTP/1.1",),
        ("POST /filter HTTP/1.1", "Transfer-Encoding: chunked"),
        ("POST /filter HTTP/1.1", "Expect: 100-continue"),
        ("POST /filter HTTP/1.1", "Upgrade: h2c"),
        ("POST /filter HTTP/1.1", "Connection: upgrade"),
        ("POST /filter HTTP/1.1", "Content-Length: 5", "Content-Length: 5"),
        ("POST /filter HTTP/1.1", "Content-Length: +5"),
        ("POST /filter HTTP/1.1", "Content-Length: 5 5"),
        ("POST /filter HTTP/1.1", "Content-Length: "),
        ("POST /filter HTTP/1.1", "X: y", " folded"),
        ("POST /filter HTTP/1.1", "Bad Name: x"),
        ("POST /filter HTTP/1.1", ": x"),
        ("POST /filter HTTP/1.1", "no colon"),
        ("POST /filter HTTP/1.1", "X: a\nContent-Length: 5"),
        ("POST /filter HTTP/1.1", "X: a\rb"),
        ("POST /filter HTTP/1.1", "X: a\x00b"),
        ("POST /filter HTTP/1.1", "X: a\x7fb"),
    ],
)
def test_parse_head_leaves_everything_else_to_aiohttp(lines: tuple[str, ...]) -> None:
    request, *headers = lines
    # One Host each, so that each case is refused for its own reason.
    assert parse_head(_head(request, "Host: x", *headers)) is None


@pytest.mark.parametrize("hosts", [(), ("Host: x", "Host: x")], ids=["none", "two"])
def test_parse_head_leaves_a_missing_or_repeated_host_to_aiohttp(hosts: tuple[str, ...]) -> None:
    # aiohttp answers 400: HTTP/1.1 wants exactly one Host.
    assert parse_head(_head("POST /filter HTTP/1.1", "Content-Length: 2", *hosts)) is None
    assert parse_head(_head("POST /filter HTTP/1.1", "Content-Length: 2", "Host: x")) is not None


async def test_a_request_split_anywhere_is_read_whole() -> None:
    async with served(HttpSettings(), nodes=4) as s, connection(s) as (reader, writer):
        request = post("/filter", s.filter_body())
        head_end = request.index(b"\r\n\r\n")
        # Inside the request line, inside the blank line, and inside the body, as TLS records
        # or TCP segments may cut it.
        for cuts in ((5,), (head_end + 2,), (head_end + 10, len(request) - 1), (1, 2, 3)):
            pieces = [request[a:b] for a, b in zip((0, *cuts), (*cuts, len(request)), strict=True)]
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.01)
            status, headers, answer = await response(reader)
            assert (status, orjson.loads(answer)["NodeNames"]) == (200, s.names)
            assert "server" not in headers  # answered on the fast path, not handed over


async def test_an_app_with_a_middleware_sees_every_verb_request() -> None:
    """The fast path answers what no middleware would see, so an application given one is
    served by aiohttp alone and the middleware sees the filter."""
    seen: list[str] = []

    @web.middleware
    async def note(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.path)
        response: web.StreamResponse = await handler(request)
        return response

    settings = HttpSettings()
    cluster = EmbeddedCluster.from_objects([])
    service = ExtenderService(cluster=cluster, config=Config.default())
    app = make_app(service, settings)
    app.middlewares.append(note)
    assert fast_verbs(app, settings) is None
    async with serving(app, settings, host="127.0.0.1", port=0) as site:
        await asyncio.wait_for(service.wait_ready(), 10)
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(post("/filter", orjson.dumps({"Pod": pod("p", threads=10), "NodeNames": []})))
        status, _, _ = await response(reader)
        writer.close()
    assert status == 200 and seen == ["/filter"]
