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
from dataclasses import dataclass

import orjson
from aiohttp import web

from extender.http.fairness import LargeBodyGate
from extender.http.keys import ARGS, GATE, METRICS, SERVICE, SETTINGS
from extender.http.wire import (
    WireError,
    binding_args,
    binding_result,
    decode,
    filter_answer,
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


@dataclass(frozen=True, slots=True)
class Answer:
    """A verb's answer, independent of the HTTP server that sends it: the JSON body, the status
    and the outcome the metrics count."""

    body: bytes
    outcome: str
    status: int = 200


def _json(value: object, outcome: str, *, status: int = 200) -> Answer:
    return Answer(orjson.dumps(value), outcome, status)


#: The verbs that decide without waiting (filter, prioritize, preempt: the service's calls
#: are synchronous and do no I/O) and the one that acts (bind creates the Binding).
Decide = Callable[[web.Application, bytes], Answer]
Act = Callable[[web.Application, bytes], Awaitable[Answer]]


def bad_request(exc: WireError) -> Answer:
    return _json({"Error": str(exc)}, "rejected", status=400)


async def answer(verb: str, app: web.Application, body: bytes) -> Answer:
    """The answer to one verb's body (WireError for a malformed one): what both servers call."""
    decide = DECIDE.get(verb)
    return decide(app, body) if decide is not None else await ACT[verb](app, body)


async def _large(gate: LargeBodyGate, request: web.Request, verb: str) -> Answer:
    """A large body's request: its turn at the gate, then the read and the work, timed."""
    await gate.acquire()
    work = 0.0
    try:
        body = await _read(request)
        begun = time.perf_counter()
        try:
            return await answer(verb, request.app, body)
        finally:
            # Decoding, deciding and encoding: what held the loop (an invalid body too).
            work = time.perf_counter() - begun
    finally:
        gate.release(work)


def _verb(verb: str) -> Handler:
    """Wrap a verb: body reading, 4xx answers, latency and outcome metrics."""

    async def handler(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        app = request.app
        metrics = app[METRICS]
        gate = app[GATE]
        close = False
        try:
            length = _declared(request)
            # Without a declared length (chunked), a body is taken as large: its size is unknown.
            if request.body_exists if length is None else length > gate.threshold_bytes:
                result = await _large(gate, request, verb)
            else:
                gate.last_other = started
                result = await answer(verb, app, await _read(request))
        except _Reject as exc:
            result = _json({"Error": exc.reason}, "rejected", status=exc.status)
            # Do not drain the rest of an oversized or trickling body: close instead.
            close = exc.status in (408, 413)
        except WireError as exc:
            result = bad_request(exc)
        metrics.observe(verb, time.perf_counter() - started, result.outcome)
        response = web.Response(body=result.body, status=result.status, content_type=JSON)
        if close:
            response.force_close()
        return response

    return handler


def _filter(app: web.Application, body: bytes) -> Answer:
    args = app[ARGS].decode(body)
    service = app[SERVICE]
    try:
        outcome = service.filter(args.pod, args.names())
    except NotReady as exc:
        return _json(filter_result(error=str(exc)), "not_ready")
    outcome_name = "ok" if outcome.passed else "nofit"
    if args.node_names is not None:
        # Every candidate passed (the usual case): the names are encoded in the body already.
        names_json = args.names_json
        if not names_json or outcome.passed != args.node_names:
            names_json = orjson.dumps(outcome.passed)
        if args.nodes is None:
            answer = filter_answer(names_json, outcome.failed, outcome.unresolvable)
            return Answer(answer, outcome_name)
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
    return Answer(orjson.dumps(result), outcome_name)


def _prioritize(app: web.Application, body: bytes) -> Answer:
    service = app[SERVICE]
    args = app[ARGS].decode(body)
    names = args.names()
    try:
        scores = service.scores(args.pod, names)
    except NotReady as exc:
        return _json({"Error": str(exc)}, "not_ready", status=503)
    # The compiled build's C writer where `accelerators.nativeWriter` is on.
    answer = host_priorities(names, scores, native=service.accelerators.native_writer)
    service.moved_on()
    return Answer(answer, "ok")


async def _bind(app: web.Application, body: bytes) -> Answer:
    args = binding_args(decode(body))
    try:
        await app[SERVICE].bind(
            name=args.pod_name, namespace=args.pod_namespace, uid=args.pod_uid, node=args.node
        )
    except NotReady as exc:
        app[METRICS].bind_failed("not_ready")
        return _json(binding_result(str(exc)), "not_ready")
    except BindError as exc:
        app[METRICS].bind_failed(exc.reason)
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
        return _json(binding_result(exc.message), "refused")
    return _json(binding_result(), "ok")


def _preempt(app: web.Application, body: bytes) -> Answer:
    args = preemption_args(decode(body))
    proposal = {n: Victims(v.uids, v.pdb_violations) for n, v in args.victims.items()}
    try:
        chosen = app[SERVICE].preempt(args.pod, proposal)
    except NotReady as exc:
        return _json({"Error": str(exc)}, "not_ready", status=503)
    result = preemption_result({n: (v.uids, v.pdb_violations) for n, v in chosen.items()})
    return _json(result, "ok" if chosen else "nofit")


DECIDE: dict[str, Decide] = {"filter": _filter, "prioritize": _prioritize, "preempt": _preempt}
ACT: dict[str, Act] = {"bind": _bind}

filter_handler = _verb("filter")
prioritize_handler = _verb("prioritize")
bind_handler = _verb("bind")
preempt_handler = _verb("preempt")


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
