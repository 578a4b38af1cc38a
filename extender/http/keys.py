"""The application's typed state keys and the HTTP layer's settings (one place, so that
handlers, app and tests name the same keys)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

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


SERVICE = web.AppKey("service", ExtenderService)
METRICS = web.AppKey("metrics", Metrics)
SETTINGS = web.AppKey("settings", HttpSettings)
ARGS = web.AppKey("args", ExtenderArgsDecoder)
