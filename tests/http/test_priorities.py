"""Prioritize's answer prepared once filter's is out (`extender.http.priorities`), over real
loopback sockets on the fast path: the prepared bytes are the answer only while the pod's cycle
holds; a bind on a passed node in between makes prioritize encode afresh; names that are equal
but written otherwise, and another pod's filter in between, still get it; and nothing is
prepared where no prioritize follows (one node passed, no prioritize verb)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

import extender.http.priorities as priorities
import extender.service.cycle as cycle_module
from extender.http.keys import HttpSettings
from extender.http.wire import host_priorities
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


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of hosts of every HostPriorityList the prepared-answer module encodes."""
    calls: list[int] = []

    def counting(hosts: Sequence[str], scores: Sequence[int], *, native: bool = True) -> bytes:
        calls.append(len(hosts))
        return host_priorities(hosts, scores, native=native)

    monkeypatch.setattr(priorities, "host_priorities", counting)
    return calls


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
    fresh.cycles.clear()
    return [{"Host": h, "Score": v} for h, v in zip(names, fresh.scores(PROBE, names), strict=True)]


@pytest.mark.accelerator("prepared_priorities")
async def test_the_prepared_answer_is_prioritizes_own(encodings: list[int]) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            assert len(names) == 5
            # Prepared once the filter's answer was out, before prioritize was asked.
            assert encodings == [5]
            scores = await _call(streams, "prioritize", _pair_body(names))
            assert encodings == [5]  # answered with the prepared bytes
        assert scores == _expected(s, names)


