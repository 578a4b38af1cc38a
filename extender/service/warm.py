"""Warming the result caches for pods the cluster shows pending, before the scheduler asks.

Owns the warm-up queue. A pod kube-scheduler will ask about is visible in the cluster (pending,
unbound) before its first /filter call; computing its shape's fit and score on every node ahead
of time turns that call, and every later one for the same shape, into array reads. At startup
the service drains the queue before it reports ready (a new leader starts warm); afterwards new
shapes are warmed in small chunks between requests, so a chunk never delays a request by more
than a fraction of a millisecond per node in it. A node that took a pod since a shape was warmed
has no result for it until a call (or a policy change's rewarm) computes one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Hashable
from typing import Final

from extender.packing.evaluate import Evaluator
from extender.packing.results import Demand

log = logging.getLogger(__name__)

#: Nodes computed between two yields to the event loop: a cold result is costly (mostly the
#: policy's score), so a chunk is kept small to bound how long a request waits behind it.
CHUNK: Final = 8
#: Signatures remembered as warmed before the memory is reset.
MAX_DONE: Final = 4096
#: Pending pods remembered (to warm again after a policy change) before the oldest are dropped.
MAX_PENDING: Final = 50_000


class Warmer:
    """A queue of request shapes to compute on every node, most frequent first."""

    def __init__(self, evaluator: Evaluator) -> None:
        self._evaluator = evaluator
        self._counts: Counter[Hashable] = Counter()
        self._demands: dict[Hashable, Demand] = {}
        self._done: set[Hashable] = set()
        self._pending: dict[str, Demand] = {}
        self._wake = asyncio.Event()
        self.computed = 0

    def note(self, uid: str, demand: Demand) -> None:
        """Pod `uid` of this shape is pending."""
        if uid not in self._pending and len(self._pending) >= MAX_PENDING:
            self.forget(next(iter(self._pending)))
        self._pending[uid] = demand
        self._queue(demand)

    def forget(self, uid: str) -> None:
        """Pod `uid` is bound or gone."""
        self._pending.pop(uid, None)

    def rewarm(self) -> None:
        """The caches were emptied (a new policy): warm the pending shapes again."""
        self._done.clear()
        for demand in self._pending.values():
            self._queue(demand)

    def _queue(self, demand: Demand) -> None:
        sig = demand.signature
        if sig in self._done:
            return
        self._counts[sig] += 1
        self._demands[sig] = demand
        self._wake.set()

    def queued(self) -> int:
        """Shapes waiting to be warmed."""
        return len(self._demands)

    def is_pending(self, uid: str) -> bool:
        """Whether pod `uid` is remembered as pending."""
        return uid in self._pending

    async def drain(self, *, budget_s: float | None = None, chunk: int = CHUNK) -> None:
        """Warm every queued shape (most pods first), yielding to the loop every `chunk` nodes;
        stop early once `budget_s` seconds have passed (the rest stays queued)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while self._demands:
            sig = max(self._demands, key=self._counts.__getitem__)
            demand = self._demands.pop(sig)
            self._counts.pop(sig, None)
            names = list(self._evaluator.state_ids())
            for i in range(0, len(names), chunk):
                self.computed += self._evaluator.warm(demand, names[i : i + chunk])
                await asyncio.sleep(0)
            if len(self._done) >= MAX_DONE:
                self._done.clear()
            self._done.add(sig)
            if deadline is not None and time.monotonic() > deadline:
                log.info("warm-up budget spent; %d shapes left for later", len(self._demands))
                return

    async def run(self) -> None:
        """Warm new shapes as they come, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.drain()
