"""A replay in time: pods arrive, run for their lifetime and leave, on a fixed set of nodes,
placed by the replay engine (the packing core's fit and ledger, a policy's score: what `serve`
decides) after the strategy has rewritten their requests.

The queue, as kube-scheduler's (one scheduling profile, default PrioritySort: every pod here
has the same priority, so the order is arrival time, then name):

- a pod is tried when it arrives; if no node takes it, it waits (the unschedulable queue);
- when pods leave, every waiting pod is tried again once, oldest first, right after all the
  departures of that instant and before the arrivals of that instant; a pod that still does not
  fit does not hold back the younger ones behind it;
- nothing else makes room, so a waiting pod is tried at no other time (kube-scheduler's backoff
  and periodic flush retry it too, but with nothing freed the answer would not change).

A pod waits from its arrival to its placement, then runs its full lifetime. Two pods of one
instant: departures first, then retries, then arrivals in (arrival, name) order.

Measured, besides the waits: GPU demand placed (the shares the pods asked for, as the trace
states them, in GPUs, whatever a strategy rounded them up to), GPUs busy (GPUs holding any
pod), pods waiting, and optionally fragmentation (FGD's measure of the trace's typical pods,
in GPUs). Over time they are kept as the largest value in each of `buckets` equal slices of the
arrivals' span, so that a peak is never averaged away (the last slice also holds what follows).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from extender.packing.policies import WHOLE, Policy
from extender.packing.policies.frag import Fragmentation
from extender.packing.settings import BudgetSettings
from extender.simulate.engine import Engine
from extender.simulate.strategy import Strategy
from extender.simulate.timed import TimedPod
from extender.simulate.types import SimNode, SimPod


@dataclass(slots=True)
class Curves:
    """Per slice of the span [0, end): the largest value seen in it."""

    end: float
    waiting: list[int]
    demand_gpus: list[float]
    busy_gpus: list[int]
    frag_gpus: list[float]
    #: The last slice written, and the values after the last event (slices without an event
    #: hold those).
    _last: int = -1
    _then: tuple[int, float, int, float] = (0, 0.0, 0, 0.0)

    def record(self, now: float, state: _Totals) -> None:
        b = min(len(self.waiting) - 1, int(now / self.end * len(self.waiting)))
        for gap in range(self._last + 1, b):
            self._put(gap, self._then)
        self._last = b
        self._then = (state.waiting, state.demand / WHOLE, state.busy, state.frag / WHOLE)
        self._put(b, self._then)

    def _put(self, b: int, values: tuple[int, float, int, float]) -> None:
        self.waiting[b] = max(self.waiting[b], values[0])
        self.demand_gpus[b] = max(self.demand_gpus[b], values[1])
        self.busy_gpus[b] = max(self.busy_gpus[b], values[2])
        self.frag_gpus[b] = max(self.frag_gpus[b], values[3])

    def close(self) -> None:
        """Slices after the last event hold its values."""
        for gap in range(self._last + 1, len(self.waiting)):
            self._put(gap, self._then)


@dataclass(frozen=True, slots=True)
class Summary:
    """One replay's figures, as the plan report shows them (see `COLUMNS` in the plan report)."""

    nodes: int
    gpus: int
    placed: int
    never_placed: int
    #: Placed pods that waited at all; their waits' percentiles and longest (0 for none).
    waited: int
    wait_p50: float
    wait_p95: float
    wait_max: float
    peak_demand_gpus: float
    #: The peak of GPU booked: shares as the strategy rounds them (a share taken whole is 1).
    peak_booked_gpus: float
    peak_busy_gpus: int
    mean_demand_gpus: float
    mean_busy_gpus: float
    peak_waiting: int
    peak_frag_gpus: float | None
    seconds: float

    def summary(self) -> Summary:
        """These figures alone (an `Outcome`'s without its per-pod lists and curves)."""
        return Summary(**{f.name: getattr(self, f.name) for f in fields(Summary)})


@dataclass(frozen=True, slots=True)
class Outcome(Summary):
    """One replay: its figures, and what the search and the report read besides.
    `hosted`: every pod was placed, none waited longer than the bound."""

    hosted: bool
    #: The replay stopped at the first pod found waiting past the bound (the figures above
    #: then cover the replay up to there only).
    stopped_early: bool
    pods: int
    #: Seconds each placed pod waited (0 for most), in arrival order.
    waits: list[float]
    curves: Curves | None = None
    #: Where each pod ran (node index), for a what-if; -1 never placed.
    where: list[int] = field(default_factory=list)
    #: The pod (index into the workload) that waited longest when the replay ended: the one
    #: found past the bound, or the oldest never placed; None where none waited at the end.
    blocker: int | None = None


