"""The verbs' answers, independent of HTTP: filter's outcome (with the pod's scheduling cycle),
the victims preemption keeps per node, and prioritize's 0..MAX_SCORE scores.

Scores: the policy's raw score is mapped to kube-scheduler's 0..10 by min-max over the
candidate nodes of the call: the best node gets 10, the worst 0, the rest in proportion,
rounded; when all are equal every node gets 10 (no preference). Nodes that do not fit get 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, cast

from extender.packing.native import SCALE
from extender.service.cycle import Cycle

MAX_SCORE: Final = 10


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """Filter's answer: nodes that pass (in input order) and the reason for each that does not.
    `unresolvable` nodes are ones no eviction can help (kube-scheduler skips them in
    preemption)."""

    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    #: The pod's scheduling cycle this call opened (None for a pod without identity or
    #: without a valid request): prioritize finds it again by the pod's uid.
    cycle: Cycle | None = None


@dataclass(frozen=True, slots=True)
class Victims:
    """The pods to evict from one node (uids) and kube-scheduler's PDB violation count."""

    uids: list[str]
    pdb_violations: int = 0


def normalise(raw: Sequence[float | None], *, native: bool = True) -> list[int]:
    """Raw policy scores → 0..MAX_SCORE by min-max, rounded half up; None (no fit) → 0.
    `native=False` scales in Python where the compiled build has the C scaling too."""
    if None not in raw:
        return list(scale(cast(Sequence[float], raw), native=native))
    fits = [s is not None for s in raw]
    scaled = iter(scale([s for s in raw if s is not None], native=native))
    return [next(scaled) if f else 0 for f in fits]


def scale(raw: Sequence[float], *, native: bool = True) -> tuple[int, ...]:
    """`normalise` of scores that are all known: the hot path of /prioritize. The compiled
    build scales a tuple or list of floats in C (`native.SCALE`, the same arithmetic at a
    fraction of the cost), else `scale_in_python`."""
    if native and SCALE is not None and raw and type(raw) in (tuple, list):
        scaled = SCALE(cast("tuple[float, ...]", raw), MAX_SCORE)
        if scaled is not None:
            return scaled
    return scale_in_python(raw)


def scale_in_python(raw: Sequence[float]) -> tuple[int, ...]:
    """`scale` in Python: every score that the C scaling declines (not a float, not finite)."""
    if not raw:
        return ()
    lo, hi = min(raw), max(raw)
    span = hi - lo
    if not span > 0:
        return (MAX_SCORE,) * len(raw)
    # The fraction first: (s - lo) / span lies in [0, 1] for any finite scores, whereas
    # MAX_SCORE / span overflows when the scores are a denormal apart.
    # Policies give few distinct values (FGD: integers 0..100): map each distinct one once and
    # translate the list in C. Plain builtins: in a scheduler's loop the caches are cold
    # between calls, and there numpy's machinery cost more than it saved.
    table = {s: int((s - lo) / span * MAX_SCORE + 0.5) for s in set(raw)}
    return tuple(map(table.__getitem__, raw))
