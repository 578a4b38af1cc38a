"""aiohttp handlers: the extender verbs and the health, metrics and status endpoints.

Owns the HTTP side of each verb only: read the body (bounded in size and time; a large one
takes its turn at the `fairness` gate first), decode it with `wire`, call the service, encode
the answer, count it. Logical outcomes always travel in a 200 answer as the
protocol wants ("no fit" in FailedNodes, a refused bind in Error); malformed requests get a 4xx
with a JSON reason; an extender that cannot answer yet (startup) reports it in `Error` where the
verb's reply has that field, and with 503 where it does not (prioritize, preempt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from extender.http.fairness import LargeBodyGate
from extender.http.keys import ARGS, GATE, METRICS, SERVICE, SETTINGS
from extender.http.wire import (
    WireError,
    binding_args,
    binding_result,
    decode,
    filter_result,
    host_priorities,
    preemption_args,
    preemption_result,
)
from extender.metrics import CONTENT_TYPE
from extender.service import BindError, NotReady, Victims

log = logging.getLogger(__name__)

JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(value: object, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type=JSON)


class _Reject(Exception):
    """Answer at once with this status and reason (a bad request, not a failure of ours)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _declared(request: web.Request) -> int | None:
    """The declared body length, refused with 413 past the configured limit."""
    limit = request.app[SETTINGS].max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        # Refuse before reading a byte: a 100 MB body must cost nothing.
        raise _Reject(413, f"body of {length} bytes exceeds the limit of {limit} bytes")
    return length


