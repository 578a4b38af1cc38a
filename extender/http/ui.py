"""The `/ui` page and the read-only endpoints beside `/status` that it and `kubectl mpsched`
read, on the observability listener (the same access as `/status`):

- `GET /ui`: the page, and `/ui/{asset}` its script and style (package `extender.ui`; nothing
  is loaded from anywhere else, which its Content-Security-Policy also says to the browser);
- `GET /ui/nodes[?limit=N]`: every node's document (or the first N) with a token, then
  `GET /ui/changes?since=TOKEN`: the nodes changed since (`extender.service.feed`);
- `GET /status/fit?threads=&memory=&clients=&namespace=`: the GPUs where a pod asking for that
  share fits now, as filter decides (`extender.service.room`);
- `GET /status/pod/{uid}`: one pod's allocation and its containers' parts;
- `GET /status/why/{namespace}/{name}` (or `/status/why?uid=`): the reasons the pod's latest
  filter call gave per node (`extender.service.why`).

Owns the HTTP side of these only: parameters, status codes (400 for a bad ask, 404 for a pod
the extender knows nothing of, 503 before the ledger is built) and the assets' cache.
"""

from __future__ import annotations

import asyncio
import importlib.resources
from typing import Final

import orjson
from aiohttp import web

from extender.http.handlers import JSON, json_response
from extender.http.keys import SERVICE
from extender.service.feed import StatusFeed, pod_document, stream_nodes
from extender.service.room import AskError, probe_pod, room_for
from extender.ui import ASSETS, PAGE

FEED = web.AppKey("ui_feed", StatusFeed)
#: Asset name → its bytes, read once (in a worker thread) on first use.
_CACHE = web.AppKey("ui_assets", dict[str, bytes])

#: The page loads its own script, style and JSON from this listener, and nothing else.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: Longest namespace, name or quantity accepted in a parameter (a DNS subdomain is 253).
MAX_PARAM: Final = 253
#: The largest Linux user id (a 32-bit uid_t, less the reserved -1).
MAX_UID: Final = 2**32 - 2


def add_routes(app: web.Application) -> None:
    """The page and its endpoints on `app` (an application with SERVICE)."""
    app[FEED] = StatusFeed()
    app[_CACHE] = {}
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/", to_page)
    app.router.add_get("/ui/nodes", nodes)
    app.router.add_get("/ui/changes", changes)
    app.router.add_get("/ui/{asset}", asset)
    app.router.add_get("/status/fit", fit)
    app.router.add_get("/status/pod/{uid}", pod)
    app.router.add_get("/status/why", why)
    app.router.add_get("/status/why/{namespace}/{name}", why)


def _not_ready() -> web.Response:
    return json_response({"Error": "not ready"}, status=503)


def _bad(reason: str) -> web.Response:
    return json_response({"Error": reason}, status=400)


async def _asset_bytes(app: web.Application, name: str) -> bytes:
    cache = app[_CACHE]
    found = cache.get(name)
    if found is None:
        files = importlib.resources.files("extender.ui")
        found = cache[name] = await asyncio.to_thread(files.joinpath(name).read_bytes)
    return found


async def _send_asset(request: web.Request, name: str) -> web.Response:
    return web.Response(
        body=await _asset_bytes(request.app, name),
        headers={
            "Content-Type": ASSETS[name],
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )


async def page(request: web.Request) -> web.Response:
    return await _send_asset(request, PAGE)


async def to_page(request: web.Request) -> web.Response:
    """`/ui/` → `/ui`: the page's links are relative to `/ui` (they work behind a proxy's
    prefix too)."""
    raise web.HTTPFound("../ui")


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["asset"]
    if name not in ASSETS:
        return json_response({"Error": f"no asset {name!r}"}, status=404)
    return await _send_asset(request, name)


async def nodes(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    if not service.ready:
        return _not_ready()
    limit_text = request.query.get("limit", "")
    if limit_text and not limit_text.isdigit():
        return _bad(f"limit must be a whole number, not {limit_text[:40]!r}")
    limit = int(limit_text) if limit_text else None
    state = service.state
    config = {"policy": service.config.policy.name, "error": service.config_error}
    response = web.StreamResponse(headers={"Content-Type": JSON, "Cache-Control": "no-store"})
    await response.prepare(request)
    async for piece in stream_nodes(state, request.app[FEED], config=config, limit=limit):
        await response.write(piece)
    await response.write_eof()
    return response


async def changes(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.ready:
        return _not_ready()
    since = request.query.get("since", "")
    answer = await request.app[FEED].changes(service.state, since, in_doubt=service.binder.in_doubt)
    return json_response(answer)


def _param(request: web.Request, key: str) -> str | None:
    value = request.query.get(key, "").strip()
    if len(value) > MAX_PARAM:
        raise AskError(f"{key} is longer than {MAX_PARAM} characters")
    return value or None


def _user(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isascii() or not text.isdigit() or int(text) > MAX_UID:
        raise AskError(f"user={text!r} is not a Linux user id (0..{MAX_UID})")
    return int(text)


async def fit(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.ready:
        return _not_ready()
    try:
        threads = _param(request, "threads")
        memory = _param(request, "memory")
        if threads is None and memory is None:
            raise AskError("ask for threads (percent) or memory (e.g. 8Gi), or both")
        pod_ = probe_pod(
            threads=threads,
            memory=memory,
            clients=_param(request, "clients"),
            namespace=_param(request, "namespace") or "default",
            user=_user(_param(request, "user")),
        )
        answer = await room_for(service.state, pod_)
    except AskError as exc:
        return _bad(str(exc))
    return json_response(answer)


async def pod(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.ready:
        return _not_ready()
    uid = request.match_info["uid"]
    doc = pod_document(service.state, uid)
    if doc is None:
        return json_response({"Error": f"no allocation for pod uid {uid!r}"}, status=404)
    return json_response(doc)


async def why(request: web.Request) -> web.Response:
    """The pod's latest filter answer; 404 when no filter call for it is remembered."""
    reasons = request.app[SERVICE].why
    uid = request.query.get("uid")
    namespace = request.match_info.get("namespace") or request.query.get("namespace")
    name = request.match_info.get("name") or request.query.get("name")
    if uid:
        answer = reasons.of_uid(uid)
        what = f"pod uid {uid!r}"
    elif namespace and name:
        answer = reasons.of_pod(namespace, name)
        what = f"pod {namespace}/{name}"
    else:
        return _bad("name the pod: /status/why/NAMESPACE/NAME or /status/why?uid=UID")
    if answer is None:
        reason = f"no filter call remembered for {what} (filtered before this process started?)"
        return json_response({"Error": reason}, status=404)
    return web.Response(body=orjson.dumps(answer.document()), content_type=JSON)
