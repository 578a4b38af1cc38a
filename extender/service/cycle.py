"""kube-scheduler's scheduling cycles as this extender sees them: one object per pod, from its
filter call to its prioritize and its bind, kept in a small registry looked up by pod uid.

kube-scheduler schedules one pod at a time per profile: after /filter it runs its own Score
plugins and then calls /prioritize with the nodes the filter passed (kube-scheduler's extender
protocol), then binds. A `Cycle` holds what the filter read and found (the pod's version, the
decision state and its epoch, the passed names, their raw scores) so that prioritize can reuse
the scores while nothing they depend on has changed, plus what the HTTP layer made for it (the
passed names as encoded in filter's answer, and a prioritize answer prepared ahead, both opaque
bytes here). Whether a cycle still holds for a given request is the service's rule
(`ExtenderService.rank`); this module only keeps the cycles.

Several profiles (or replicas' schedulers) may interleave their pods, so the registry keeps the
latest `CAPACITY` cycles, oldest out; a cycle also ends at its pod's bind.

The registry also decides whether a prioritize call is expected after a filter: for two nodes
passed or more (kube-scheduler skips scoring for one), and only while prioritize calls come (a
cycle that expected one and was superseded by the next filter without it means the scheduler
has no prioritize verb: none is expected again until a prioritize call comes). While the latest
cycle expects its prioritize, background work (the watch's echo of an earlier bind, Events)
waits for it, with a bound: kube-scheduler's serial loop waits on the extender in that gap, and
that work does not have to happen there. With `accelerators.cycleDelay` off nothing waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from extender.packing.state import DecisionState

#: Seconds a cycle may hold background work: kube-scheduler's Score phase for one pod takes
#: well under a millisecond; past this the prioritize call is taken not to be coming.
MAX_HOLD_S: Final = 0.005
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
    #: The HTTP layer's encoding of `passed` in filter's answer (opaque here).
    passed_json: bytes = b""
    #: A prioritize answer prepared ahead for `passed`, and the scores it encodes.
    prepared: bytes = b""
    prepared_scores: tuple[int, ...] | None = None
    #: A prioritize call is expected and has not come yet.
    awaiting: bool = False
    #: When the filter opened it (the registry's clock).
    opened_at: float = 0.0

    @property
    def uid(self) -> str:
        return self.key[0]

    def keep_prepared(self, scores: tuple[int, ...], body: bytes) -> None:
        """Keep `body`, the prioritize answer for `passed` with `scores`, made ahead."""
        self.prepared, self.prepared_scores = body, scores


class CycleRegistry:
    """The latest cycles by pod uid, whether a prioritize call is expected, and a wait for
    background work while one is (see the module docstring)."""

    def __init__(
        self,
        *,
        capacity: int = CAPACITY,
        max_hold_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        hold: bool = True,
    ) -> None:
        self._capacity = capacity
        self._max_hold_s = MAX_HOLD_S if max_hold_s is None else max_hold_s
        self._clock = clock
        #: Background work waits for an expected prioritize (`accelerators.cycleDelay`).
        self._hold = hold
        self._cycles: OrderedDict[str, Cycle] = OrderedDict()
        #: The cycle of the latest filter call, if it opened one.
        self._latest: Cycle | None = None
        #: Whether prioritize calls come: no expected one has been skipped since the last.
        self._wanted = True
        self._released = asyncio.Event()
        self._released.set()
        #: Waits that found a prioritize expected and held background work (a counter).
        self.held = 0

    def __len__(self) -> int:
        return len(self._cycles)

    def find(self, uid: str) -> Cycle | None:
        """The latest cycle of the pod with this uid, if still kept."""
        return self._cycles.get(uid)

    def filtered(self, cycle: Cycle | None) -> None:
        """A filter call was answered; `cycle` is the one it opened (None: none, e.g. a pod
        that cannot be placed). Decides whether its prioritize is expected."""
        latest = self._latest
        if latest is not None and latest.awaiting:
            latest.awaiting = False  # the scheduler went on without it
            self._wanted = False
        self._latest = cycle
        if cycle is None:
            self._released.set()
            return
        cycles = self._cycles
        cycles.pop(cycle.uid, None)
        cycles[cycle.uid] = cycle
        while len(cycles) > self._capacity:
            cycles.popitem(last=False)
        cycle.awaiting = self._wanted and len(cycle.passed) >= 2
        cycle.opened_at = self._clock()
        if cycle.awaiting and self._hold:
            self._released.clear()
        else:
            self._released.set()

    def prioritized(self, cycle: Cycle | None) -> None:
        """A prioritize call came (for `cycle`, or for a pod without one)."""
        self._wanted = True
        if cycle is not None:
            cycle.awaiting = False
            self._release_if_done()

    def end(self, uid: str) -> None:
        """The pod's bind came: its cycle is over."""
        cycle = self._cycles.pop(uid, None)
        if cycle is not None:
            cycle.awaiting = False
            self._release_if_done()

    def clear(self) -> None:
        """Forget every cycle (a new decision state: none of them holds for it)."""
        self._cycles.clear()
        self._latest = None
        self._released.set()

    def _release_if_done(self) -> None:
        latest = self._latest
        if latest is None or not latest.awaiting:
            self._released.set()

    @property
    def holding(self) -> bool:
        """Background work should wait: the latest cycle expects its prioritize, and has not
        outgrown `max_hold_s`."""
        latest = self._latest
        return (
            self._hold
            and latest is not None
            and latest.awaiting
            and self._clock() - latest.opened_at < self._max_hold_s
        )

    async def wait_released(self) -> None:
        """Return once no cycle holds background work: at once when none does, else when its
        prioritize (or the next filter, or its bind) comes or it outgrows `max_hold_s`."""
        latest = self._latest
        if not self.holding or latest is None:
            return
        left = latest.opened_at + self._max_hold_s - self._clock()
        self.held += 1
        try:
            async with asyncio.timeout(left):
                await self._released.wait()
        except TimeoutError:
            pass
