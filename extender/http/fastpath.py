"""The verbs' fast path: a plain, well-formed POST of a verb, read and answered on its connection
without aiohttp's request machinery; anything else handed to aiohttp, with the bytes read so far.

Owns the parsing of the one request shape kube-scheduler sends (Go's HTTP/1.1 client: `POST
<urlPrefix>/<verb> HTTP/1.1`, a Content-Length, a JSON body, keep-alive) and the writing of its
answer. aiohttp's server spends more CPU per request on routing, request and response objects
and its writer than a bare protocol spends on the whole exchange; a pod's filter, prioritize
and bind are three such requests on the loop that also follows the cluster. The answers are
the handlers' own (the verbs of `handlers.DECIDE` and `handlers.ACT`, which aiohttp's handlers
call too, and their `Answer`s), so both servers answer and count alike; only the framing is
done here.

What is not that shape goes to aiohttp, which then serves the connection to its end: another
method, path or HTTP version, a query or an escaped path, chunked or `Expect` or `Upgrade`, a
missing or repeated Host, a repeated or malformed Content-Length, a header name that is not a
token, a control character or a bare CR or LF, a header block over `MAX_HEAD` bytes, a body over
the large-body threshold (the fairness gate and the size limit are aiohttp's path). So every
refusal keeps the answer aiohttp gives, and the fast path decides only what it fully
understands.

The listener's limits hold here too: the idle deadline (no complete request within
`idle_timeout_s` of the connection's opening or its last answer: idle keep-alive and header slow
loris alike), the body deadline (408 and close when a body has not arrived `body_timeout_s` after
its headers), the send deadline (the listener's stall timer: no new request is read while the
transport is paused), and bounded buffers (a body is read into one growing buffer, never
re-copied per segment). kube-scheduler does not pipeline; a request that arrives while a bind is
in flight waits in the buffer and is answered after it, in order.

With `accelerators.fastPath` off there is no fast path: aiohttp serves every connection. Nor is
there one for an application with middlewares: what the fast path answers no middleware would
see, so an application that has any is served by aiohttp alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

import orjson
from aiohttp import web

from extender.http.handlers import ACT, DECIDE, Answer, bad_request
from extender.http.keys import GATE, METRICS, SERVICE, HttpSettings
from extender.http.wire import WireError

log = logging.getLogger(__name__)

#: Bytes of a request's line and headers past which it goes to aiohttp (its own line and field
#: limits are 8190 bytes; kube-scheduler's heads are about 200).
MAX_HEAD: Final = 8190
#: Bytes that may appear in a head besides CR LF pairs: visible ASCII, space, tab, obs-text.
_HEAD_BYTES: Final = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])
#: RFC 9110 token characters (a header name).
_TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
#: Path characters taken as they are: unreserved, and the segment separator (no '%' escapes,
#: no query, nothing aiohttp would decode or normalise into something else).
_PATH: Final = b"-._~/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_VERBS: Final = {v.encode(): v for v in (*DECIDE, *ACT)}
_REFUSED_HEADERS: Final = frozenset((b"transfer-encoding", b"expect", b"upgrade"))


@dataclass(frozen=True, slots=True)
class Head:
    """What the fast path needs of a request's head."""

    verb: str
    length: int
    #: The client asked to close the connection after the answer.
    close: bool


def parse_head(head: bytes) -> Head | None:
    """The head (request line and headers, without the blank line) of a plain verb POST, or
    None for anything else (see the module docstring): aiohttp then reads it."""
    lines = head.split(b"\r\n")
    if len(head.translate(None, _HEAD_BYTES)) != 2 * (len(lines) - 1):
        return None  # a control character, or a CR or LF outside the line ends
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    verb = _verb(parts[1])
    if verb is None:
        return None
    length = -1
    close = False
    hosts = 0
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN):
            return None  # a folded line starts with a space, which is no token character
        name = name.lower()
        if name == b"content-length":
            value = value.strip(b" \t")
            if length >= 0 or not value.isdigit():
                return None
            length = int(value)
        elif name == b"connection":
            option = value.strip(b" \t").lower()
            if option == b"close":
                close = True
            elif option != b"keep-alive":
                return None
        elif name == b"host":
            hosts += 1
        elif name in _REFUSED_HEADERS:
            return None
    if hosts != 1:
        return None  # HTTP/1.1 wants exactly one Host; aiohttp answers 400 otherwise
    return Head(verb, max(length, 0), close)


def _verb(path: bytes) -> str | None:
    """The verb of `/<verb>` or `/<prefix>/<verb>` (the routes `make_app` adds), else None."""
    if not path.startswith(b"/") or path.translate(None, _PATH):
        return None
    slash = path.rfind(b"/")
    if slash == 1:
        return None  # `//verb`: the prefix route needs a prefix of one character at least
    return _VERBS.get(path[slash + 1 :])


