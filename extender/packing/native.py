"""The compiled build's C extension (`_native.c`), where it is installed: the fragmentation
measure's plan class and the share fit over packed node records; None in the pure build, whose
callers then compute in Python, with the same results bit for bit (tests/packing/test_native.py
holds the two to each other). Read once, at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from extender.packing._native import Plan

#: fit_share(record, demands, run_as_user, uid_isolation) -> (GPU indexes, GPU shapes) | None.
FitShare = Callable[
    [bytes, bytes, int | None, bool], tuple[tuple[int, ...], tuple[int, ...]] | None
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


PLAN: Final = _plan_type()
FIT_SHARE: Final = _fit_share()
