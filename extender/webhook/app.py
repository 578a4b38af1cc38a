"""`make_app`: the webhook's aiohttp application, the one module of `extender.webhook` that
does I/O.

Owns the HTTP side only: read the body (bounded: one declared too large is refused before a
byte of it is read), decode it, hand the request to the pure decisions of `admission`, encode
the AdmissionReview answer. A body that is not an AdmissionReview v1 request gets 400 with a
JSON reason (there is no uid to answer); a pod the decisions cannot read is denied inside the
review. Nothing raised by a decision becomes a 5xx: it is logged and the request denied, since
both webhooks fail closed for GPU pods anyway (deploy/base/webhook-*.yaml).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from extender.webhook.admission import AdmissionSettings
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
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(value: object, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type=JSON)


def _error(status: int, reason: str) -> web.Response:
    return _json({"error": reason}, status=status)


def _endpoint(name: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        settings = request.app[SETTINGS]
        limit = settings.webhook.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return _error(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body exceeds the limit of {limit} bytes")
        try:
            review = parse_review(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the body is not valid JSON: {exc}")
        except ReviewError as exc:
            return _error(400, str(exc))
        try:
            decision = decide(name, review, settings)
        except Exception:
            # A bug, never the pod's fault; deny (the failure policy would anyway) and say so.
            log.exception("admission %s of %s failed", name, review.uid)
            decision = deny(f"mpsched {name}: internal error (see the webhook's log)", code=500)
        patch = orjson.dumps(list(decision.patch)) if decision.patch else None
        if not decision.allowed:
            log.info(
                "%s denied %s: %s",
                name,
                review.uid,
                decision.message,
                extra={"pod": _pod_key(review), "verb": name, "outcome": "denied"},
            )
        return _json(review_response(review.uid, decision, patch_json=patch))

    return handler


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    # Nothing to build or wait for: the decisions need only the configuration, read at start.
    return _json({"ready": True})


def make_app(settings: AdmissionSettings) -> web.Application:
    """The webhook's application: POST /mutate and /validate, GET /healthz and /readyz."""
    # aiohttp's own limit covers chunked bodies (no Content-Length); ours answers declared
    # oversized ones before reading them.
    app = web.Application(client_max_size=settings.webhook.max_body_bytes)
    app[SETTINGS] = settings
    for name in ("mutate", "validate"):
        app.router.add_post(f"/{name}", _endpoint(name))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def _pod_key(review: AdmissionRequest) -> str | None:
    """ "namespace/name" of the reviewed object for the log, when it has a name yet (a pod
    created from generateName has none at admission)."""
    obj = review.obj
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{review.namespace}/{name}" if isinstance(name, str) and name else None
