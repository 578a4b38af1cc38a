"""`make_app`: the aiohttp application of the extender, with its routes and lifecycle.

Owns routing and resource lifetimes. Every resource is an entry of `cleanup_ctx` (set up in
order, torn down in reverse): the service's ledger sync and watch, nothing global. The verbs are
served at the root and under any path prefix, because kube-scheduler's `urlPrefix` may carry a
path (`http://host:8888/scheduler` + `/filter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from extender.http import handlers, ui
from extender.http.fairness import LargeBodyGate
from extender.http.keys import ARGS, GATE, METRICS, SERVICE, SETTINGS, HttpSettings
from extender.http.wire import ExtenderArgsDecoder
from extender.metrics import Metrics
from extender.service import ExtenderService

log = logging.getLogger(__name__)

VERBS = {
    "filter": handlers.filter_handler,
    "prioritize": handlers.prioritize_handler,
    "bind": handlers.bind_handler,
    "preempt": handlers.preempt_handler,
}


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the ledger in the background (so /healthz answers at once and /readyz says when
    it is done), retrying while the cluster cannot be read; close the service at the end."""
    service = app[SERVICE]
    retry_s = app[SETTINGS].start_retry_s

    async def start() -> None:
        while True:
            try:
                await service.start()
                return
            except Exception:  # not CancelledError: a BaseException, it ends the retries
                log.exception("cannot build the ledger from the cluster; retrying")
                await asyncio.sleep(retry_s)

    task = asyncio.get_running_loop().create_task(start())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await service.close()


def make_app(
    service: ExtenderService, settings: HttpSettings, *, observability: bool = True
) -> web.Application:
    """The extender's application over `service`; the caller owns the cluster behind it.
    `observability=False` leaves /metrics and /status to `make_observability_app` on a
    listener of their own (the verbs' listener is for kube-scheduler alone)."""
    # aiohttp's own limit applies to bodies without Content-Length (chunked); ours, checked in
    # the handlers, answers declared oversized bodies before reading them.
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SERVICE] = service
    app[SETTINGS] = settings
    app[METRICS] = Metrics(per_gpu=settings.metrics_per_gpu)
    app[ARGS] = ExtenderArgsDecoder()
    app[GATE] = LargeBodyGate(
        threshold_bytes=settings.large_body_bytes,
        share=settings.large_body_share,
        idle_s=settings.large_body_idle_s,
    )
    for verb, handler in VERBS.items():
        app.router.add_post(f"/{verb}", handler)
        app.router.add_post(r"/{prefix:.+}/" + verb, handler)
    _observe(app, probes_only=not observability)
    app.cleanup_ctx.append(_service_ctx)
    return app


def make_observability_app(extender: web.Application) -> web.Application:
    """/metrics, /status (with /ui and the endpoints beside it) and the probes for the service
    behind `extender` (a `make_app` application, whose verb counters it shows), for a listener
    of their own. It starts nothing: the extender's application owns the service's lifetime."""
    app = web.Application()
    app[SERVICE] = extender[SERVICE]
    app[SETTINGS] = extender[SETTINGS]
    app[METRICS] = extender[METRICS]
    _observe(app, probes_only=False)
    return app


def _observe(app: web.Application, *, probes_only: bool) -> None:
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    if not probes_only:
        app.router.add_get("/metrics", handlers.metrics)
        app.router.add_get("/status", handlers.status)
        ui.add_routes(app)
