"""`LargeBodyGate`: large request bodies take turns, and at most a set share of the event loop
while other requests are being served (truth rule 6 of docs/design.md: one large body cannot stall
the loop for others).

Owns the admission of large bodies. Decoding JSON holds the GIL (for tens of milliseconds at
the largest bodies), so a thread would not help: the only fair thing is to schedule the
large ones. A body over the threshold (by its Content-Length, before a byte of it is read, so
that waiting bodies stay in the kernel's buffers, not in ours) waits for its turn, one at a
time in arrival order. After a large request whose work took t seconds of loop time, the next
one waits t·(1−share)/share, so that large bodies use at most `share` of the loop, unless the
loop has nothing else to do: the wait ends as soon as no other request has started for
`idle_s` (a scheduler running nodeCacheCapable=false, whose every body is large, is slowed by
that probe only). Requests under the threshold never wait here; each records only its start.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LargeBodyGate:
    """One large request at a time, paced to a share of the loop (module docstring)."""

    def __init__(
        self,
        *,
        threshold_bytes: int,
        share: float,
        idle_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.threshold_bytes = threshold_bytes
        self._share = share
        self._idle_s = idle_s
        self._clock = clock
        #: When the last request under the threshold started (its handler's `perf_counter`).
        self.last_other = 0.0
        self._busy = False
        self._waiting: deque[asyncio.Future[None]] = deque()
        #: The earliest start of the next large request while others are being served.
        self._next_at = 0.0

    async def acquire(self) -> None:
        """Wait for this large request's turn and pace; `release` must follow."""
        if self._busy:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._hand_over()  # the turn was ours already: pass it on
                elif turn in self._waiting:
                    self._waiting.remove(turn)
                raise
        self._busy = True
        try:
            await self._pace()
        except asyncio.CancelledError:
            self._hand_over()
            raise

    async def _pace(self) -> None:
        clock = self._clock
        now = clock()
        while now < self._next_at:
            # Sleep at least once: requests that arrived while the last large one held the
            # loop are only seen after it; then stop as soon as nobody else is being served.
            await asyncio.sleep(min(self._idle_s, self._next_at - now))
            now = clock()
            if now - self.last_other >= self._idle_s:
                return

    def release(self, work_s: float) -> None:
        """The large request is done; its work (decoding, deciding, encoding) took `work_s`."""
        self._next_at = self._clock() + work_s * (1.0 - self._share) / self._share
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return  # still busy: the turn passes to the waiter
        self._busy = False
