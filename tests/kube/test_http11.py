"""The write client's HTTP/1.1 exchange against scripted servers on loopback: framing, reuse,
replays after an idle close (idempotent requests only), limits, cancellation, closing and
TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trustme

from extender.kube.http11 import Http11Client, ProtocolError

OK = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

Script = Callable[["Peer", bytes], Awaitable[bytes | None]]


@dataclass
class Peer:
    """One accepted connection: the requests it has read so far."""

    number: int
    #: Set when the server stops: what a script that never answers waits for.
    stop: asyncio.Event
    requests: list[bytes] = field(default_factory=list)
    #: Set by a script: close the connection once its answer is written.
    close: bool = False


@dataclass
class Server:
    port: int
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    #: Set by a script: close the connection once its answer is written.
    close: bool = False
    open_now: int = 0
    most_open: int = 0


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def scripted(script: Script, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    """A server that answers each request with what `script` returns for it (None: close the
    connection without an answer)."""
    state = Server(0)
    stop = asyncio.Event()
    handlers: set[asyncio.Task[None]] = set()
    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        writers.add(writer)
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        peer = Peer(state.connections, stop)
        try:
            while (request := await _read_request(reader)) is not None:
                peer.requests.append(request)
                state.requests.append(request)
                answer = await script(peer, request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if peer.close:
                    break
        except ConnectionError:
            pass
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        # Every handler ends by itself (a cancelled one is logged as an error by asyncio).
        stop.set()
        for writer in writers:
            writer.close()
        server.close()
        if handlers:
            await asyncio.wait(handlers, timeout=5)
        await server.wait_closed()


def _answer(answer: bytes) -> Script:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        return answer

    return script


HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer t"}


async def test_an_answer_is_read_and_its_connection_carries_the_next_request() -> None:
    async with scripted(_answer(OK)) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}/prefix/")
        first = await writes.request("POST", "/api/v1/x", headers=HEADERS, body=b'{"a":1}')
        second = await writes.request("POST", "/api/v1/y", headers=HEADERS, body=b"{}")
        await writes.close()
    assert (first.status, first.body, first.headers["content-type"]) == (
        201,
        b"{}",
        "application/json",
    )
    assert second.status == 201
    assert server.connections == 1
    request = server.requests[0]
    assert request.startswith(b"POST /prefix/api/v1/x HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in request
    assert b"Authorization: Bearer t\r\n" in request
    assert b"Content-Length: 7\r\n" in request
    assert request.endswith(b'\r\n\r\n{"a":1}')


async def test_a_chunked_body_is_joined_and_the_connection_kept() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with scripted(_answer(chunked)) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        answers = [await writes.request("PATCH", "/n", headers=HEADERS) for _ in range(2)]
        await writes.close()
    assert [a.body for a in answers] == [b"hello world"] * 2
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_an_answer_that_ends_its_connection_is_not_reused(answer: bytes) -> None:
    async with scripted(_answer(answer)) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        for _ in range(2):
            assert (await writes.request("POST", "/x", headers=HEADERS)).body == b"ok"
        await writes.close()
    assert server.connections == 2


async def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        peer.close = True
        return b"HTTP/1.1 500 Internal Server Error\r\n\r\n<html>boom</html>"

    async with scripted(script) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        answer = await writes.request("POST", "/x", headers=HEADERS)
        await writes.close()
    assert (answer.status, answer.body) == (500, b"<html>boom</html>")


def _closes_its_second_request_unanswered() -> Script:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        # The first connection answers once, then closes on its next request unanswered: as a
        # server does that closed it while idle just as the request was on its way, or as a
        # connection cut after the server acted on the request (the client cannot tell which).
        return OK if peer.number > 1 or len(peer.requests) == 1 else None

    return script


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_an_idempotent_request_on_a_connection_closed_while_idle_is_sent_once_more(
    method: str,
) -> None:
    async with scripted(_closes_its_second_request_unanswered()) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        await writes.request(method, "/a", headers=HEADERS)
        answer = await writes.request(method, "/b", headers=HEADERS)
        await writes.close()
    assert answer.status == 201
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/b"]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_a_post_or_patch_is_never_sent_again_after_a_connection_that_may_have_carried_it(
    method: str,
) -> None:
    # A Binding the server applied before the connection dropped, sent again, is answered
    # 409: the client must report no answer (the bind is in doubt), never send it twice.
    async with scripted(_closes_its_second_request_unanswered()) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        await writes.request(method, "/a", headers=HEADERS)
        with pytest.raises(ProtocolError, match="closed before an answer"):
            await writes.request(method, "/b", headers=HEADERS)
        # The next request opens a new connection.
        answer = await writes.request(method, "/c", headers=HEADERS)
        await writes.close()
    assert answer.status == 201
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/c"]


async def test_a_new_connection_that_closes_unanswered_is_an_error_not_a_loop() -> None:
    async def never(peer: Peer, request: bytes) -> bytes | None:
        return None

    async with scripted(never) as closing:
        writes = Http11Client(f"http://127.0.0.1:{closing.port}")
        with pytest.raises(ProtocolError, match="closed before an answer"):
            await writes.request("POST", "/x", headers=HEADERS)
        await writes.close()
    assert closing.connections == 1


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", "Content-Length is not a number"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\nshort", "ended after 5 of 999"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000, "exceeds 1000"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n", "'gzip'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not hexadecimal"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "CRLF"),
    ],
    ids=["status", "header", "length", "short", "limit", "coding", "chunk-size", "chunk-end"],
)
async def test_an_answer_that_is_not_valid_http_is_a_protocol_error(
    answer: bytes, problem: str
) -> None:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        peer.close = problem.startswith("ended")  # a short body shows only when it ends
        return answer

    async with scripted(script) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}", max_body_bytes=1000)
        with pytest.raises(ProtocolError, match=problem):
            await writes.request("POST", "/x", headers=HEADERS)
        # The broken connection is not reused: the next request opens another.
        with contextlib.suppress(ProtocolError):
            await writes.request("POST", "/x", headers=HEADERS)
        await writes.close()
    assert server.connections == 2


async def test_an_interim_answer_is_skipped() -> None:
    interim = b"HTTP/1.1 102 Processing\r\n\r\n" + OK
    async with scripted(_answer(interim)) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        assert (await writes.request("POST", "/x", headers=HEADERS)).status == 201
        await writes.close()


@pytest.mark.parametrize(
    "headers",
    [{"X-Evil": "a\r\nInjected: yes"}, {"Bad\nName": "v"}, {"X": "caf\u00e9\u2603"}],
    ids=["value", "name", "not-latin-1"],
)
async def test_a_header_that_would_break_the_request_is_refused_before_sending(
    headers: dict[str, str],
) -> None:
    async with scripted(_answer(OK)) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        with pytest.raises(ValueError, match="header"):
            await writes.request("POST", "/x", headers=headers)
        await writes.close()
    assert server.connections == 0


async def test_a_cancelled_exchange_closes_its_connection() -> None:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        if peer.number == 1:
            await peer.stop.wait()  # never answers in time
            return None
        return OK

    async with scripted(script) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await writes.request("POST", "/slow", headers=HEADERS)
        assert (await writes.request("POST", "/next", headers=HEADERS)).status == 201
        await writes.close()
    assert server.connections == 2


async def test_closing_ends_an_exchange_under_way() -> None:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        await peer.stop.wait()
        return None

    async with scripted(script) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}")
        pending = asyncio.ensure_future(writes.request("POST", "/x", headers=HEADERS))
        await asyncio.sleep(0.1)
        async with asyncio.timeout(1.0):
            await writes.close()
            with pytest.raises(ProtocolError):
                await pending
        with pytest.raises(ProtocolError, match="closed"):
            await writes.request("POST", "/x", headers=HEADERS)


async def test_no_more_connections_than_the_limit_are_open_at_once() -> None:
    async def script(peer: Peer, request: bytes) -> bytes | None:
        await asyncio.sleep(0.05)
        return OK

    async with scripted(script) as server:
        writes = Http11Client(f"http://127.0.0.1:{server.port}", max_connections=2)
        answers = await asyncio.gather(
            *(writes.request("POST", f"/{i}", headers=HEADERS) for i in range(6))
        )
        await writes.close()
    assert [a.status for a in answers] == [201] * 6
    assert server.most_open == 2


async def test_https_with_the_given_ca_and_server_name() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("apiserver.internal")
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(served)
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    async with scripted(_answer(OK), tls=served) as server:
        url = f"https://127.0.0.1:{server.port}"
        writes = Http11Client(url, ssl_context=trusted, server_hostname="apiserver.internal")
        assert (await writes.request("POST", "/x", headers=HEADERS)).status == 201
        await writes.close()
        # Without the server name the certificate does not match 127.0.0.1.
        strict = Http11Client(url, ssl_context=trusted)
        with pytest.raises(ssl.SSLError):
            await strict.request("POST", "/x", headers=HEADERS)
        await strict.close()


def test_only_http_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="not an http or https URL"):
        Http11Client("unix:///run/k8s.sock")
