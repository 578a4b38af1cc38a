"""`serving`: the extender's listening socket and the aiohttp runner behind it, with the limits
that keep abusive or broken clients from taking the process down (truth rule 6 of docs/design.md).

Owns connection lifetimes. `mpsched serve` and the tests start the server through `serving`
only, so what is tested is what runs:

- **idle and header deadline**: aiohttp's keep-alive timer (`idle_timeout_s`) closes a
  connection that has no complete request within that time of opening or of its last response,
  whether bytes trickle in or not (a header slow loris);
- **body deadline**: the verb handlers read a body within `body_timeout_s` (408 otherwise) and
  aiohttp drains an unread one for no longer than that (`lingering_time`);
- **send deadline**: a client that stops reading its answer is dropped once the transport has
  stayed full (aiohttp paused on it) for `send_timeout_s`;
- **connection cap**: past `max_connections` open connections (and always below the process's
  file descriptor limit, less `reserved_fds` for the cluster client, files and logs), a new
  connection is closed at once instead of the listener failing to accept with EMFILE;
- **bounded logging**: nothing is logged per closed connection; refusals and stalls are
  counted and reported at most once per `log_interval_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

from aiohttp import web

from extender.http.fastpath import FastConnection, FastVerbs, fast_verbs
from extender.http.keys import HttpSettings

log = logging.getLogger(__name__)

Factory = Callable[[], asyncio.Protocol]


def connection_cap(settings: HttpSettings) -> int:
    """`max_connections`, lowered to stay under the file descriptor soft limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return settings.max_connections
    return max(1, min(settings.max_connections, soft - settings.reserved_fds))


class ConnectionGuard:
    """The listener's protocol factory: admits a connection to aiohttp's handler (`inner`) while
    fewer than `cap` are open, closes it at once otherwise, and drops connections whose client
    stopped reading. Counts what it closed; logs a summary at most once per interval."""

    def __init__(
        self,
        *,
        cap: int,
        send_timeout_s: float,
        log_interval_s: float,
        verbs: FastVerbs | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap = cap
        #: The verbs' fast path, which each connection starts on (None: aiohttp from the start).
        self.verbs = verbs
        self.send_timeout_s = send_timeout_s
        self._log_interval_s = log_interval_s
        self._clock = clock
        #: aiohttp's handler factory (the runner's Server), set when the site starts.
        self.inner: Factory | None = None
        self.open = 0
        self.refused = 0
        self.stalled = 0
        self._logged_at: float | None = None
        self._logged = (0, 0)

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def note(self) -> None:
        """Something was closed: say so if the last summary is old enough."""
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._log_interval_s:
            return
        refused, stalled = self.refused - self._logged[0], self.stalled - self._logged[1]
        self._logged_at, self._logged = now, (self.refused, self.stalled)
        log.warning(
            "closed %d new connections at the cap of %d open and %d that stopped reading "
            "their answer (next summary in %.0fs at the earliest)",
            refused,
            self.cap,
            stalled,
            self._log_interval_s,
        )


class _Connection(asyncio.Protocol):
    """One accepted connection, when admitted: on the verbs' fast path first (`fastpath`), and
    forwarded to aiohttp's handler once the fast path hands it over (or from the start when
    there is none). The forwarding is one Python call per event (received data, flow control),
    negligible beside a request."""

    __slots__ = ("_fast", "_guard", "_inner", "_stall", "_transport")

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._fast: FastConnection | None = None
        self._transport: asyncio.Transport | None = None
        self._stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.cap or guard.inner is None:
            guard.refused += 1
            transport.close()
            guard.note()
            return
        guard.open += 1
        self._transport = cast(asyncio.Transport, transport)
        if guard.verbs is not None:
            self._fast = FastConnection(guard.verbs, self._transport, self._hand_over)
        else:
            self._hand_over(b"")

    def _hand_over(self, unread: bytes) -> None:
        """From here on aiohttp serves the connection, starting with `unread`."""
        assert self._transport is not None and self._guard.inner is not None
        self._fast = None
        self._inner = self._guard.inner()
        self._inner.connection_made(self._transport)
        if unread:
            self._inner.data_received(unread)

    def data_received(self, data: bytes) -> None:
        if self._fast is not None:
            self._fast.data_received(data)
        elif self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._fast is not None:
            return self._fast.eof_received()
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._transport is None:
            return
        if self._stall is None:
            loop = asyncio.get_running_loop()
            self._stall = loop.call_later(self._guard.send_timeout_s, self._stalled)
        if self._fast is not None:
            self._fast.pause_writing()
        elif self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._fast is not None:
            self._fast.resume_writing()
        elif self._inner is not None:
            self._inner.resume_writing()

    def _stalled(self) -> None:
        self._stall = None
        if self._transport is not None:
            self._guard.stalled += 1
            self._transport.abort()
            self._guard.note()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return  # never admitted
        inner, self._inner = self._inner, None
        fast, self._fast = self._fast, None
        self._guard.open -= 1
        self._transport = None
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if fast is not None:
            fast.connection_lost()
        if inner is not None:
            inner.connection_lost(exc)


class GuardedSite:
    """The listening socket, whose connections go through a `ConnectionGuard` to the runner's
    handler factory. Built on the runner's public `server` and asyncio's own server, not on
    aiohttp's site classes: `serving` stops it before the runner cleans up."""

    __slots__ = ("_backlog", "_bound", "_guard", "_host", "_port", "_runner", "_server", "_ssl")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
    ) -> None:
        self._runner = runner
        self._host = host
        self._port = port
        self._bound = port
        self._guard = guard
        self._ssl = ssl_context
        self._backlog = backlog
        self._server: asyncio.Server | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def guard(self) -> ConnectionGuard:
        return self._guard

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for port 0)."""
        return self._bound

    async def start(self) -> None:
        server = self._runner.server
        if server is None:
            raise RuntimeError("the runner is not set up: call its setup() first")
        self._guard.inner = server
        self._server = await asyncio.get_running_loop().create_server(
            self._guard, self._host, self._port, ssl=self._ssl, backlog=self._backlog
        )
        if self._server.sockets:
            self._bound = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop accepting; open connections are the guard's and the runner's to close."""
        if self._server is not None:
            self._server.close()
            self._server = None


@contextlib.asynccontextmanager
async def serving(
    app: web.Application,
    settings: HttpSettings,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout_s: float = 60.0,
) -> AsyncIterator[GuardedSite]:
    """Run `app` on host:port until the block exits; then stop listening and close the
    connections, in-flight requests given `shutdown_timeout_s` to finish: the fast path's
    first, then aiohttp's (the app's cleanup_ctx runs last)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout_s,
        keepalive_timeout=settings.idle_timeout_s,
        lingering_time=settings.body_timeout_s,
    )
    await runner.setup()
    site: GuardedSite | None = None
    verbs = fast_verbs(app, settings)
    try:
        cap = connection_cap(settings)
        if cap < settings.max_connections:
            log.warning(
                "serving at most %d connections, not %d: the file descriptor limit is lower",
                cap,
                settings.max_connections,
            )
        guard = ConnectionGuard(
            cap=cap,
            send_timeout_s=settings.send_timeout_s,
            log_interval_s=settings.log_interval_s,
            verbs=verbs,
        )
        site = GuardedSite(runner, host, port, guard=guard, ssl_context=ssl_context)
        await site.start()
        yield site
    finally:
        if site is not None:
            site.stop()
        if verbs is not None:
            await verbs.close(shutdown_timeout_s)
        await runner.cleanup()
