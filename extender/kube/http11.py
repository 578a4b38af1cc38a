"""A keep-alive HTTP/1.1 client for the adapter's writes to the API server: Bindings, Events
and node patches.

Owns one thing: sending a request and reading its one answer on a pooled connection. aiohttp's
ClientSession costs several times the exchange itself per call (a request and a response
object, header multidicts, the cookie jar, timer handles). The adapter sends small JSON bodies
to one server, so that generality buys nothing on the scheduling path. Reads and watches keep the
generated client; an API server reached through a proxy keeps aiohttp for writes too.

Its promises:

- a connection is reused only after a complete answer that did not ask to close it, and only
  within `idle_s` of its last use (aiohttp's own keep-alive default); a failure or a
  cancellation in the middle of an exchange closes the connection;
- a reused connection that ends before the first byte of an answer may have been closed by the
  server while it was idle, or cut after the server acted on the request: the two look alike.
  An idempotent request (GET, HEAD, OPTIONS, PUT, DELETE) is then sent once more on a new
  connection, as Go's transport does; a POST or PATCH never is, since the connection may have
  carried it: a Binding sent twice is answered 409 after the first was applied, and its answer
  is lost either way. It fails as any lost connection does (the caller's "no answer", a bind
  in doubt);
- bodies framed by Content-Length, chunked bodies and bodies that end with the connection are
  read, up to `max_body_bytes`. Anything else raises `ProtocolError`, an `OSError`, as a lost
  connection does. The caller maps both to "no answer".
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

#: Bytes an answer's status line and headers may take (the StreamReader's limit).
HEAD_LIMIT: Final = 64 * 1024
#: Bytes an answer's body may take: a Node object with its status is a few hundred KB; etcd
#: refuses objects over 1.5 MiB.
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
#: Seconds an idle connection stays pooled (aiohttp's keep-alive default).
IDLE_S: Final = 15.0
#: Connections open at once, by default.
MAX_CONNECTIONS: Final = 16
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_NO_BODY: Final = frozenset({204, 304})
#: Methods whose request may be sent again after a connection that may have carried it
#: (RFC 9110 §9.2.2: idempotent).
_REPLAYABLE: Final = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class ProtocolError(OSError):
    """The server's bytes are not one complete HTTP/1.1 answer, or not within the limits."""


