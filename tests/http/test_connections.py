"""Connection limits over real loopback HTTP (truth rule 6 of docs/design.md): idle and slow-loris
connections are closed after their deadlines while normal requests keep being answered, new
connections past the cap are closed at once, a client that stops reading its answer is dropped,
and none of it logs a line per connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import aiohttp
import orjson
import pytest

from extender.http.keys import HttpSettings
from tests.http.kube_objects import gpu_node, pod
from tests.http.served import closed_by_peer, raise_fd_limit, served

IDLE = 1000
SLOW_HEADERS = 150
SLOW_BODIES = 50


async def _trickle(writer: asyncio.StreamWriter, head: bytes, stop: asyncio.Event) -> None:
    """Send `head`, then one more byte a second until the server closes (a slow loris)."""
    writer.write(head)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if not stop.is_set():
            writer.write(b"a")


async def test_idle_and_slow_connections_are_closed_while_requests_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raise_fd_limit(2 * (IDLE + SLOW_HEADERS + SLOW_BODIES) + 512)
    settings = HttpSettings(idle_timeout_s=2.0, body_timeout_s=2.0, max_connections=3000)
    caplog.set_level(logging.INFO)
    async with served(settings) as s, aiohttp.ClientSession() as session:
        body = s.filter_body()

        async def filter_ok() -> None:
            async with session.post(s.url + "/filter", data=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["NodeNames"] == s.names

        await filter_ok()
        conns = []
        first_opened = time.monotonic()
        for _ in range(0, IDLE + SLOW_HEADERS + SLOW_BODIES, 100):
            conns += await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", s.site.port) for _i in range(100))
            )
        opened = time.monotonic()
        stops = [asyncio.Event() for _ in conns]
        tricklers = []
        for i, (_, writer) in enumerate(conns[IDLE:]):
            if i < SLOW_HEADERS:
                head = b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: "
            else:
                head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
            tricklers.append(asyncio.create_task(_trickle(writer, head, stops[IDLE + i])))
        await asyncio.sleep(0.2)
        assert s.site.guard.open >= len(conns)

        async def watch(i: int) -> tuple[float, bytes]:
            seen = await closed_by_peer(conns[i][0])
            stops[i].set()
            return time.monotonic() - first_opened, seen

        watchers = [asyncio.create_task(watch(i)) for i in range(len(conns))]
        answered = 0
        # Normal requests go on while the others are open, and after.
        while not all(w.done() for w in watchers) and time.monotonic() - opened < 9.0:
            await filter_ok()
            answered += 1
            await asyncio.sleep(0.02)
        assert all(w.done() for w in watchers), "connections left open by the server"
        results = [w.result() for w in watchers]
        await asyncio.gather(*tricklers)
        for _, writer in conns:
            writer.close()
        await filter_ok()
    closed_after = sorted(t for t, _ in results)
    # Idle and header-trickling ones at the idle deadline, body-trickling ones at the body
    # deadline (with a 408); none before (each opened after `first_opened`).
    assert closed_after[0] >= 1.9, closed_after[0]
    assert all(seen == b"" for _, seen in results[: IDLE + SLOW_HEADERS])
    assert all(seen.startswith(b"HTTP/1.1 408") for _, seen in results[IDLE + SLOW_HEADERS :])
    assert answered >= 20
    # Bounded logging: not a line per closed connection.
    assert len(caplog.records) < 10, [r.getMessage() for r in caplog.records[:10]]


async def test_connections_past_the_cap_are_closed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = HttpSettings(max_connections=20, log_interval_s=3600)
    async with served(settings) as s:
        kept = [await asyncio.open_connection("127.0.0.1", s.site.port) for _ in range(20)]
        await asyncio.sleep(0.1)
        refused = [await asyncio.open_connection("127.0.0.1", s.site.port) for _ in range(30)]
        started = time.monotonic()
        for reader, _ in refused:
            assert await asyncio.wait_for(closed_by_peer(reader), 2.0) == b""
        assert time.monotonic() - started < 2.0
        assert s.site.guard.refused == 30 and s.site.guard.open == 20
        # The admitted ones still work.
        reader, writer = kept[7]
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"ok"), 2.0)).startswith(b"HTTP/1.1 200")
        for _, w in kept + refused:
            w.close()
    lines = [r for r in caplog.records if r.name == "extender.http.listener"]
    assert len(lines) == 1 and "30" not in lines[0].getMessage()  # the first one, then quiet


async def test_a_client_that_stops_reading_is_dropped() -> None:
    settings = HttpSettings(send_timeout_s=1.0)
    # nodeCacheCapable=false: the answer echoes every passing Node, ~3 MB here.
    padding = {"note": "x" * 10_000}
    nodes = [gpu_node(f"big-{i}", gpus=2, labels=padding) for i in range(300)]
    async with served(settings, objects=nodes) as s:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", s.site.port))
        _, writer = await asyncio.open_connection(sock=sock)
        body = orjson.dumps({"Pod": pod("p", threads=10), "Nodes": {"items": nodes}})
        writer.write(
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        deadline = time.monotonic() + 8
        while s.site.guard.open and time.monotonic() < deadline:  # noqa: ASYNC110 (polls a count)
            await asyncio.sleep(0.1)
        assert s.site.guard.stalled == 1 and s.site.guard.open == 0
        writer.close()