@pytest.mark.accelerator("prepared_priorities")
async def test_a_bind_on_a_passed_node_makes_prioritize_encode_afresh(
    encodings: list[int],
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            prepared = s.service.scores(PROBE, names)
            bind = {
                "PodName": "other",
                "PodNamespace": "default",
                "PodUID": "uid-default-other",
                "Node": names[2],
            }
            assert await _call(streams, "bind", bind) == {"Error": ""}
            scores = await _call(streams, "prioritize", _pair_body(names))
            assert encodings == [5, 5]
        assert scores == _expected(s, names)
        # The bind did change what prioritize answers: the prepared answer was stale.
        assert [h["Score"] for h in scores] != list(prepared)


@pytest.mark.accelerator("prepared_priorities")
async def test_nothing_is_prepared_where_no_prioritize_follows(encodings: list[int]) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s, connection(s) as streams:
        # One node passed: kube-scheduler skips prioritize.
        await _call(streams, "filter", _pair_body(s.names[:1]))
        assert encodings == []
        # Two filters in a row: the scheduler has no prioritize verb. The first prepared an
        # answer for nothing; the second prepares none.
        await _call(streams, "filter", _pair_body(s.names[:3]))
        await _call(streams, "filter", _pair_body(s.names[:4]))
        assert encodings == [3]
        # A prioritize call comes after all (not prepared: encoded then), and the next
        # filter prepares again.
        await _call(streams, "prioritize", _pair_body(s.names[:4]))
        assert encodings == [3, 4]
        await _call(streams, "filter", _pair_body(s.names[:5]))
        assert encodings == [3, 4, 5]


def _held_binds(s: Served, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Binds whose Binding is answered only once the returned event is set (a slow API)."""
    release = asyncio.Event()
    cluster = s.service.cluster
    real = cluster.bind

    async def held(**kwargs: Any) -> None:
        await release.wait()
        await real(**kwargs)

    monkeypatch.setattr(cluster, "bind", held)
    return release


BIND_OTHER = {
    "PodName": "other",
    "PodNamespace": "default",
    "PodUID": "uid-default-other",
    "Node": "node-0005",
}


@pytest.mark.accelerator("prepared_priorities")
@pytest.mark.accelerator("fast_path")
async def test_a_bind_in_flight_answers_before_the_preparation_runs(
    encodings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        release = _held_binds(s, monkeypatch)
        async with connection(s) as binding, connection(s) as pairs:
            binding[1].write(post("/bind", orjson.dumps(BIND_OTHER)))
            await asyncio.sleep(0.01)
            filtered = await _call(pairs, "filter", _pair_body(s.names[:5]))
            assert encodings == []  # held back behind the bind
            release.set()
            status, _, body = await response(binding[0])
            assert (status, orjson.loads(body)) == (200, {"Error": ""})
            await asyncio.sleep(0.01)
            assert encodings == [5]  # made once the bind was done
            scores = await _call(pairs, "prioritize", _pair_body(filtered["NodeNames"]))
            assert encodings == [5]
        assert scores == _expected(s, filtered["NodeNames"])


@pytest.mark.accelerator("prepared_priorities")
@pytest.mark.accelerator("fast_path")
async def test_a_preparation_overtaken_by_its_prioritize_is_not_made(
    encodings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        release = _held_binds(s, monkeypatch)
        async with connection(s) as binding, connection(s) as pairs:
            binding[1].write(post("/bind", orjson.dumps(BIND_OTHER)))
            await asyncio.sleep(0.01)
            filtered = await _call(pairs, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            await _call(pairs, "prioritize", _pair_body(names))
            assert encodings == [5]  # encoded when asked: nothing was prepared yet
            release.set()
            await response(binding[0])
            await asyncio.sleep(0.01)
            assert encodings == [5]  # the late preparation was dropped
            # and prioritize calls still count as coming: the next filter prepares.
            await _call(pairs, "filter", _pair_body(s.names[:4]))
            assert encodings == [5, 4]


@pytest.mark.accelerator("cycle_delay")
async def test_the_scheduling_cycle_is_open_from_filter_to_prioritize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Background work (Events) waits while it is open: between a filter answer that a
    # prioritize call follows and that call's answer. (A hold long enough for a loaded test
    # machine: the real one is a few milliseconds.)
    monkeypatch.setattr(cycle_module, "MAX_HOLD_S", 60.0)
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s, connection(s) as streams:
        cycles = s.service.cycles
        assert not cycles.holding
        await _call(streams, "filter", _pair_body(s.names[:3]))
        assert cycles.holding
        await _call(streams, "prioritize", _pair_body(s.names[:3]))
        assert not cycles.holding
        # One node passed: no prioritize follows, nothing is held.
        await _call(streams, "filter", _pair_body(s.names[:1]))
        assert not cycles.holding
        # No prioritize verb (a filter after a filter): the second expects none.
        await _call(streams, "filter", _pair_body(s.names[:3]))
        await _call(streams, "filter", _pair_body(s.names[:4]))
        assert not cycles.holding
        # A bind ends its pod's cycle, and what it held.
        await _call(streams, "filter", _pair_body(s.names[:3]))
        await _call(streams, "prioritize", _pair_body(s.names[:3]))
        await _call(streams, "filter", _pair_body(s.names[:3]))
        assert cycles.holding
        bind = {"PodName": "probe", "PodNamespace": "default", "PodUID": "uid-default-probe"}
        await _call(streams, "bind", {**bind, "Node": s.names[0]})
        assert not cycles.holding


@pytest.mark.accelerator("prepared_priorities")
async def test_a_prioritize_body_written_otherwise_gets_the_prepared_answer(
    encodings: list[int],
) -> None:
    """The names arrive as a new list (the body is not byte for byte the filter's answer: other
    spacing, as another client's encoder writes it): equal names, the same cycle."""
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            filtered = await _call(streams, "filter", _pair_body(s.names[:5]))
            names = filtered["NodeNames"]
            assert encodings == [5]
            reader, writer = streams
            body = orjson.dumps(_pair_body(names), option=orjson.OPT_INDENT_2)
            writer.write(post("/prioritize", body))
            status, _, got = await response(reader)
            assert status == 200
            assert encodings == [5]  # the prepared bytes
        assert orjson.loads(got) == _expected(s, names)


@pytest.mark.accelerator("prepared_priorities")
async def test_interleaved_pods_each_get_their_prepared_answer(encodings: list[int]) -> None:
    """Two scheduler profiles: pod A's filter, then pod B's, then A's prioritize."""
    other = pod("other", threads=60)
    async with served(HttpSettings(), nodes=6, objects=OBJECTS) as s:
        async with connection(s) as streams:
            first = await _call(streams, "filter", _pair_body(s.names[:5]))
            assert encodings == [5]
            await _call(streams, "filter", {"Pod": other, "NodeNames": s.names[:4]})
            scores = await _call(streams, "prioritize", _pair_body(first["NodeNames"]))
            assert encodings[0] == 5 and 5 not in encodings[1:]  # A's prepared answer
        assert scores == _expected(s, first["NodeNames"])