class _NotStarted(Exception):
    """A reused connection ended before the first byte of an answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    #: Header names lower-cased; a repeated header's values joined with ", ".
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True, eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Loop time of its last complete exchange.
    used: float = 0.0
    reused: bool = False

    def usable(self, now: float, idle_s: float) -> bool:
        return (
            now - self.used < idle_s and not self.reader.at_eof() and not self.writer.is_closing()
        )


class Http11Client:
    """Requests to the server at `url` (http or https; its path is a prefix of every request
    path), each on a connection of its own, at most `max_connections` at once."""

    def __init__(
        self,
        url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_s: float = IDLE_S,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http or https URL: {url!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if https else 80)
        self._ssl: ssl.SSLContext | None = None
        self._server_hostname: str | None = None
        if https:
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
            self._server_hostname = server_hostname
        self._authority = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self._slots = asyncio.Semaphore(max_connections)
        self._idle_s = idle_s
        self._max_body = max_body_bytes
        self._idle: list[_Connection] = []
        #: Connections in the middle of an exchange: `close` ends them too.
        self._busy: set[_Connection] = set()
        self._closed = False

    async def request(
        self, method: str, path: str, *, headers: Mapping[str, str], body: bytes = b""
    ) -> Answer:
        """Send one request and read its answer. Raises ProtocolError or another OSError when
        no complete answer came; cancel it (a timeout) to give up, which closes its connection."""
        if self._closed:
            raise ProtocolError("the client is closed")
        message = self._head(method, path, headers, body) + body
        async with self._slots:
            pooled = self._pooled()
            if pooled is not None:
                try:
                    return await self._exchange(pooled, message, method)
                except _NotStarted:
                    # Closed while idle, or cut after the server acted on it: only a request
                    # that may be applied twice goes once more, on a new connection.
                    if self._closed:
                        raise ProtocolError("the client is closed") from None
                    if method not in _REPLAYABLE:
                        raise ProtocolError(
                            f"the connection closed before an answer (a {method} is not sent "
                            "twice: the server may have acted on it)"
                        ) from None
            return await self._exchange(await self._connect(), message, method)

    async def close(self) -> None:
        """Close every connection: an exchange still under way ends with ProtocolError."""
        self._closed = True
        every = [*self._idle, *self._busy]
        self._idle = []
        for connection in every:
            connection.writer.close()
        for connection in every:
            with contextlib.suppress(OSError):  # already reset: closed either way
                await connection.writer.wait_closed()

    # -- the exchange ---------------------------------------------------------------------

    def _head(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
        if not path.startswith("/"):
            raise ValueError(f"request path must start with '/': {path!r}")
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._authority}"]
        for name, value in headers.items():
            # A CR or LF would let a value start a header (or a request) of its own.
            if not name or ":" in name or _breaks_line(name) or _breaks_line(value):
                raise ValueError(f"header {name!r} has a name or value that breaks the line")
            lines.append(f"{name}: {value}")
        lines.append(f"Content-Length: {len(body)}")
        # No coding was asked for: a server must then answer in identity (RFC 9110 §12.5.3).
        lines.append("Accept-Encoding: identity")
        try:
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError as exc:
            raise ValueError(f"a request header is not latin-1 text: {exc}") from None

    def _pooled(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable(now, self._idle_s):
                return connection
            connection.writer.close()
        return None

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._server_hostname,
            limit=HEAD_LIMIT,
        )
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, message: bytes, method: str) -> Answer:
        keep = False
        self._busy.add(connection)
        try:
            try:
                connection.writer.write(message)
                await connection.writer.drain()
                head = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise ProtocolError(
                        "the connection closed in the middle of an answer"
                    ) from None
                if connection.reused:
                    raise _NotStarted() from None
                raise ProtocolError("the connection closed before an answer") from None
            except (ConnectionResetError, BrokenPipeError):
                if connection.reused:
                    raise _NotStarted() from None
                raise
            except asyncio.LimitOverrunError:
                raise ProtocolError(f"an answer's head exceeds {HEAD_LIMIT} bytes") from None
            answer, keep = await self._answer(connection.reader, head, method)
            return answer
        finally:
            self._busy.discard(connection)
            if keep and not self._closed:
                connection.used = asyncio.get_running_loop().time()
                connection.reused = True
                self._idle.append(connection)
            else:
                connection.writer.close()

    async def _answer(
        self, reader: asyncio.StreamReader, head: bytes, method: str
    ) -> tuple[Answer, bool]:
        """The answer whose head is `head`, its body read, and whether the connection may
        carry another request."""
        version, status, headers = _parse_head(head)
        while 100 <= status < 200:  # an interim answer (102 Processing): the real one follows
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise ProtocolError("no final answer after an interim one") from None
            version, status, headers = _parse_head(head)
        keep = version == "HTTP/1.1" and "close" not in _tokens(headers.get("connection", ""))
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding != "identity":
            raise ProtocolError(f"the answer is in the coding {coding!r}, not asked for")
        if method == "HEAD" or status in _NO_BODY:
            return Answer(status, headers, b""), keep
        codings = _tokens(headers.get("transfer-encoding", ""))
        if codings:
            if codings[-1] != "chunked":
                # Framed by the connection's end (RFC 9112 §6.3, rule 4).
                return Answer(status, headers, await self._to_end(reader)), False
            return Answer(status, headers, await self._chunked(reader)), keep
        length_text = headers.get("content-length")
        if length_text is None:
            return Answer(status, headers, await self._to_end(reader)), False
        length_text = length_text.strip()
        if not length_text.isdigit() or not length_text.isascii():
            raise ProtocolError(f"Content-Length is not a number: {length_text!r}")
        length = int(length_text)
        self._check_size(length)
        try:
            body = await reader.readexactly(length)
        except asyncio.IncompleteReadError as exc:
            raise ProtocolError(
                f"the answer ended after {len(exc.partial)} of {length} bytes"
            ) from None
        return Answer(status, headers, body), keep

    def _check_size(self, size: int) -> None:
        if size > self._max_body:
            raise ProtocolError(f"an answer's body exceeds {self._max_body} bytes")

    async def _to_end(self, reader: asyncio.StreamReader) -> bytes:
        body = await reader.read(self._max_body + 1)
        parts = [body]
        total = len(body)
        while body and total <= self._max_body:
            body = await reader.read(self._max_body + 1 - total)
            parts.append(body)
            total += len(body)
        self._check_size(total)
        return b"".join(parts)

    async def _chunked(self, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        total = 0
        try:
            while True:
                line = await reader.readuntil(b"\r\n")
                size_text = line[:-2].split(b";", 1)[0].strip()
                if not size_text or not _HEX.issuperset(size_text):
                    raise ProtocolError(f"a chunk's size is not hexadecimal: {size_text[:20]!r}")
                size = int(size_text, 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailer fields: nothing the adapter reads
                    return b"".join(parts)
                total += size
                self._check_size(total)
                parts.append(await reader.readexactly(size))
                if await reader.readexactly(2) != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
        except asyncio.IncompleteReadError:
            raise ProtocolError("the connection closed in the middle of a chunked body") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError("a chunk's size line is too long") from None


def _breaks_line(text: str) -> bool:
    return "\r" in text or "\n" in text


def _tokens(value: str) -> list[str]:
    return [t.strip().lower() for t in value.split(",") if t.strip()]


def _parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """(HTTP version, status, headers with lower-cased names) of an answer's head, which ends
    with the blank line."""
    text = head[:-4].decode("latin-1")
    status_line, *lines = text.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not name:
            raise ProtocolError(f"not a header line: {line[:80]!r}")
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, int(code), headers
