"""Warming the result caches for pods the cluster shows pending, before the scheduler asks.

Owns the warm-up queue. A pod kube-scheduler will ask about is visible in the cluster (pending,
unbound) before its first /filter call; computing its shape's fit and score on every node ahead
of time turns that call, and every later one for the same shape, into array reads. At startup
the service drains the queue before it reports ready (a new leader starts warm); afterwards new
shapes are warmed in small chunks between requests, so a chunk never delays a request by more
than a fraction of a millisecond per node in it.

Once the scheduler moves on from a filter call (its prioritize answered, or a bind), the warmer
also computes the filter call it forecasts next (`extender.service.forecast`): the oldest pending
pod not asked about yet, on the window of nodes after the last one. Only results unknown so far
cost anything (nodes that took a pod since that shape was last computed on them: a small
part of a window in the realistic bench); computed between the scheduler's calls, they are array
reads when the call comes. A forecast that misses leaves results cached for later calls. With
`accelerators.forecast` off nothing is forecast; the pending shapes are still warmed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Final

from extender.packing.evaluate import Evaluator
from extender.packing.results import Demand
from extender.service.forecast import NodeOrder

log = logging.getLogger(__name__)

#: Nodes computed between two yields to the event loop: a cold result is costly (mostly the
#: policy's score), so a chunk is kept small to bound how long a request waits behind it.
CHUNK: Final = 8
#: Results computed for a forecast call between two yields to the loop: few, so that a request
#: that comes meanwhile waits only briefly. Most forecast nodes have their result already
#: (only those that took a pod since cost a computation) and are passed over in the same turn.
PER_TURN: Final = 4
#: Filter windows kept for the order until a forecast learns them.
MAX_WINDOWS: Final = 4
#: Signatures remembered as warmed before the memory is reset.
MAX_DONE: Final = 4096
#: Pending pods remembered (to warm again after a policy change) before the oldest are dropped.
MAX_PENDING: Final = 50_000


class Warmer:
    """A queue of request shapes to compute on every node, most frequent first."""

    def __init__(self, evaluator: Evaluator, *, forecast: bool = True) -> None:
        self._evaluator = evaluator
        #: Off (`accelerators.forecast: false`): no call is forecast; pending shapes are still
        #: warmed on every node.
        self._forecast = forecast
        self._counts: Counter[Hashable] = Counter()
        self._demands: dict[Hashable, Demand] = {}
        self._done: set[Hashable] = set()
        self._pending: dict[str, Demand] = {}
        #: Pending pods not asked about yet, in the order the cluster showed them: the scheduler's
        #: queue as far as this replica can see it.
        self._unasked: dict[str, None] = {}
        self._order = NodeOrder()
        #: The windows of the filter calls since the last forecast, oldest first (more than
        #: one where a pod fit nowhere, and the scheduler went on to the next without a call
        #: that wakes the forecast).
        self._windows: list[Sequence[str]] = []
        #: The scheduler moved on from the last window's call: its forecast may be computed.
        self._due = False
        self._wake = asyncio.Event()
        self.computed = 0
        #: Results computed ahead for forecast calls.
        self.prefetched = 0

    def note(self, uid: str, demand: Demand) -> None:
        """Pod `uid` of this shape is pending."""
        if uid not in self._pending:
            if len(self._pending) >= MAX_PENDING:
                self.forget(next(iter(self._pending)))
            self._unasked[uid] = None
        self._pending[uid] = demand
        self._queue(demand)

    def forget(self, uid: str) -> None:
        """Pod `uid` is bound or gone."""
        self._pending.pop(uid, None)
        self._unasked.pop(uid, None)

    def asked(self, uid: str, window: Sequence[str]) -> None:
        """The scheduler asked filter about pod `uid` on these nodes, in this order (the list is
        not changed afterwards). Nothing is computed yet: see `wake`."""
        self._unasked.pop(uid, None)
        if not self._forecast:
            return
        self._due = False  # this call's own prioritize or bind has not come yet
        windows = self._windows
        if len(windows) >= MAX_WINDOWS:
            del windows[0]
        windows.append(window)

    def wake(self) -> None:
        """The scheduler moved on from a filter call (prioritize answered, or a bind came):
        compute the call forecast next. Not at the filter call itself, whose prioritize call is
        still to come. A bind is usually the previous pod's, which kube-scheduler sends
        just before the next filter call: the forecast may then start while that call's
        prioritize is still to come, and a request waits at most one turn of it. (Waking on
        the last pod's own bind only was tried too: binds were answered later, and filter
        with prioritize no sooner.)"""
        if self._windows:
            self._due = True
            self._wake.set()

    def forecast(self) -> tuple[Demand, list[str]] | None:
        """The next filter call as the orders learned so far predict it: the oldest pending pod
        not asked about yet, on the nodes after the last window. Learns the windows asked about
        since the last forecast first."""
        windows = self._windows
        if not windows:
            return None
        self._windows = []
        self._due = False
        for window in windows:
            self._order.observe(window)
        uid = next(iter(self._unasked), None)
        if uid is None:
            return None
        return self._pending[uid], self._order.following(len(windows[-1]))

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
                if self._due:
                    # The call the scheduler makes next comes before shapes it may ask later.
                    await self.prefetch()
            if len(self._done) >= MAX_DONE:
                self._done.clear()
            self._done.add(sig)
            if deadline is not None and time.monotonic() > deadline:
                log.info("warm-up budget spent; %d shapes left for later", len(self._demands))
                return

    async def prefetch(self) -> None:
        """Compute the forecast call's results, yielding to the loop every PER_TURN results;
        give up on it when a newer call comes (its own forecast comes once it is moved on from)."""
        if not self._due:
            return
        # One turn first: the work of the call that woke it (a bind's Binding) goes ahead.
        await asyncio.sleep(0)
        if not self._due:
            return  # a filter call came in that turn
        forecast = self.forecast()
        if forecast is None:
            return
        demand, names = forecast
        at = 0
        while at < len(names) and not self._windows:
            done, at = self._evaluator.warm_from(demand, names, at, PER_TURN)
            self.prefetched += done
            await asyncio.sleep(0)

    async def run(self) -> None:
        """Warm forecast calls and new shapes as they come, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.prefetch()
            await self.drain()