async def _read(request: web.Request) -> bytes:
    """The request body, refused with 413 past the configured limit and with 408 when it does
    not arrive in time (bytes trickling in hold a connection and a handler otherwise)."""
    settings = request.app[SETTINGS]
    try:
        if request.content.is_eof():
            # The usual case: the body came with the headers. No timer to arm.
            return await request.read()
        async with asyncio.timeout(settings.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _Reject(413, f"body exceeds the limit of {settings.max_body_bytes} bytes") from None
    except TimeoutError:
        raise _Reject(408, f"body not received within {settings.body_timeout_s:g}s") from None


Impl = Callable[[web.Request, bytes], Awaitable[tuple[web.Response, str]]]


async def _large(gate: LargeBodyGate, request: web.Request, impl: Impl) -> tuple[web.Response, str]:
    """A large body's request: its turn at the gate, then the read and the work, timed."""
    await gate.acquire()
    work = 0.0
    try:
        body = await _read(request)
        begun = time.perf_counter()
        try:
            return await impl(request, body)
        finally:
            # Decoding, deciding and encoding: what held the loop (an invalid body too).
            work = time.perf_counter() - begun
    finally:
        gate.release(work)


def _verb(verb: str, impl: Impl) -> Handler:
    """Wrap a verb: body reading, 4xx answers, latency and outcome metrics."""

    async def handler(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        app = request.app
        metrics = app[METRICS]
        gate = app[GATE]
        response: web.Response
        try:
            length = _declared(request)
            # Without a declared length (chunked), a body is taken as large: its size is unknown.
            if request.body_exists if length is None else length > gate.threshold_bytes:
                response, outcome = await _large(gate, request, impl)
            else:
                gate.last_other = started
                response, outcome = await impl(request, await _read(request))
        except _Reject as exc:
            response, outcome = json_response({"Error": exc.reason}, status=exc.status), "rejected"
            if exc.status in (408, 413):
                # Do not drain the rest of an oversized or trickling body: close instead.
                response.force_close()
        except WireError as exc:
            response, outcome = json_response({"Error": str(exc)}, status=400), "rejected"
        metrics.observe(verb, time.perf_counter() - started, outcome)
        return response

    return handler


async def _filter(request: web.Request, body: bytes) -> tuple[web.Response, str]:
    decoder = request.app[ARGS]
    args = decoder.decode(body)
    names = args.names()
    try:
        outcome = request.app[SERVICE].filter(args.pod, names)
    except NotReady as exc:
        return json_response(filter_result(error=str(exc))), "not_ready"
    if args.node_names is not None:
        decoder.answered(outcome.passed)
    nodes = None
    if args.nodes is not None:
        # nodeCacheCapable: false wants the passing Node objects back, whole.
        keep = set(outcome.passed)
        items = [item for item in args.nodes["items"] if item["metadata"]["name"] in keep]
        nodes = {**args.nodes, "items": items}
    result = filter_result(
        nodes=nodes,
        node_names=outcome.passed if args.node_names is not None else None,
        failed=outcome.failed,
        unresolvable=outcome.unresolvable,
    )
    return json_response(result), "ok" if outcome.passed else "nofit"


async def _prioritize(request: web.Request, body: bytes) -> tuple[web.Response, str]:
    args = request.app[ARGS].decode(body)
    names = args.names()
    try:
        scores = request.app[SERVICE].scores(args.pod, names)
    except NotReady as exc:
        return json_response({"Error": str(exc)}, status=503), "not_ready"
    return web.Response(body=host_priorities(names, scores), content_type=JSON), "ok"


async def _bind(request: web.Request, body: bytes) -> tuple[web.Response, str]:
    args = binding_args(decode(body))
    try:
        await request.app[SERVICE].bind(
            name=args.pod_name, namespace=args.pod_namespace, uid=args.pod_uid, node=args.node
        )
    except NotReady as exc:
        request.app[METRICS].bind_failed("not_ready")
        return json_response(binding_result(str(exc))), "not_ready"
    except BindError as exc:
        request.app[METRICS].bind_failed(exc.reason)
        log.info(
            "bind %s/%s to %s refused: %s",
            args.pod_namespace,
            args.pod_name,
            args.node,
            exc,
            extra={
                "pod": f"{args.pod_namespace}/{args.pod_name}",
                "node": args.node,
                "verb": "bind",
                "outcome": "refused",
            },
        )
        return json_response(binding_result(exc.message)), "refused"
    return json_response(binding_result()), "ok"


async def _preempt(request: web.Request, body: bytes) -> tuple[web.Response, str]:
    args = preemption_args(decode(body))
    proposal = {n: Victims(v.uids, v.pdb_violations) for n, v in args.victims.items()}
    try:
        chosen = request.app[SERVICE].preempt(args.pod, proposal)
    except NotReady as exc:
        return json_response({"Error": str(exc)}, status=503), "not_ready"
    result = preemption_result({n: (v.uids, v.pdb_violations) for n, v in chosen.items()})
    return json_response(result), "ok" if chosen else "nofit"


filter_handler = _verb("filter", _filter)
prioritize_handler = _verb("prioritize", _prioritize)
bind_handler = _verb("bind", _bind)
preempt_handler = _verb("preempt", _preempt)


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop turns."""
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    """Ready once the ledger is built from the cluster and this replica is the leader, so that
    the Service in front of the replicas routes kube-scheduler to the leader only."""
    problem = request.app[SERVICE].serving_problem()
    if problem is None:
        return web.Response(text="ok")
    return web.Response(text=f"not ready: {problem}", status=503)


async def status(request: web.Request) -> web.StreamResponse:
    """The /status document (schema: `extender.service.status.status_document`), streamed."""
    service = request.app[SERVICE]
    if not service.ready:
        return json_response({"Error": "not ready"}, status=503)
    response = web.StreamResponse(headers={"Content-Type": JSON})
    await response.prepare(request)
    async for piece in service.status_stream(node=request.query.get("node")):
        await response.write(piece)
    await response.write_eof()
    return response


async def metrics(request: web.Request) -> web.Response:
    sample = await request.app[SERVICE].metrics_sample()
    # Formatting is O(GPUs); keep it off the event loop that serves the scheduler.
    body = await asyncio.to_thread(request.app[METRICS].render, sample)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
