"""The parse cache: bounded in bytes by its own estimate (checked against tracemalloc), oldest
entries evicted first, and pods whose identity no real pod has (a 4 MiB uid) answered the same
as any other pod but never kept."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

from extender.packing.parsing import PodParser, entry_bytes
from extender.packing.settings import BudgetSettings
from tests.http.kube_objects import pod

Json = dict[str, object]
MIB = 1 << 20


def _parser(max_bytes: int) -> PodParser:
    return PodParser(
        BudgetSettings(),
        cpu_milli=lambda spec: 1000,
        limits=lambda: (40960, 4),
        max_bytes=max_bytes,
    )


def _pod(i: int, *, uid: str | None = None) -> dict[str, object]:
    p = pod(f"pod-{i:06d}", uid=uid or str(uuid.UUID(int=i)), threads=1 + i % 90)
    p["metadata"]["resourceVersion"] = str(10**9 + i)
    return p


def test_absurd_identities_are_answered_but_not_cached() -> None:
    parser = _parser(8 * MIB)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40):
            # Each uid distinct, 4 MiB: 160 MiB if kept.
            parsed = parser.parse(_pod(i, uid=f"{i:08d}" + "u" * (4 * MIB)))
            assert parsed.demand is not None and parsed.error is None
        del parsed
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < MIB, grown
    assert len(parser) == 0
    # The same pod with a real uid is cached, with the same answer.
    normal = parser.parse(_pod(1))
    assert len(parser) == 1 and parser.latest(str(uuid.UUID(int=1))) is normal
    for field, size in (("name", 254), ("namespace", 64), ("resourceVersion", 65)):
        p = _pod(2)
        p["metadata"][field] = "x" * size  # type: ignore[index]
        parser.parse(p)
        assert len(parser) == 1, field


def test_huge_container_names_are_not_cached() -> None:
    parser = _parser(8 * MIB)
    p = _pod(3)
    p["spec"]["containers"][0]["name"] = "c" * MIB  # type: ignore[index]
    assert parser.parse(p).demand is not None
    assert len(parser) == 0


def test_the_cache_stays_within_its_byte_budget_oldest_first() -> None:
    budget = 256 * 1024
    parser = _parser(budget)
    for i in range(5_000):
        parser.parse(_pod(i))
        assert parser.nbytes <= budget
    kept = len(parser)
    assert 100 < kept < 5_000
    # The newest are kept, the oldest gone; every uid still indexed is a cached version.
    assert parser.latest(str(uuid.UUID(int=4_999))) is not None
    assert parser.latest(str(uuid.UUID(int=0))) is None
    newest = parser.parse(_pod(4_999))
    assert parser.parse(_pod(4_999)) is newest  # a hit
    # A new version of a cached pod replaces its uid's entry and is counted once.
    p = _pod(4_999)
    p["metadata"]["resourceVersion"] = "2"  # type: ignore[index]
    second = parser.parse(p)
    assert parser.latest(str(uuid.UUID(int=4_999))) is second
    assert parser.nbytes <= budget


def test_the_estimate_matches_tracemalloc() -> None:
    parser = _parser(1 << 30)
    pods = [_pod(i) for i in range(3_000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for p in pods:
            parser.parse(p)
        del pods  # what stays is what the cache keeps (strings included)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = parser.nbytes
    assert 0.9 * traced <= estimate <= 1.5 * traced, (estimate, traced)
    assert estimate == sum(entry_bytes(parser.parse(_pod(i))) for i in range(3_000))
