"""Prioritize's answer on the wire, and the one prepared ahead while kube-scheduler scores the
nodes its own way.

Owns the encoding of prioritize's HostPriorityList and its preparation. kube-scheduler calls
/prioritize with the nodes /filter just passed, after its own PreScore and Score plugins have
run over them (kube-scheduler's extender protocol): a gap in which the extender's loop has
nothing to do. Scaling the filter's scores and encoding the answer is nearly all of a
prioritize call's work; done in that gap, the call finds its answer written. The fast path
starts it once no bind is in flight (`FastVerbs.after_answer`): the previous pod's bind, whose
API answer comes in during the filter, answers first.

The prepared bytes live on the pod's scheduling cycle (`extender.service.cycle`) with the scores
they encode, and the service hands them back only where that cycle holds for the prioritize
request (`ExtenderService.rank`): anything else (a bind that changed a candidate, other names,
another version of the pod) is encoded afresh, so a prepared answer is never a stale one.

An answer is prepared only where the cycle expects its prioritize call (two nodes passed or
more, and prioritize calls come: the registry's rule), and only while that call has not come.
With `accelerators.preparedPriorities` off nothing is prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from extender.http.wire import host_priorities
from extender.service import ExtenderService, Ranking
from extender.service.cycle import Cycle


class Priorities:
    """Prioritize's answers: encoded, or prepared ahead for a pod's cycle."""

    __slots__ = ("_ahead", "_native", "prepared")

    def __init__(self, *, native: bool = True, ahead: bool = True) -> None:
        #: The compiled build's C writer may write the answer (`wire.host_priorities`).
        self._native = native
        #: Prepare answers ahead at all (`accelerators.preparedPriorities`).
        self._ahead = ahead
        #: Answers prepared ahead (a counter).
        self.prepared = 0

    def after_filter(self, service: ExtenderService, cycle: Cycle) -> Callable[[], None] | None:
        """The work to run once filter's answer for `cycle` is written: prepare prioritize's
        answer for its passed nodes. None when no prioritize call is expected to use it."""
        if not self._ahead or not cycle.awaiting:
            return None
        return lambda: self._prepare(service, cycle)

    def _prepare(self, service: ExtenderService, cycle: Cycle) -> None:
        if not cycle.awaiting:
            return  # its prioritize (or the next filter, or its bind) came first
        scores = service.cycle_scores(cycle)
        if scores is None:
            return  # the cycle no longer holds: prioritize will compute afresh
        cycle.keep_prepared(scores, host_priorities(cycle.passed, scores, native=self._native))
        self.prepared += 1

    def answer(self, names: Sequence[str], ranking: Ranking) -> bytes:
        """Prioritize's HostPriorityList for `names`: the prepared one the service handed back
        with `ranking`, else encoded now."""
        return ranking.prepared or host_priorities(names, ranking.scores, native=self._native)
