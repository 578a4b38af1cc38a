"""Prioritize's answer, prepared while kube-scheduler scores the nodes its own way.

Owns the one HostPriorityList made ahead of its request. kube-scheduler calls /prioritize with
the nodes /filter just passed, after its own PreScore and Score plugins have run over them
(kube-scheduler's extender protocol): a gap in which the extender's loop has nothing to do.
Scaling the filter's scores and encoding the answer is nearly all of a prioritize call's work
(in Python nearly all of its CPU, in the realistic bench; the compiled build does both in C,
`native.SCALE` and `_wire.c`); done in that gap, the call finds
its answer written. The fast path starts it once no bind is in flight
(`FastVerbs.after_answer`): the previous pod's bind, whose API answer comes in during the
filter, answers first.

The prepared bytes are handed out only for the very objects they were made from: the node list
the decoder hands back when prioritize's NodeNames are the filter's answer byte for byte, and
the score tuple the service hands back while none of those nodes has changed
(`ExtenderService.scores`). Anything else (a bind that changed a candidate, another extender
that filtered after this one, a different pod) is encoded afresh, so a prepared answer is never
a stale one.

Preparing is wasted work where no prioritize follows: with one node passed (kube-scheduler then
skips scoring), or where the scheduler's configuration has no prioritizeVerb. So an answer is
prepared for two nodes or more, and only while prioritize calls come: once a prepared answer
goes unused, none is prepared again until the next prioritize call. The same expectation opens
the service's `SchedulingCycle` (background work waits while it is open); prioritize's answer,
or a filter after which none is expected, closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from extender.http.wire import host_priorities
from extender.service import ExtenderService, NotReady
from extender.service.cycle import SchedulingCycle


class PreparedPriorities:
    """The HostPriorityList prepared for the last filter's passed nodes, if any."""

    __slots__ = (
        "_ahead", "_body", "_cycle", "_names", "_native", "_round", "_scores", "_wanted", "prepared"
    )  # fmt: skip

    def __init__(
        self, cycle: SchedulingCycle | None = None, *, native: bool = True, ahead: bool = True
    ) -> None:
        #: kube-scheduler's filter→prioritize cycle: open while a prioritize call is expected.
        self._cycle = cycle
        #: The compiled build's C writer may write the answer (`wire.host_priorities`).
        self._native = native
        #: Prepare answers ahead at all (`accelerators.preparedPriorities`).
        self._ahead = ahead
        #: Answers prepared ahead (a counter).
        self.prepared = 0
        self._names: Sequence[str] | None = None
        self._scores: tuple[int, ...] | None = None
        self._body = b""
        #: Bumped by every filter and prioritize: a preparation made for an earlier round (run
        #: late, after the prioritize it was for) is not made.
        self._round = 0
        #: Whether prioritize calls come (no prepared answer has gone unused since the last).
        self._wanted = True

    def after_filter(
        self, service: ExtenderService, pod: object, passed: list[str]
    ) -> Callable[[], None] | None:
        """The work to run once filter's answer for `pod` is written: prepare prioritize's
        answer for `passed`. None when no prioritize call is expected to use it."""
        if self._names is not None:
            self._wanted = False  # the last one was not asked for
        self._names = self._scores = None
        self._round += 1
        cycle = self._cycle
        if not self._wanted or len(passed) < 2:
            if cycle is not None:
                cycle.end()
            return None
        if cycle is not None:
            cycle.begin()
        if not self._ahead:
            return None
        made_for = self._round
        return lambda: self._prepare(service, pod, passed, made_for)

    def _prepare(
        self, service: ExtenderService, pod: object, passed: list[str], made_for: int
    ) -> None:
        if made_for != self._round:
            return  # its prioritize (or the next filter) came first
        try:
            scores = service.scores(pod, passed)
        except NotReady:
            return  # prioritize will answer the same, then
        body = host_priorities(passed, scores, native=self._native)
        self._names, self._scores, self._body = passed, scores, body
        self.prepared += 1

    def answer(self, names: Sequence[str], scores: tuple[int, ...]) -> bytes:
        """Prioritize's HostPriorityList for `names` and `scores`: the prepared one when these
        are the objects it was prepared from, else encoded now."""
        prepared = names is self._names and scores is self._scores
        body = self._body
        self._names = self._scores = None
        self._body = b""
        self._round += 1
        self._wanted = True
        if self._cycle is not None:
            self._cycle.end()
        return body if prepared else host_priorities(names, scores, native=self._native)
