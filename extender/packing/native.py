"""The compiled build's C extension (`_native.c`), where it is installed: the fragmentation
measure's plan class, the share fit over packed node records, both in one call, the most
GPUs of a node they take, the min-max scaling of scores, and the evaluator's gathers by state
id; None (and 0) in the pure build,
whose callers then compute in Python, with the same results bit for bit
(tests/packing/test_native.py holds the two to each other). Read once, at import. The
configuration's `accelerators.nativeFit` and `nativeWriter` keep their callers off them
(`Evaluator(native=False)`, and the `native=False` of the scaling and the answer writer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from array import array

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
#: scale(raw, top) -> the scores scaled to 0..top, or None where Python must scale them.
Scale = Callable[[tuple[float, ...] | list[float], int], tuple[int, ...] | None]
#: pick_bytes(status, ids) -> the status byte of each id.
PickBytes = Callable[[bytearray, tuple[int, ...]], bytes]
#: pick_doubles(scores, ids) -> the score of each id.
PickDoubles = Callable[["array[float]", tuple[int, ...]], tuple[float, ...]]


def _load() -> (
    tuple[type[Plan], FitShare, FillShare, int, Scale, PickBytes, PickDoubles, tuple[str, ...]]
    | None
):
    try:
        from extender.packing._native import (
            MAX_GPUS,
            RECORD_FIELDS,
            Plan,
            fill_share,
            fit_share,
            pick_bytes,
            pick_doubles,
            scale,
        )
    except ImportError:
        return None
    return Plan, fit_share, fill_share, MAX_GPUS, scale, pick_bytes, pick_doubles, RECORD_FIELDS


_LOADED: Final = _load()
PLAN: Final = None if _LOADED is None else _LOADED[0]
FIT_SHARE: Final = None if _LOADED is None else _LOADED[1]
FILL_SHARE: Final = None if _LOADED is None else _LOADED[2]
#: GPUs of a node the C code takes at most; a larger node is computed in Python.
MAX_GPUS: Final = 0 if _LOADED is None else _LOADED[3]
#: service.answers' min-max scaling of scores to 0..MAX_SCORE, for a prioritize answer.
SCALE: Final = None if _LOADED is None else _LOADED[4]
#: The evaluator's gathers by state id: status bytes, and scores.
PICK_BYTES: Final = None if _LOADED is None else _LOADED[5]
PICK_DOUBLES: Final = None if _LOADED is None else _LOADED[6]
#: The names of a fit record's words per GPU, in the C code's order (`state_index` checks
#: them against its own list at import).
RECORD_FIELDS: Final = None if _LOADED is None else _LOADED[7]
