"""The extender service: decides with the packing core's decision state, acts through the
cluster interface.

Owns the verbs' semantics independent of HTTP (filter, prioritize, bind, preempt), the rule by
which prioritize reuses its pod's scheduling cycle (`extender.service.cycle` keeps the cycles),
and the `/status` document; the runtime they run in (following the cluster into a `DecisionState`,
swapping it whole on reconfiguration, the bind lock, warm-up, bounded shutdown) is
`extender.service.runtime`'s, and the answers' types and score scaling are
`extender.service.answers`'. Filter and prioritize are synchronous and do no I/O: they read the
state through the evaluator's caches, so kube-scheduler's serial loop pays little per node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from extender.metrics import LedgerSample
from extender.packing.ledger import Allocation
from extender.packing.parsing import ParsedPod, real_identity
from extender.packing.preempt import node_victims
from extender.packing.results import Demand
from extender.packing.state import DecisionState
from extender.service.answers import FilterOutcome, Victims, normalise, scale
from extender.service.cycle import Cycle
from extender.service.runtime import ServiceRuntime
from extender.service.status import (
    STATUS_BATCH,
    Health,
    api_requests,
    sample_metrics,
    status_document,
    stream_status,
)


class ExtenderService(ServiceRuntime):
    """One extender instance over one cluster. Call `start()` inside the event loop before
    serving and `close()` when done."""

    # -- filter and prioritize ---------------------------------------------------------------

    def filter(self, pod: object, node_names: Sequence[str]) -> FilterOutcome:
        """Which of `node_names` can take the pod now, with the pod's scheduling cycle (see
        `extender.service.cycle`). Raises NotReady before `start()`."""
        state = self._check_ready()
        parsed = state.parser.parse(pod)
        ev = state.evaluator
        ev.refresh()
        if parsed.demand is None:
            reason = parsed.error or "invalid request"
            outcome = FilterOutcome([], {}, dict.fromkeys(node_names, reason))
            self._remember(parsed, outcome)
            return outcome
        demand = parsed.demand
        sweep = ev.sweep(demand, node_names)
        passed, scores = sweep.passed, sweep.scores
        if sweep.unknown and demand.request.kind == "none":
            # A pod that asks for no GPU may go anywhere, GPU-less nodes included.
            passed.extend(sweep.unknown)
            scores = (*scores, *[ev.evaluate_no_gpu(demand)] * len(sweep.unknown))
        else:
            for name in sweep.unknown:
                sweep.unresolvable[name] = state.unknown_reason(name)
        key = parsed.key
        cycle = None
        if key is not None and real_identity(parsed.namespace, parsed.name, *key):
            # Only identities a real pod can have: the registry keeps what it is given.
            cycle = Cycle(key, state, ev.epoch, passed, scores)
            self.cycles.keep(cycle)
        self.warmer.asked(parsed.uid, node_names)  # the warmer of `state`, in force
        outcome = FilterOutcome(passed, sweep.failed, sweep.unresolvable, cycle)
        self._remember(parsed, outcome)
        return outcome

    def _remember(self, parsed: ParsedPod, outcome: FilterOutcome) -> None:
        """Keep the answer's reasons for `/status/why` (the dicts as they are: no copy)."""
        if parsed.uid:
            self.why.remember(
                parsed.namespace,
                parsed.name,
                parsed.uid,
                len(outcome.passed),
                outcome.failed,
                outcome.unresolvable,
            )

    def scores(self, pod: object, node_names: Sequence[str]) -> tuple[int, ...]:
        """The prioritize verb as a column: the 0..10 score of each of `node_names`, in order
        (`extender.service.answers` normalises them).
        The pod's cycle gives them where it holds for this request: the request is the one its
        filter answered (the same pod version, the same decision state, the same names, by
        value) and none of those nodes has changed since (binds of other pods land in between,
        on other nodes, and a raw score depends on its own node only). Otherwise they are
        computed afresh."""
        state = self._check_ready()
        parsed = state.parser.parse(pod)
        if parsed.demand is None:
            return (0,) * len(node_names)
        cycle = self.cycles.find(parsed.uid) if parsed.uid else None
        # The touch log says what changed without the evaluator's refresh: the nodes a bind
        # changed since the filter are refreshed by the next call that reads them.
        if cycle is not None and self._holds(cycle, state, parsed.key, node_names):
            return self._scaled(cycle)
        state.evaluator.refresh()
        raw = self._raw_scores(state, parsed.demand, node_names)
        return tuple(normalise(raw, native=self.accelerators.native_writer))

    def _scaled(self, cycle: Cycle) -> tuple[int, ...]:
        scaled = cycle.scaled
        if scaled is None:
            scaled = cycle.scaled = scale(cycle.scores, native=self.accelerators.native_writer)
        return scaled

    @staticmethod
    def _holds(
        cycle: Cycle, state: DecisionState, key: tuple[str, str] | None, names: Sequence[str]
    ) -> bool:
        """`cycle`'s scores are the answer for pod version `key` and `names` in `state`."""
        if cycle.key != key or cycle.state is not state or cycle.passed != names:
            return False
        touched = state.evaluator.touched_since(cycle.epoch)  # None: all may have changed
        return touched is not None and touched.isdisjoint(cycle.passed)

    def moved_on(self) -> None:
        """kube-scheduler went on from its filter call (prioritize was answered, or a bind
        came): the warmer may compute the call it forecasts next."""
        following = self._following
        if following is not None:
            following.warmer.wake()

    @staticmethod
    def _raw_scores(
        state: DecisionState, demand: Demand, node_names: Sequence[str]
    ) -> list[float | None]:
        ev = state.evaluator
        sweep = ev.sweep(demand, node_names)
        by_name: dict[str, float] = dict(zip(sweep.passed, sweep.scores, strict=True))
        if sweep.unknown and demand.request.kind == "none":
            by_name.update(dict.fromkeys(sweep.unknown, ev.evaluate_no_gpu(demand)))
        return [by_name.get(name) for name in node_names]

    # -- bind -------------------------------------------------------------------------------

    async def bind(self, *, name: str, namespace: str, uid: str, node: str) -> Allocation | None:
        """Re-check the fit under the lock, reserve, and create the Binding with the allocation
        annotations (see `extender.service.binding`). Returns the allocation (None for a pod
        that asks for no GPU). Raises BindError; a failed bind releases its reservation."""
        self._check_ready()
        self.cycles.end(uid)
        self.moved_on()
        return await self.binder.bind(name=name, namespace=namespace, uid=uid, node=node)

    # -- preempt ----------------------------------------------------------------------------

    def preempt(self, pod: object, victims: Mapping[str, Victims]) -> dict[str, Victims]:
        """Per candidate node, the victims (drawn from the scheduler's proposal) whose eviction
        frees room for the pod on one GPU; nodes where nothing works are left out. See
        `extender.packing.preempt.node_victims` for the rule."""
        state = self._check_ready()
        parsed = state.parser.parse(pod)
        if parsed.demand is None:
            return {}
        out: dict[str, Victims] = {}
        for node, proposal in victims.items():
            # A uid the cluster shows on another node is not this node's to evict.
            uids = [u for u in proposal.uids if state.may_be_on(u, node)]
            chosen = node_victims(
                state.ledger,
                node,
                parsed.demand.request,
                uids,
                state.settings.budgets,
                extra=self.preempt_extra_victims,
            )
            if chosen is not None:
                out[node] = Victims(chosen, min(proposal.pdb_violations, len(chosen)))
        return out

    # -- status -----------------------------------------------------------------------------

    def _config_section(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy.name,
            "source": self.config_source,
            "error": self._config_error,
        }

    def status(self, *, node: str | None = None) -> dict[str, Any]:
        """The `/status` document; the schema is on `extender.service.status.status_document`.
        Blocks the loop for O(nodes) (0.3 s at 5,000 nodes): servers use `status_stream`."""
        state = self.state
        return status_document(
            state.ledger,
            states=state.node_states(),
            frag=state.frag,
            config=self._config_section(),
            node=node,
            refused=state.refused,
        )

    async def status_stream(
        self, *, node: str | None = None, batch: int = STATUS_BATCH
    ) -> AsyncIterator[bytes]:
        """The `/status` document as JSON, in pieces, yielding to the loop every `batch` nodes
        so that filter calls never wait behind a large cluster's status. The pieces concatenate
        to what `status()` returns (nodes added or removed meanwhile may be missed)."""
        state = self.state
        async for piece in stream_status(
            state.ledger,
            state.evaluator,
            state.frag,
            config=self._config_section(),
            node=node,
            batch=batch,
            refused=state.refused,
        ):
            yield piece

    async def metrics_sample(self, *, batch: int = STATUS_BATCH) -> LedgerSample:
        """The ledger gauges for one scrape, built `batch` nodes at a time between requests."""
        health = Health(
            config_ok=self._config_error is None,
            leading=self.leadership.is_leader(),
            ready=self.ready,
            notices=dict(self.notices),
            watch_restarts=self.watch_restarts,
            api_requests=api_requests(self.cluster),
            events_dropped=self.events.dropped,
            forecast_results=self.forecast_results,
            call_results=self.call_results,
        )
        following = self._following
        if following is None:
            return health.without_ledger()
        state = following.state
        return await sample_metrics(
            state.ledger, state.evaluator, state.frag, health=health, batch=batch
        )
