"""Prioritize after filter on the fast path, over real loopback sockets: the answer is what an
extender that never saw the filter gives (the filter's scores reused while none of the passed
nodes changed), and a bind on a passed node in between is seen."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from extender.http.keys import HttpSettings
from tests.http.kube_objects import pod
from tests.http.served import Served, served
from tests.http.test_fastpath import connection, post, response

Json = dict[str, Any]

PROBE = pod("probe", threads=40)
OBJECTS = [
    pod("running", threads=30, node="node-0001", phase="Running"),
    pod("other", threads=60),
    PROBE,
]


async def _call(
    streams: tuple[asyncio.StreamReader, asyncio.StreamWriter], verb: str, doc: Json
) -> Any:
    reader, writer = streams
    writer.write(post(f"/{verb}", orjson.dumps(doc)))
    status, _, body = await response(reader)
    assert status == 200, body
    # The answer is read: the loop has also run what was queued after writing it.
    await asyncio.sleep(0.01)
    return orjson.loads(body)


def _pair_body(names: Sequence[str]) -> Json:
    return {"Pod": PROBE, "Nodes": None, "NodeNames": list(names)}


def _expected(s: Served, names: list[str]) -> list[Json]:
    """What an extender that never saw the filter answers."""
    fresh = s.service
    fresh._last = None
    return [{"Host": h, "Score": v} for h, v in zip(names, fresh.scores(PROBE, names), strict=True)]


async def test_prioritize_after_filter_answers_as_a_fresh_extender_would() -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            assert len(names) == 5
            scores = await _call(streams, "prioritize", _pair_body(names))
        assert scores == _expected(s, names)


async def test_a_bind_on_a_passed_node_is_seen_by_prioritize() -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            before = s.service.scores(PROBE, names)
            bind = {
                "PodName": "other",
                "PodNamespace": "default",
                "PodUID": "uid-default-other",
                "Node": names[2],
            }
            assert await _call(streams, "bind", bind) == {"Error": ""}
            scores = await _call(streams, "prioritize", _pair_body(names))
        assert scores == _expected(s, names)
        # The bind did change what prioritize answers: the filter's scores were stale.
        assert [h["Score"] for h in scores] != list(before)
