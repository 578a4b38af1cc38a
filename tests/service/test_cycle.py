"""The registry of scheduling cycles (`CycleRegistry`): a pod's latest cycle by uid, replaced by
its next filter, ended by its bind, forgotten all at once on a new decision state, and bounded,
oldest out."""

from __future__ import annotations

from typing import cast

from extender.packing.state import DecisionState
from extender.service.cycle import Cycle, CycleRegistry


def _cycle(uid: str, passed: int = 2) -> Cycle:
    names = [f"n{i}" for i in range(passed)]
    return Cycle((uid, "1"), cast(DecisionState, None), 0, names, [1.0] * passed)


def test_a_pods_latest_cycle_is_found_by_its_uid() -> None:
    cycles = CycleRegistry()
    first, again, other = _cycle("a"), _cycle("a", passed=3), _cycle("b")
    assert cycles.find("a") is None
    cycles.keep(first)
    cycles.keep(other)
    assert cycles.find("a") is first and cycles.find("b") is other
    cycles.keep(again)  # the pod filtered again: its newer cycle replaces the first
    assert cycles.find("a") is again and len(cycles) == 2


def test_a_bind_ends_its_pods_cycle_only() -> None:
    cycles = CycleRegistry()
    cycles.keep(_cycle("a"))
    cycles.keep(_cycle("b"))
    cycles.end("a")
    cycles.end("never-filtered")
    assert cycles.find("a") is None and cycles.find("b") is not None


def test_clear_forgets_every_cycle() -> None:
    cycles = CycleRegistry()
    for uid in "abc":
        cycles.keep(_cycle(uid))
    cycles.clear()
    assert len(cycles) == 0 and cycles.find("a") is None


def test_the_registry_is_bounded_oldest_out() -> None:
    cycles = CycleRegistry(capacity=3)
    for uid in "abcd":
        cycles.keep(_cycle(uid))
    assert len(cycles) == 3
    assert cycles.find("a") is None
    cycles.keep(_cycle("b"))  # filtered again: now the newest
    cycles.keep(_cycle("e"))
    assert cycles.find("b") is not None and cycles.find("c") is None
