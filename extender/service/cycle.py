"""kube-scheduler's scheduling cycles as this extender sees them: one object per pod, from its
filter call to its prioritize and its bind, kept in a small registry looked up by pod uid.

kube-scheduler schedules one pod at a time per profile: after /filter it runs its own Score
plugins and then calls /prioritize with the nodes the filter passed (kube-scheduler's extender
protocol), then binds. A `Cycle` holds what the filter read and found (the pod's version, the
decision state and its epoch, the passed names, their raw scores) so that prioritize can reuse
the scores while nothing they depend on has changed. Whether
a cycle still holds for a given request is the service's rule (`ExtenderService.scores`); this
module only keeps the cycles.

Several profiles (or replicas' schedulers) may interleave their pods, so the registry keeps the
latest `CAPACITY` cycles, oldest out; a cycle also ends at its pod's bind.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from extender.packing.state import DecisionState

#: Cycles kept at most: a few per scheduler profile is plenty (each is serial).
CAPACITY: Final = 64


@dataclass(slots=True, eq=False)
class Cycle:
    """One pod's scheduling cycle, opened by its filter call."""

    #: The pod's (uid, resourceVersion) when it was filtered.
    key: tuple[str, str]
    #: The decision state filter read, and its evaluator's epoch then.
    state: DecisionState
    epoch: int
    #: The nodes that passed, in the order asked, and their raw policy scores.
    passed: list[str]
    scores: Sequence[float]
    #: `scores` scaled to 0..MAX_SCORE, made on first use.
    scaled: tuple[int, ...] | None = None

    @property
    def uid(self) -> str:
        return self.key[0]


class CycleRegistry:
    """The latest cycles by pod uid, oldest out past `capacity`."""

    def __init__(self, *, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._cycles: OrderedDict[str, Cycle] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cycles)

    def find(self, uid: str) -> Cycle | None:
        """The latest cycle of the pod with this uid, if still kept."""
        return self._cycles.get(uid)

    def keep(self, cycle: Cycle) -> None:
        """A filter call opened `cycle`: it replaces the pod's earlier one, as the newest."""
        cycles = self._cycles
        cycles.pop(cycle.uid, None)
        cycles[cycle.uid] = cycle
        while len(cycles) > self._capacity:
            cycles.popitem(last=False)

    def end(self, uid: str) -> None:
        """The pod's bind came: its cycle is over."""
        self._cycles.pop(uid, None)

    def clear(self) -> None:
        """Forget every cycle (a new decision state: none of them holds for it)."""
        self._cycles.clear()
