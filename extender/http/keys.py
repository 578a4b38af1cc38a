"""The application's typed state keys and the HTTP layer's settings (one place, so that
handlers, app and tests name the same keys)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from extender.http.fairness import LargeBodyGate
from extender.http.wire import ExtenderArgsDecoder
from extender.metrics import Metrics
from extender.service import ExtenderService


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSettings:
    """What the HTTP layer needs to know; built from `Config.server` and `Config.tls`."""

    #: Largest request body accepted, in bytes (config `server.maxBodyBytes`).
    max_body_bytes: int = 8 << 20
    #: Per-GPU series in /metrics (7 per GPU); off for very large clusters.
    metrics_per_gpu: bool = True
    #: Seconds between retries when building the ledger from the cluster fails.
    start_retry_s: float = 5.0
    #: Seconds a connection may go without a complete request, from its opening or its last
    #: answer: idle keep-alive connections and header slow loris alike (config
    #: `server.idleTimeoutSeconds`).
    idle_timeout_s: float = 60.0
    #: Seconds for a request's body to arrive once its headers have (`server.bodyTimeoutSeconds`).
    body_timeout_s: float = 10.0
    #: Seconds an answer may sit unread before the connection is dropped
    #: (`server.sendTimeoutSeconds`).
    send_timeout_s: float = 10.0
    #: Open connections past which new ones are closed at once (`server.maxConnections`).
    max_connections: int = 512
    #: File descriptors kept free under the process limit besides connections: the cluster
    #: client's connections and watches, the configuration and certificate files, logging.
    reserved_fds: int = 128
    #: Bodies above this many bytes take turns (`server.largeBodyBytes`; see `fairness`).
    large_body_bytes: int = 1 << 20
    #: The share of the loop large bodies may take while other requests are served
    #: (`server.largeBodyLoopShare`).
    large_body_share: float = 0.5
    #: Seconds without any other request after which a large body stops waiting for its pace:
    #: the loop is idle. Short beside a large body's ~50 ms, long beside a filter's ~1 ms gap.
    large_body_idle_s: float = 0.005
    #: Seconds between two log lines about closed connections, at most.
    log_interval_s: float = 60.0


SERVICE = web.AppKey("service", ExtenderService)
METRICS = web.AppKey("metrics", Metrics)
SETTINGS = web.AppKey("settings", HttpSettings)
ARGS = web.AppKey("args", ExtenderArgsDecoder)
GATE = web.AppKey("gate", LargeBodyGate)
