"""The compiled build's writer of prioritize's answer (`extender/http/_wire.c`) writes what the
Python writer and orjson write, byte for byte, and leaves to Python every host it cannot write
as it is (quotes, backslashes, control or non-ASCII characters) and every score it does not
take.

Skipped where the extension is not installed (the pure build); tests/test_native_build.py
compiles it and runs this file against it, and the compiled build's test runs it there."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.http import wire
from extender.http.wire import host_priorities, host_priorities_in_python
from tests.http.test_wire import _HOST_NAMES

pytestmark = pytest.mark.skipif(
    wire._HOST_PRIORITIES_IN_C is None,
    reason="the C extension is not installed (pure build); tests/test_native_build.py builds it",
)


def _in_c(hosts: list[str], scores: tuple[int, ...]) -> bytes | None:
    in_c = wire._HOST_PRIORITIES_IN_C
    assert in_c is not None
    return in_c(hosts, scores)


def _plain(host: str) -> bool:
    return host.isascii() and all(" " <= c <= "~" and c not in '"\\' for c in host)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(rows=st.lists(st.tuples(_HOST_NAMES, st.integers(0, 10)), max_size=40))
def test_the_c_writer_writes_what_python_and_orjson_write(rows: list[tuple[str, int]]) -> None:
    hosts = [h for h, _ in rows]
    scores = tuple(s for _, s in rows)
    written = _in_c(hosts, scores)
    expected = orjson.dumps([{"Host": h, "Score": s} for h, s in rows])
    if all(_plain(h) for h in hosts):
        assert written == expected
    else:
        assert written is None  # left to Python, which escapes
    assert host_priorities(hosts, scores) == expected
    assert host_priorities_in_python(hosts, scores) == expected


def test_scores_it_does_not_take_are_left_to_python() -> None:
    for score in (-1, 100, 2**70, True):
        assert _in_c(["a", "b"], (1, score)) is None
    assert _in_c(["a"], (5.0,)) is None  # type: ignore[arg-type]
    # Two digits are written as they are (the service's scores stop at 10).
    assert _in_c(["a", "b"], (10, 99)) == b'[{"Host":"a","Score":10},{"Host":"b","Score":99}]'


def test_the_c_writer_refuses_what_is_not_its_input() -> None:
    with pytest.raises(ValueError, match="2 hosts but 1 scores"):
        _in_c(["a", "b"], (1,))
    with pytest.raises(TypeError, match="host_priorities"):
        _in_c(("a",), (1,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="host_priorities"):
        _in_c(["a"], [1])  # type: ignore[arg-type]
    assert _in_c([], ()) == b"[]"
    # A host that is not a string is left to Python.
    assert _in_c([1], (1,)) is None  # type: ignore[list-item]


def test_the_answer_is_written_in_c_where_it_can_be(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    in_c = wire._HOST_PRIORITIES_IN_C
    assert in_c is not None

    def counted(hosts: list[str], scores: tuple[int, ...]) -> bytes | None:
        calls.append(len(hosts))
        return in_c(hosts, scores)

    monkeypatch.setattr(wire, "_HOST_PRIORITIES_IN_C", counted)
    hosts = [f"node-{i:04d}.zone-a" for i in range(500)]
    scores = tuple(i % 11 for i in range(500))
    assert host_priorities(hosts, scores) == in_c(hosts, scores)
    assert calls == [500]  # written in C, not by the Python writer's same bytes
    assert orjson.loads(host_priorities(hosts, scores))[499] == {
        "Host": "node-0499.zone-a",
        "Score": 499 % 11,
    }
