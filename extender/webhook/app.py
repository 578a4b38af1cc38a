"""`make_app`: the webhook's aiohttp application, and `make_metrics_app`, its /metrics
listener; with `cli`, the modules of `extender.webhook` that do I/O.

Owns the HTTP side only: read the body (bounded: one declared too large is refused before a
byte of it is read), decode it, hand the request to the pure decisions of `admission`, encode
the AdmissionReview answer. A body that is not an AdmissionReview v1 request gets 400 with a
JSON reason (there is no uid to answer); a pod the decisions cannot read is denied inside the
review. Nothing raised by a decision becomes a 5xx: it is logged and the request denied, since
both webhooks fail closed for GPU pods anyway (deploy/base/webhook-*.yaml).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from extender.metrics import CONTENT_TYPE
from extender.webhook.admission import AdmissionSettings
from extender.webhook.metrics import WebhookMetrics
from extender.webhook.review import (
    AdmissionRequest,
    ReviewError,
    deny,
    parse_review,
    review_response,
)
from extender.webhook.validation import decide

log = logging.getLogger(__name__)

JSON = "application/json"
SETTINGS = web.AppKey("admission-settings", AdmissionSettings)
METRICS = web.AppKey("webhook-metrics", WebhookMetrics)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REJECTED = "rejected"


def _json(value: object, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type=JSON)


def _error(status: int, reason: str) -> web.Response:
    return _json({"error": reason}, status=status)


def _endpoint(name: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        response, outcome = await _answer(name, request)
        request.app[METRICS].observe(name, outcome, time.perf_counter() - started)
        return response

    return handler


async def _answer(name: str, request: web.Request) -> tuple[web.Response, str]:
    """The response to a review, and its outcome for the metrics (`metrics.OUTCOMES`)."""
    settings = request.app[SETTINGS]
    limit = settings.webhook.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        return _error(413, f"body of {length} bytes exceeds the limit of {limit} bytes"), REJECTED
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"body exceeds the limit of {limit} bytes"), REJECTED
    try:
        review = parse_review(orjson.loads(body))
    except orjson.JSONDecodeError as exc:
        return _error(400, f"the body is not valid JSON: {exc}"), REJECTED
    except ReviewError as exc:
        return _error(400, str(exc)), REJECTED
    outcome = "allowed"
    try:
        decision = decide(name, review, settings)
    except Exception:
        # A bug, never the pod's fault; deny (the failure policy would anyway) and say so.
        log.exception("admission %s of %s failed", name, review.uid)
        decision = deny(f"mpsched {name}: internal error (see the webhook's log)", code=500)
        outcome = "error"
    patch = orjson.dumps(list(decision.patch)) if decision.patch else None
    if not decision.allowed:
        outcome = "denied" if outcome == "allowed" else outcome
        log.info(
            "%s denied %s: %s",
            name,
            review.uid,
            decision.message,
            extra={"pod": _pod_key(review), "verb": name, "outcome": "denied"},
        )
    return _json(review_response(review.uid, decision, patch_json=patch)), outcome


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    # Nothing to build or wait for: the decisions need only the configuration, read at start.
    return _json({"ready": True})


async def serve_metrics(request: web.Request) -> web.Response:
    body = await asyncio.to_thread(request.app[METRICS].render)  # reads the certificate file
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def make_metrics_app(metrics: WebhookMetrics) -> web.Application:
    """The plain-HTTP listener Prometheus scrapes: GET /metrics (and the probes)."""
    app = web.Application()
    app[METRICS] = metrics
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    return app


def make_app(
    settings: AdmissionSettings, *, metrics: WebhookMetrics | None = None
) -> web.Application:
    """The webhook's application: POST /mutate and /validate, GET /healthz, /readyz and
    /metrics (also served on the metrics listener, `make_metrics_app`)."""
    # aiohttp's own limit covers chunked bodies (no Content-Length); ours answers declared
    # oversized ones before reading them.
    app = web.Application(client_max_size=settings.webhook.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = metrics if metrics is not None else WebhookMetrics()
    for name in ("mutate", "validate"):
        app.router.add_post(f"/{name}", _endpoint(name))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", serve_metrics)
    return app


def _pod_key(review: AdmissionRequest) -> str | None:
    """ "namespace/name" of the reviewed object for the log, when it has a name yet (a pod
    created from generateName has none at admission)."""
    obj = review.obj
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{review.namespace}/{name}" if isinstance(name, str) and name else None
