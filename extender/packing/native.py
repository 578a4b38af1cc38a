"""The compiled build's C extension (`_native.c`), where it is installed: the fragmentation
measure's plan class, the share fit over packed node records, and both in one call; None in
the pure build, whose callers then compute in Python, with the same results bit for bit
(tests/packing/test_native.py holds the two to each other). Read once, at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from extender.packing._native import Plan

#: fit_share(record, demands, run_as_user, uid_isolation) -> (GPU indexes, GPU shapes) | None.
FitShare = Callable[
    [bytes, bytes, int | None, bool], tuple[tuple[int, ...], tuple[int, ...]] | None
]
#: fill_share(record, demands, run_as_user, uid_isolation, plan, cpu_free, free, pod_cpu)
#: -> (score, GPU) | None.
FillShare = Callable[
    [bytes, bytes, int | None, bool, "Plan", int, tuple[int, ...], int], tuple[float, int] | None
]


def _plan_type() -> type[Plan] | None:
    try:
        from extender.packing._native import Plan
    except ImportError:
        return None
    return Plan


def _fit_share() -> FitShare | None:
    try:
        from extender.packing._native import fit_share
    except ImportError:
        return None
    return fit_share


def _fill_share() -> FillShare | None:
    try:
        from extender.packing._native import fill_share
    except ImportError:
        return None
    return fill_share


PLAN: Final = _plan_type()
FIT_SHARE: Final = _fit_share()
FILL_SHARE: Final = _fill_share()