def replay(
    nodes: Sequence[SimNode],
    timed: Sequence[TimedPod],
    strategy: Strategy,
    policy: Policy,
    budgets: BudgetSettings,
    rank: Sequence[int],
    *,
    max_wait: float | None = None,
    fragmentation: Fragmentation | None = None,
    buckets: int = 0,
    progress: Callable[[float], None] | None = None,
) -> Outcome:
    """Replay `timed` (sorted by arrival) on `nodes`. With `max_wait`, stop as soon as a pod has
    waited longer (the search only needs to know that). `buckets` > 0 keeps curves; with
    `fragmentation`, fragmentation is measured too."""
    started = time.perf_counter()
    engine = Engine(nodes, policy, budgets, rank)
    asks: list[SimPod] = [strategy.transform(t.pod) for t in timed]
    demand = [t.pod.shape.gpu_demand for t in timed]
    booked = [a.shape.gpu_demand for a in asks]
    n = len(timed)
    # The curves span the arrivals (and a twentieth more): after the last one, pods only
    # leave, and a few months-long pods would squeeze the busy part into a sliver.
    span = 1.05 * max((t.arrival for t in timed), default=0.0) or 1.0
    curves = (
        Curves(span, [0] * buckets, [0.0] * buckets, [0] * buckets, [0.0] * buckets)
        if buckets
        else None
    )
    busy_on = [0] * len(nodes)
    frag_on = [fragmentation(engine.view(i)) for i in range(len(nodes))] if fragmentation else []
    state = _Totals(busy=0, demand=0, booked=0, frag=float(sum(frag_on)), waiting=0)
    waits = [0.0] * n
    where = [-1] * n
    departures: list[tuple[float, int, int]] = []
    waiting: list[int] = []
    last = 0.0
    area_demand = area_busy = 0.0
    stopped = False
    next_arrival = 0
    tick = max(1, n // 100)

    def touched(i: int) -> None:
        busy = sum(1 for g in engine.usage[i].gpus if not g.idle)
        state.busy += busy - busy_on[i]
        busy_on[i] = busy
        if fragmentation is not None:
            now = fragmentation(engine.view(i))
            state.frag += now - frag_on[i]
            frag_on[i] = now

    def attempt(k: int, now: float) -> bool:
        placed = engine.place(asks[k])
        if placed is None:
            return False
        where[k] = placed[0]
        waits[k] = now - timed[k].arrival
        state.demand += demand[k]
        state.booked += booked[k]
        touched(placed[0])
        heapq.heappush(departures, (now + timed[k].lifetime, k, placed[0]))
        return True

    while next_arrival < n or departures:
        arrival_at = timed[next_arrival].arrival if next_arrival < n else math.inf
        now = min(arrival_at, departures[0][0] if departures else math.inf)
        if max_wait is not None and waiting and now - timed[waiting[0]].arrival > max_wait:
            stopped = True
            break
        area_demand += state.demand * (now - last)
        area_busy += state.busy * (now - last)
        last = now
        if departures and departures[0][0] <= arrival_at:
            while departures and departures[0][0] == now:
                _, k, i = heapq.heappop(departures)
                engine.release(i, asks[k])
                state.demand -= demand[k]
                state.booked -= booked[k]
                touched(i)
            waiting = _retry(waiting, asks, now, attempt)
        else:
            k = next_arrival
            next_arrival += 1
            if not attempt(k, now):
                waiting.append(k)
            if progress is not None and next_arrival % tick == 0:
                progress(next_arrival / n)
        state.waiting = len(waiting)
        if curves is not None:
            curves.record(now, state)
        state.peaks()
    if curves is not None:
        curves.close()
    never = len(waiting) + (n - next_arrival if stopped else 0)
    placed_waits = [waits[k] for k in range(n) if where[k] >= 0]
    gpus = sum(len(nd.inventory.gpus) for nd in nodes)
    return Outcome(
        hosted=not stopped and not waiting,
        stopped_early=stopped,
        pods=n,
        placed=len(placed_waits),
        never_placed=never,
        waits=placed_waits,
        waited=sum(1 for w in placed_waits if w > 0),
        wait_p50=percentile(placed_waits, 50),
        wait_p95=percentile(placed_waits, 95),
        wait_max=max(placed_waits, default=0.0),
        peak_demand_gpus=state.peak_demand / WHOLE,
        peak_booked_gpus=state.peak_booked / WHOLE,
        peak_busy_gpus=state.peak_busy,
        mean_demand_gpus=area_demand / last / WHOLE if last else 0.0,
        mean_busy_gpus=area_busy / last if last else 0.0,
        peak_waiting=state.peak_waiting,
        peak_frag_gpus=state.peak_frag / WHOLE if fragmentation is not None else None,
        gpus=gpus,
        nodes=len(nodes),
        seconds=time.perf_counter() - started,
        curves=curves,
        where=where,
        blocker=waiting[0] if waiting else None,
    )


def _retry(
    waiting: list[int], asks: Sequence[SimPod], now: float, attempt: Callable[[int, float], bool]
) -> list[int]:
    """Try every waiting pod once, oldest first; the ones left, in order. Within one round
    room only shrinks, so a pod the same as one that did not fit (same shape, memory and
    request) is not tried again."""
    left: list[int] = []
    failed: set[object] = set()
    for k in waiting:
        pod = asks[k]
        key = (pod.shape, pod.memory_mib, pod.request.kind, pod.request.containers)
        if key in failed or not attempt(k, now):
            failed.add(key)
            left.append(k)
    return left


@dataclass(slots=True)
class _Totals:
    busy: int
    demand: int
    booked: int
    frag: float
    waiting: int
    peak_busy: int = 0
    peak_demand: int = 0
    peak_booked: int = 0
    peak_frag: float = 0.0
    peak_waiting: int = 0

    def peaks(self) -> None:
        self.peak_busy = max(self.peak_busy, self.busy)
        self.peak_demand = max(self.peak_demand, self.demand)
        self.peak_booked = max(self.peak_booked, self.booked)
        self.peak_frag = max(self.peak_frag, self.frag)
        self.peak_waiting = max(self.peak_waiting, self.waiting)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank rule; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
