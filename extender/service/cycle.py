"""The scheduling cycle kube-scheduler holds open with this extender, and the wait that lets
background work stay out of it.

kube-scheduler schedules one pod at a time: after /filter it runs its own Score plugins and
then calls /prioritize with the nodes the filter passed (kube-scheduler's extender protocol),
and only then goes on to the next pod. Everything the extender does between those two calls
delays the cluster's scheduling; what it does in the background does not have to happen there.
An Event about an earlier pod's bind is such work: best effort, read by people, and on a busy
extender it was sent in that very gap (the bind it reports answers while the next pod is being
filtered); so is applying the watch's echo of that bind, which the ledger counts already.
So the Event sender and the watch consumer wait until the cycle closes, with a bound: a cycle
that stays open longer than `max_hold_s` (a prioritize call that never comes) no longer holds
anything.

Open from a filter answer after which a prioritize call is expected (two nodes or more passed,
and prioritize calls come: `extender.http.priorities` decides) until that prioritize is
answered, or the next filter comes. With `accelerators.cycleDelay` off no cycle opens, and
nothing waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

#: Seconds a cycle may hold background work: kube-scheduler's Score phase for one pod takes
#: well under a millisecond; past this the prioritize call is taken not to be coming.
MAX_HOLD_S: Final = 0.005


class SchedulingCycle:
    """Whether a filter→prioritize cycle is open, and a wait for it to close."""

    def __init__(
        self,
        *,
        max_hold_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self._max_hold_s = MAX_HOLD_S if max_hold_s is None else max_hold_s
        self._clock = clock
        #: Off (`accelerators.cycleDelay: false`): no cycle ever opens, nothing waits.
        self._enabled = enabled
        #: Waits that found a cycle open and held background work (a counter).
        self.held = 0
        #: When the open cycle opened, or None.
        self._opened_at: float | None = None
        self._closed = asyncio.Event()
        self._closed.set()

    @property
    def open(self) -> bool:
        """A cycle is open and still holds background work (not past `max_hold_s`)."""
        at = self._opened_at
        return at is not None and self._clock() - at < self._max_hold_s

    def begin(self) -> None:
        """A filter was answered and its prioritize call is expected."""
        if not self._enabled:
            return
        self._opened_at = self._clock()
        self._closed.clear()

    def end(self) -> None:
        """The cycle's prioritize was answered (or the cycle ended otherwise)."""
        self._opened_at = None
        self._closed.set()

    async def wait_closed(self) -> None:
        """Return once no cycle holds background work: at once when none is open, else when
        it ends or outgrows `max_hold_s`, whichever comes first."""
        at = self._opened_at
        if at is None:
            return
        left = at + self._max_hold_s - self._clock()
        if left <= 0:
            return
        self.held += 1
        try:
            async with asyncio.timeout(left):
                await self._closed.wait()
        except TimeoutError:
            pass
