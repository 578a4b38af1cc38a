"""Prioritize over real loopback sockets reuses its pod's scheduling cycle: the scores its
filter computed answer it while the cycle holds, whether the body carries the passed names as
filter's answer wrote them or written otherwise; a bind on a passed node in between makes it
compute afresh; two pods' cycles interleaved each answer their own prioritize. Every answer is
the one an extender that never saw the filter gives."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from extender.http.keys import HttpSettings
from extender.service import ExtenderService
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


def _recomputations(service: ExtenderService, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of nodes of every score computation prioritize makes itself (the cycle did
    not hold): the service's own step, since the evaluator may be a compiled class."""
    calls: list[int] = []
    recompute = service._raw_scores

    def counted(state: Any, demand: Any, names: Sequence[str]) -> Any:
        calls.append(len(names))
        return recompute(state, demand, names)

    monkeypatch.setattr(service, "_raw_scores", counted)
    return calls


async def _call(
    streams: tuple[asyncio.StreamReader, asyncio.StreamWriter], verb: str, doc: Json
) -> Any:
    reader, writer = streams
    writer.write(post(f"/{verb}", orjson.dumps(doc)))
    status, _, body = await response(reader)
    assert status == 200, body
    return orjson.loads(body)


def _pair_body(names: Sequence[str], who: Json = PROBE) -> Json:
    return {"Pod": who, "Nodes": None, "NodeNames": list(names)}


def _expected(s: Served, names: list[str], who: Json = PROBE) -> list[Json]:
    """What an extender that never saw the filter answers."""
    fresh = s.service
    fresh.cycles.clear()
    return [{"Host": h, "Score": v} for h, v in zip(names, fresh.scores(who, names), strict=True)]


async def test_prioritize_answers_with_its_filters_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        calls = _recomputations(s.service, monkeypatch)
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            assert len(names) == 5
            scores = await _call(streams, "prioritize", _pair_body(names))
        assert calls == []
        assert scores == _expected(s, names)


async def test_a_bind_on_a_passed_node_makes_prioritize_compute_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        calls = _recomputations(s.service, monkeypatch)
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            before = s.service.scores(PROBE, names)
            assert calls == []
            bind = {
                "PodName": "other",
                "PodNamespace": "default",
                "PodUID": "uid-default-other",
                "Node": names[2],
            }
            assert await _call(streams, "bind", bind) == {"Error": ""}
            scores = await _call(streams, "prioritize", _pair_body(names))
            assert calls == [5]
        assert scores == _expected(s, names)
        # The bind did change what prioritize answers: the filter's scores were stale.
        assert [h["Score"] for h in scores] != list(before)


async def test_a_prioritize_body_written_otherwise_reuses_the_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The names arrive as a new list (the body is not byte for byte the filter's answer: other
    spacing, as another client's encoder writes it): equal names, the same cycle."""
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        calls = _recomputations(s.service, monkeypatch)
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            reader, writer = streams
            body = orjson.dumps(_pair_body(names), option=orjson.OPT_INDENT_2)
            writer.write(post("/prioritize", body))
            status, _, got = await response(reader)
            assert status == 200
        assert calls == []
        assert orjson.loads(got) == _expected(s, names)


async def test_interleaved_pods_each_reuse_their_own_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two scheduler profiles: pod A's filter, then pod B's, then A's prioritize and B's."""
    other = OBJECTS[1]
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        calls = _recomputations(s.service, monkeypatch)
        async with connection(s) as streams:
            first = await _call(streams, "filter", _pair_body(s.names[:5]))
            second = await _call(streams, "filter", _pair_body(s.names[1:5], other))
            a = await _call(streams, "prioritize", _pair_body(first["NodeNames"]))
            b = await _call(streams, "prioritize", _pair_body(second["NodeNames"], other))
        assert calls == []
        assert a == _expected(s, first["NodeNames"])
        assert b == _expected(s, second["NodeNames"], other)


async def test_names_the_filter_did_not_pass_are_scored_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        calls = _recomputations(s.service, monkeypatch)
        async with connection(s) as streams:
            await _call(streams, "filter", _pair_body(s.names[:5]))
            scores = await _call(streams, "prioritize", _pair_body(s.names[:3]))
        assert calls == [3]
        assert scores == _expected(s, s.names[:3])