class _Date:
    """The Date header's value, formatted once a second."""

    __slots__ = ("_at", "_value")

    def __init__(self) -> None:
        self._at = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._at:
            self._at = second
            self._value = formatdate(second, usegmt=True).encode()
        return self._value


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode()


_STATUS_LINES: Final = {s: _status_line(s) for s in (200, 400, 408, 500, 503)}


class FastVerbs:
    """The fast path of one `make_app` application: its state, its live connections, and the
    binds in flight on them (waited for at shutdown)."""

    def __init__(self, app: web.Application, settings: HttpSettings) -> None:
        self.app = app
        self.metrics = app[METRICS]
        self.gate = app[GATE]
        self.idle_timeout_s = settings.idle_timeout_s
        self.body_timeout_s = settings.body_timeout_s
        #: Bodies above this go to aiohttp: the fairness gate's threshold, and never past the
        #: size limit (aiohttp's path answers 413 for those).
        self.max_length = min(self.gate.threshold_bytes, settings.max_body_bytes)
        self.connections: set[FastConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._date = _Date()
        #: Answers written here, not by aiohttp (a counter).
        self.answered = 0

    def track(self, task: asyncio.Task[None]) -> None:
        """A bind's task, in flight until it is done."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def head_bytes(self, status: int, length: int, *, close: bool) -> bytes:
        line = _STATUS_LINES.get(status) or _status_line(status)
        return b"%sContent-Type: application/json\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
            line,
            length,
            self._date.now(),
            b"Connection: close\r\n" if close else b"",
        )

    async def close(self, timeout_s: float) -> None:
        """Stop: close idle connections at once, give binds in flight `timeout_s` to answer,
        then close the rest. Call it once the listener no longer accepts."""
        for conn in list(self.connections):
            conn.close_when_idle()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)
        for conn in list(self.connections):
            conn.abort()


def fast_verbs(app: web.Application, settings: HttpSettings) -> FastVerbs | None:
    """The fast path of `app` when it serves the verbs (a `make_app` application), else None
    (the observability app, `accelerators.fastPath: false`, or an app with middlewares, which
    would not see the fast path's requests: aiohttp serves all of it)."""
    if GATE not in app or not app[SERVICE].accelerators.fast_path or app.middlewares:
        return None
    return FastVerbs(app, settings)


class FastConnection:
    """One connection in fast mode until `hand_over` gives it (and the unread bytes) to aiohttp."""

    __slots__ = (
        "_body_timer",
        "_buf",
        "_busy",
        "_closing",
        "_hand_over",
        "_held",
        "_idle",
        "_last",
        "_loop",
        "_paused",
        "_pending",
        "_started",
        "_transport",
        "_verbs",
    )

    def __init__(
        self,
        verbs: FastVerbs,
        transport: asyncio.Transport,
        hand_over: Callable[[bytes], None],
    ) -> None:
        self._verbs = verbs
        self._transport = transport
        self._hand_over = hand_over
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        #: A request read and not yet answered: later ones wait in the buffer.
        self._busy = False
        self._paused = False
        #: Reading paused: too much arrived behind a request in flight.
        self._held = False
        #: Close once the answer in flight is written (EOF from the client, or shutdown).
        self._closing = False
        #: The head of a request whose body is still arriving, and when its head came.
        self._pending: Head | None = None
        self._started = 0.0
        self._body_timer: asyncio.TimerHandle | None = None
        self._last = self._loop.time()
        self._idle: asyncio.TimerHandle | None = self._loop.call_later(
            verbs.idle_timeout_s, self._idle_check
        )
        verbs.connections.add(self)

    # -- input --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy and not self._paused:
            self._process()
        elif len(self._buf) > self._verbs.max_length + MAX_HEAD and not self._held:
            # Requests pipelined behind one in flight: keep the rest in the kernel's buffers.
            self._held = True
            self._transport.pause_reading()

    def _process(self) -> None:
        if self._held:
            self._held = False
            self._transport.resume_reading()
        buf = self._buf
        if not buf or self._busy or self._paused or self._closing:
            return  # one request at a time: the next is read once this one is answered
        head = self._pending
        start = 0  # where the body starts in the buffer
        if head is None:
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._release()
                return  # the idle deadline bounds a head that never completes
            head = parse_head(bytes(buf[:end]))
            if head is None or head.length > self._verbs.max_length:
                self._release()
                return
            start = end + 4
            self._started = time.perf_counter()
        stop = start + head.length
        if len(buf) < stop:
            if self._pending is None:
                del buf[:start]
                self._pending = head
                self._body_timer = self._loop.call_later(
                    self._verbs.body_timeout_s, self._body_late
                )
            return
        self._pending = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        # One copy of the body and one shift of the buffer, whole requests or pieces alike.
        body = bytes(buf[start:stop])
        del buf[:stop]
        self._busy = True
        self._serve(head, body)

    def _serve(self, head: Head, body: bytes) -> None:
        """Answer a filter or prioritize one loop step later, behind the steps already in the
        loop's ready queue; start a bind (or preempt) as a task, as aiohttp's handlers start.
        The steps ahead are usually a bind's: its Binding's answer came in the same poll as the
        next pod's filter (kube-scheduler binds a pod while it schedules the next). Computed
        in the read that brought it, the filter (and the prioritize after it) held that bind's
        answer for as long as they took, and each bind waited behind the next pod's decisions;
        behind those steps, a filter waits only for the few that remain of a bind. The filter
        sees the bound pod as it is: its reservation is made before its Binding is sent."""
        verbs = self._verbs
        verbs.gate.last_other = self._started
        if head.verb in DECIDE:
            self._loop.call_soon(self._decide, head, body, self._started)
            return
        verbs.track(self._loop.create_task(self._act(head, body, self._started)))

    def _decide(self, head: Head, body: bytes, started: float) -> None:
        try:
            result = DECIDE[head.verb](self._verbs.app, body)
        except Exception as exc:
            result = _failure(head.verb, exc)
        self._finish(head, result, started)

    async def _act(self, head: Head, body: bytes, started: float) -> None:
        try:
            result = await ACT[head.verb](self._verbs.app, body)
        except Exception as exc:
            result = _failure(head.verb, exc)
        self._finish(head, result, started)

    def _finish(self, head: Head, result: Answer, started: float) -> None:
        """The answer is ready: write it, unless the client went away (a bind itself is done
        then, its answer has no reader), and go on with what waits in the buffer (requests
        pipelined in one read are answered in turn: each is decided a loop step later, so
        this is no recursion as deep as their number)."""
        self._busy = False
        if self._transport.is_closing():
            return
        self._send(head, result, started)
        if self._buf:
            self._process()

    def _send(self, head: Head, result: Answer, started: float) -> None:
        verbs = self._verbs
        if result is not _INTERNAL:
            verbs.metrics.observe(head.verb, time.perf_counter() - started, result.outcome)
        close = head.close or self._closing
        verbs.answered += 1
        self._transport.write(
            verbs.head_bytes(result.status, len(result.body), close=close) + result.body
        )
        self._last = self._loop.time()
        if close:
            self._closing = True
            self._transport.close()

    # -- deadlines ---------------------------------------------------------------------------

    def _idle_check(self) -> None:
        self._idle = None
        if self._transport.is_closing():
            return
        left = self._last + self._verbs.idle_timeout_s - self._loop.time()
        if self._busy or self._pending is not None or left > 0:
            # An answer in flight re-arms the deadline when it is written; a body on its way
            # has its own.
            delay = left if left > 0 else self._verbs.idle_timeout_s
            self._idle = self._loop.call_later(delay, self._idle_check)
            return
        self._transport.close()

    def _body_late(self) -> None:
        self._body_timer = None
        head = self._pending
        if head is None or self._transport.is_closing():
            return
        self._pending = None
        seconds = self._verbs.body_timeout_s
        result = Answer(
            orjson.dumps({"Error": f"body not received within {seconds:g}s"}), "rejected", 408
        )
        # Do not drain a trickling body: answer and close.
        self._closing = True
        self._send(head, result, self._started)

    # -- flow control and lifetime ------------------------------------------------------------

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if not self._busy and self._buf:
            self._process()

    def eof_received(self) -> bool:
        """The client sent all it will: keep the transport open only for an answer in flight."""
        if self._busy:
            self._closing = True
            return True
        return False

    def close_when_idle(self) -> None:
        """Shutdown: close now unless an answer is in flight (closed after it then)."""
        if self._busy:
            self._closing = True
        else:
            self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def connection_lost(self) -> None:
        self._stop()

    def _stop(self) -> None:
        for timer in (self._idle, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._idle = self._body_timer = None
        self._verbs.connections.discard(self)

    def _release(self) -> None:
        """Give the connection to aiohttp with what has been read and not answered."""
        self._stop()
        rest, self._buf = bytes(self._buf), bytearray()
        self._hand_over(rest)


_INTERNAL: Final = Answer(orjson.dumps({"Error": "internal error"}), "error", 500)


def _failure(verb: str, exc: Exception) -> Answer:
    """A malformed body's 400, or (logged with its traceback) a failure of ours: 500."""
    if isinstance(exc, WireError):
        return bad_request(exc)
    log.error("%s failed", verb, exc_info=exc)
    return _INTERNAL
