"""Forecasting kube-scheduler's next filter call: the pending pod it takes next and the window of
candidate nodes it sends with it, so that the warmer can compute that call's results in the idle
time before it arrives.

Owns the two orders the forecast rests on, both learned from what the scheduler and the cluster
show, never configured:
  - the queue: pending pods in the order the cluster showed them, less those already asked
    about. kube-scheduler's active queue pops by priority, then by the time the pod was queued
    (PrioritySort), so among pods of one priority the oldest goes first;
  - the node order: at 5,000 nodes kube-scheduler sends a window of ~500 feasible nodes
    (numFeasibleNodesToFind) that starts where the previous cycle's search
    stopped (findNodesThatPassFilters' nextStartNodeIndex) and runs along its node tree, zones
    interleaved, as scripts/extender_bench/kube_scheduler.py copies it. Consecutive names in a
    window, and the last name of one window with the first of the next, are neighbours in
    that order; the next window is the walk onward from the last name asked about.

A wrong forecast costs idle CPU only: a result computed for a pod or a node that is not asked
about next stays cached for when it is (or is evicted like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Final

#: Node names the learned order keeps before it starts again: a few times the largest cluster
#: (names that are not nodes, in hand-made requests, must not grow it without bound).
MAX_ORDER_NAMES: Final = 200_000
#: Windows after which the order is learned afresh: names of removed nodes, which every window
#: skips like a gap, leave it then.
RELEARN_EVERY: Final = 1024
#: Links followed to tell a window that shows a node between two linked names (the link jumped
#: over it: corrected) from one that skips nodes (a pod's window with gaps: kept).
REFINE_STEPS: Final = 8
#: Links of a window kept against it before the rest of it only adds links for new names.
MAX_KEPT: Final = 16


class NodeOrder:
    """kube-scheduler's node order, as consecutive windows show it: each name's successor.

    A window that starts where the order says the last one stopped and spans as many links of
    it as it has names teaches nothing new: a few lookups (the steady state: nodes come and go
    rarely). Any other window is judged link by link. A pod with a nodeSelector gets a window
    with gaps, whose links skip nodes; a window that shows a node between two names the order
    links (a node added, or a link first learned from a window with gaps) corrects the order.
    The two are told apart by following the order from the window's successor: where it leads
    to the order's successor within REFINE_STEPS links, the order jumped over it and takes the
    window's link; where it does not, the window skips nodes and the order keeps its own. A
    node removed looks like a gap in every window; it leaves the order when the order is learned
    afresh, every RELEARN_EVERY windows. Names are kept as one object each, so that walking the
    order compares identities, not strings."""

    def __init__(self, *, max_names: int = MAX_ORDER_NAMES) -> None:
        self._max_names = max_names
        self._next: dict[str, str] = {}
        #: The one object kept for each name, successors and keys alike.
        self._names: dict[str, str] = {}
        #: The last name of the last window observed: where the next window starts after.
        self._last: str | None = None
        self._observed = 0
        #: The order unrolled into a list, with each name's index; None once a link is added.
        self._walk: tuple[list[str], dict[str, int]] | None = None

    def __len__(self) -> int:
        """Names whose successor is known."""
        return len(self._next)

    def observe(self, window: Sequence[str]) -> None:
        """A window the scheduler sent, in its order."""
        if not window:
            return
        follows, names = self._next, self._names
        self._observed += 1
        if self._observed % RELEARN_EVERY == 0 or len(names) + len(window) > self._max_names:
            follows.clear()
            names.clear()
            self._walk = None
        previous = self._last
        first, last = names.get(window[0]), names.get(window[-1])
        if (
            first is not None
            and last is not None
            and previous is not None
            and follows.get(previous) is first
            and self._span(first, last) == len(window) - 1
        ):
            self._last = last
            return
        canon = [names.setdefault(name, name) for name in window]
        pairs = list(pairwise(canon))
        if previous is not None and previous is not canon[0]:
            pairs.insert(0, (previous, canon[0]))
        changed = False
        kept = 0
        # From the window's end back: a name's successor from this window is in place when
        # the link into it is judged.
        for a, b in reversed(pairs):
            known = follows.get(a)
            if known is b:
                continue
            if known is None or (kept < MAX_KEPT and self._reaches(b, known)):
                follows[a] = b
                changed = True
            else:
                kept += 1
        if changed:
            self._walk = None
        self._last = canon[-1]

    def _reaches(self, start: str, target: str) -> bool:
        """Whether the order leads from `start` to `target` within REFINE_STEPS links: the link
        to `target` then jumps over `start`, which a window has just shown between them."""
        follows = self._next
        name = start
        for _ in range(REFINE_STEPS):
            after = follows.get(name)
            if after is None:
                return False
            if after is target:
                return True
            name = after
        return False

    def _span(self, first: str, last: str) -> int:
        """Links from `first` to `last` along the order, or -1 where the order does not lead
        from one to the other."""
        walk = self._walk
        if walk is None:
            walk = self._walk = self._unroll(first)
        order, index = walk
        i, j = index.get(first), index.get(last)
        if i is None or j is None:
            return -1
        if j >= i:
            return j - i
        # Past the end of the walk: only where it closes into a ring.
        return j - i + len(order) if self._next.get(order[-1]) is order[0] else -1

    def following(self, count: int) -> list[str]:
        """The `count` names after the last window observed, as far as the order is known (a
        walk that comes back to a name it passed stops there)."""
        last = self._last
        after = self._next.get(last) if last is not None else None
        if after is None:
            return []
        walk = self._walk
        if walk is None:
            walk = self._walk = self._unroll(after)
        order, index = walk
        follows = self._next
        out: list[str] = []
        name: str | None = after
        # A window with gaps may leave names out of the walk: step through them to it.
        while name is not None and name not in index and len(out) < count:
            out.append(name)
            name = follows.get(name)
        if name is not None and len(out) < count:
            at = index[name]
            out += order[at : at + count - len(out)]
            back = index.get(follows.get(order[-1], ""))  # where the walk's end leads back to
            if len(out) < count and back is not None and back < at:
                out += order[back : min(at, back + count - len(out))]
        if last in out:
            del out[out.index(last) :]
        return out

    def _unroll(self, start: str) -> tuple[list[str], dict[str, int]]:
        """The order from `start` on, until it comes back to a name already in it or is not
        known further."""
        follows = self._next
        order = [start]
        index = {start: 0}
        name = follows.get(start)
        while name is not None and name not in index:
            index[name] = len(order)
            order.append(name)
            name = follows.get(name)
        return order, index
