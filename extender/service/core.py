"""The extender service: decides with the packing core's decision state, acts through the
cluster interface.

Owns the runtime around the decisions: following the cluster into a `DecisionState`, swapping
that state whole on reconfiguration (truth rule 7 of docs/design.md), the one lock that serialises
check-and-reserve in bind, warm-up, bounded shutdown, and the verbs' semantics independent of
HTTP. Filter and prioritize are synchronous and do no I/O: they read the state through the
evaluator's caches, so kube-scheduler's serial loop pays microseconds per node. Leadership and
the configuration's health are inputs (a `Leadership`; `reconfigure` / `config_rejected`),
never flags set from outside.

Scores: the policy's raw score is mapped to kube-scheduler's 0..10 by min-max over the
candidate nodes of the call: the best node gets 10, the worst 0, the rest in proportion,
rounded; when all are equal every node gets 10 (no preference). Nodes that do not fit get 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Final, cast

from extender.cluster import AlwaysLeader, Cluster, EventStream, Leadership, Synced
from extender.config import Config
from extender.metrics import LedgerSample
from extender.packing.evaluate import Demand
from extender.packing.ledger import Allocation
from extender.packing.native import SCALE
from extender.packing.parsing import ParsedPod
from extender.packing.preempt import node_victims
from extender.packing.state import Applied, DecisionState, StateSettings
from extender.service.binding import Binder
from extender.service.cycle import SchedulingCycle
from extender.service.errors import NotReady
from extender.service.events import EventSink, NodeEvent, PodEvent
from extender.service.status import (
    STATUS_BATCH,
    Health,
    api_requests,
    sample_metrics,
    status_document,
    stream_status,
)
from extender.service.warm import Warmer
from extender.service.why import FilterReasons

log = logging.getLogger(__name__)

MAX_SCORE: Final = 10
#: Seconds `close()` waits for its tasks to finish after cancelling them.
CLOSE_TIMEOUT_S: Final = 5.0
#: The Warning Event's reason of each kind of notice (reality the ledger reported).
NOTICE_REASONS: Final = {
    "over_budget": "GpuOverBudget",
    "allocation_changed": "GpuAllocationChanged",
    "allocation_unreadable": "GpuAllocationUnreadable",
    "allocation_unplaced": "GpuAllocationUnplaced",
    "inventory_refused": "GpuInventoryRefused",
}


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """Filter's answer: nodes that pass (in input order) and the reason for each that does not.
    `unresolvable` nodes are ones no eviction can help (kube-scheduler skips them in
    preemption)."""

    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Victims:
    """The pods to evict from one node (uids) and kube-scheduler's PDB violation count."""

    uids: list[str]
    pdb_violations: int = 0


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """What a configuration change did: sections that only a restart applies are listed."""

    rebuilt: bool
    needs_restart: tuple[str, ...] = ()


@dataclass(slots=True)
class _LastFilter:
    key: tuple[str, str]
    state: DecisionState
    epoch: int
    passed: list[str]
    scores: Sequence[float]
    #: `scores` scaled to 0..MAX_SCORE, made by the first `scores()` call that reuses them and
    #: handed out again by the next: one object, so that the HTTP layer can tell the answer it
    #: prepared for these scores is still the answer (see `extender.http.priorities`).
    scaled: tuple[int, ...] | None = None


def normalise(raw: Sequence[float | None], *, native: bool = True) -> list[int]:
    """Raw policy scores → 0..MAX_SCORE by min-max, rounded half up; None (no fit) → 0.
    `native=False` scales in Python where the compiled build has the C scaling too."""
    if None not in raw:
        return list(_scale(cast(Sequence[float], raw), native=native))
    fits = [s is not None for s in raw]
    scaled = iter(_scale([s for s in raw if s is not None], native=native))
    return [next(scaled) if f else 0 for f in fits]


def _scale(raw: Sequence[float], *, native: bool = True) -> tuple[int, ...]:
    """`normalise` of scores that are all known: the hot path of /prioritize. The compiled
    build scales a tuple or list of floats in C (`native.SCALE`, the same arithmetic: ~8 us at
    500 scores against 62-126 us here, measured with a fresh tuple each call), else
    `scale_in_python`."""
    if native and SCALE is not None and raw and type(raw) in (tuple, list):
        scaled = SCALE(cast("tuple[float, ...]", raw), MAX_SCORE)
        if scaled is not None:
            return scaled
    return scale_in_python(raw)


def scale_in_python(raw: Sequence[float]) -> tuple[int, ...]:
    """`_scale` in Python: every score that the C scaling declines (not a float, not finite)."""
    if not raw:
        return ()
    lo, hi = min(raw), max(raw)
    span = hi - lo
    if not span > 0:
        return (MAX_SCORE,) * len(raw)
    # The fraction first: (s - lo) / span lies in [0, 1] for any finite scores, whereas
    # MAX_SCORE / span overflows when the scores are a denormal apart.
    # Policies give few distinct values (FGD: integers 0..100): map each distinct one once and
    # translate the list in C. Plain builtins: in a scheduler's loop the caches are cold
    # between calls, and there numpy's machinery cost more than it saved (measured).
    table = {s: int((s - lo) / span * MAX_SCORE + 0.5) for s in set(raw)}
    return tuple(map(table.__getitem__, raw))


def state_settings(config: Config) -> StateSettings:
    """The part of the configuration a decision state is built from."""
    return StateSettings(
        budgets=config.budgets, selection=config.node_selection(), policy=config.policy
    )


def _restart_sections(old: Config, new: Config) -> tuple[str, ...]:
    """Sections whose change takes effect only after a restart (listeners, election, and the
    API client's timeouts and the binder's settings, both fixed when they are made)."""
    pairs = {
        "server": (old.server, new.server),
        "tls": (old.tls, new.tls),
        "leaderElection": (old.leader_election, new.leader_election),
        "api": (old.api, new.api),
        "accelerators": (old.accelerators, new.accelerators),
    }
    return tuple(name for name, (a, b) in pairs.items() if a != b)


class _Following:
    """One decision state with the watch stream that keeps it current and its warm-up."""

    def __init__(self, state: DecisionState, stream: EventStream, *, forecast: bool) -> None:
        self.state = state
        self.stream = stream
        self.warmer = Warmer(state.evaluator, forecast=forecast)
        self.tasks: list[asyncio.Task[None]] = []


class ExtenderService:
    """One extender instance over one cluster. Call `start()` inside the event loop before
    serving and `close()` when done."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        config: Config,
        leadership: Leadership | None = None,
        config_source: str | None = None,
        workload_refresh_s: float = 60.0,
        warm_budget_s: float = 120.0,
        preempt_extra_victims: bool = True,
    ) -> None:
        self.cluster = cluster
        self.config = config
        #: The speed-ups in force: read at start only (a reload's change needs a restart).
        self.accelerators = config.accelerators
        self.config_source = config_source
        self.leadership: Leadership = leadership or AlwaysLeader()
        self.workload_refresh_s = workload_refresh_s
        #: Seconds start() may spend warming the caches for pending pods before it reports
        #: ready; what is left is warmed in the background.
        self.warm_budget_s = warm_budget_s
        #: Let /preempt also evict lower-priority GPU pods the scheduler did not propose. On by
        #: default: the scheduler's dry run cannot see GPU shares (they are ignoredByScheduler),
        #: so its proposal is sized for CPU and memory only and rarely frees a GPU; the extender
        #: may add victims as long as they are on that node (reference §2.7). Off: victims are
        #: drawn from its proposal only.
        self.preempt_extra_victims = preempt_extra_victims
        self._config_error: str | None = None
        self._ready_event = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last: _LastFilter | None = None
        self._following: _Following | None = None
        #: Counted for /metrics: notices by kind (over budget, allocation changed, ...).
        self.notices: dict[str, int] = {}
        #: Follow streams still open, and the restarts of those closed: /metrics counts both,
        #: so the counter never goes back when a reconfiguration replaces a stream, and a
        #: stream still listing (an unreachable API server at start) counts already.
        self._streams: set[EventStream] = set()
        self._closed_restarts = 0
        #: Results the warmers of retired decision states computed ahead (`forecast_results`),
        #: and those their calls computed themselves (`call_results`).
        self._retired_forecast_results = 0
        self._retired_call_results = 0
        #: Events about pods: queued, bounded, and sent by one task of their own.
        #: kube-scheduler's filter→prioritize cycle, which the HTTP layer opens and closes.
        self.cycle = SchedulingCycle(enabled=self.accelerators.cycle_delay)
        #: Every pod's latest filter answer, bounded, for `/status/why`.
        self.why = FilterReasons()
        self.events = EventSink(cluster, cycle=self.cycle)
        self.binder = Binder(
            cluster=cluster,
            decisions=self,
            deadline_s=config.api.bind_timeout_seconds,
            doubt_window_s=config.api.in_doubt_seconds,
            events=self.events if config.api.allocation_events else None,
        )

    @property
    def lock(self) -> asyncio.Lock:
        """The bind lock: check-and-reserve and the swap of the decision state run under it."""
        return self._lock

    @property
    def state(self) -> DecisionState:
        """The decision state in force (raises NotReady before the first one is built)."""
        following = self._following
        if following is None:
            raise NotReady("mpsched is starting: the ledger is not built from the cluster yet")
        return following.state

    @property
    def warmer(self) -> Warmer:
        """The warm-up queue of the state in force."""
        following = self._following
        if following is None:
            raise NotReady("mpsched is starting: the ledger is not built from the cluster yet")
        return following.warmer

    @property
    def ready(self) -> bool:
        return self._ready_event.is_set()

    @property
    def config_error(self) -> str | None:
        """Why the last configuration document was rejected (the previous one stays in force)."""
        return self._config_error

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the decision state from the cluster, then follow its changes."""
        following = await self._build(self.config, workload=None)
        started = time.monotonic()
        # Before ready only health probes compete for the loop: larger slices.
        await following.warmer.drain(budget_s=self.warm_budget_s, chunk=256)
        log.info(
            "caches warmed for pending pods in %.1f s (%d results)",
            time.monotonic() - started,
            following.warmer.computed,
        )
        self._install(following)
        self._ready_event.set()
        self._spawn(self._refresh_workload_forever())
        self._spawn(self.events.run())

    async def _build(self, config: Config, *, workload: Any) -> _Following:
        """A new decision state for `config`, built from the cluster's objects: follows the
        cluster until everything that existed has been delivered (its own watch)."""
        settings = state_settings(config)
        native = self.accelerators.native_fit
        state = (
            DecisionState(settings, native=native)
            if workload is None
            else DecisionState(settings, workload=workload, native=native)
        )
        stream = self.cluster.follow()
        self._streams.add(stream)
        following = _Following(state, stream, forecast=self.accelerators.forecast)
        iterator = aiter(stream)
        try:
            async for item in iterator:
                if isinstance(item, Synced):
                    break
                self._apply(following, item)
        except BaseException:
            self._close_stream(stream)
            raise
        if workload is None:
            learned = await asyncio.to_thread(state.learn_workload)
            state.use_workload(learned)
        state.evaluator.refresh()
        ledger = state.ledger
        log.info(
            "ledger built from %s: %d GPU nodes, %d allocations, %d pods",
            self.cluster.description,
            len(ledger),
            sum(1 for _ in ledger.allocations()),
            len(state.pods),
        )
        following.tasks.append(self._spawn(self._follow(following, iterator)))
        return following

    def _install(self, following: _Following) -> None:
        old = self._following
        self._following = following
        self._last = None
        following.tasks.append(self._spawn(following.warmer.run()))
        if old is not None:
            self._retire(old)

    def _retire(self, old: _Following) -> None:
        for task in old.tasks:
            task.cancel()
        self._close_stream(old.stream)
        self._retired_forecast_results += old.warmer.prefetched
        self._retired_call_results += old.state.evaluator.swept_results

    @property
    def forecast_results(self) -> int:
        """Results computed ahead for forecast filter calls since start, over every decision
        state this service has had (a counter: it never goes back)."""
        following = self._following
        current = following.warmer.prefetched if following is not None else 0
        return self._retired_forecast_results + current

    @property
    def call_results(self) -> int:
        """Results filter and prioritize calls computed themselves since start (none was known
        yet: the forecast missed, or could not know), over every decision state (a counter)."""
        following = self._following
        current = following.state.evaluator.swept_results if following is not None else 0
        return self._retired_call_results + current

    def _close_stream(self, stream: EventStream) -> None:
        stream.close()
        if stream in self._streams:
            self._streams.discard(stream)
            self._closed_restarts += stream.restarts

    @property
    def watch_restarts(self) -> int:
        """Times the follow streams started over since start (see `EventStream.restarts`)."""
        return self._closed_restarts + sum(s.restarts for s in self._streams)

    async def wait_ready(self) -> None:
        """Return once `start()` has built the ledger (for embedders: the demo, tests)."""
        await self._ready_event.wait()

    async def close(self) -> None:
        """Stop every task; bounded: a task that ignores cancellation is left behind after
        CLOSE_TIMEOUT_S rather than holding shutdown."""
        for stream in list(self._streams):
            self._close_stream(stream)
        tasks = [*self._tasks, *self.binder.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for task in pending:
                log.warning("task %s did not stop within %.0f s", task.get_name(), CLOSE_TIMEOUT_S)
        # The binds were answered before the service closes: what they left queued goes now.
        await self.events.flush()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _follow(self, following: _Following, iterator: AsyncIterator[Any]) -> None:
        """Feed one state from its own stream (an old state's stream feeds only it). A change
        that arrives while kube-scheduler's filter→prioritize cycle is open waits for it to
        close (at most `cycle.MAX_HOLD_S`): it is nearly always the echo of an earlier pod's
        bind, which the ledger counts already, and applying it is work the scheduler waits
        on there (the watch is no more prompt than that anyway)."""
        cycle = self.cycle
        async for item in iterator:
            if isinstance(item, Synced):
                continue
            if cycle.open:
                await cycle.wait_closed()
            self._apply(following, item)

    def _apply(self, following: _Following, event: Any) -> None:
        try:
            applied = following.state.apply(event)
        except Exception:  # one bad object must not stop the watch
            log.exception("cannot apply %s %s event", event.type, event.kind)
            return
        if applied.notices:
            self._report(applied)
        if event.kind == "Pod":
            self._note_pending(following, event)

    def _note_pending(self, following: _Following, event: Any) -> None:
        """Queue the shape of a pending GPU pod for warming: the scheduler will ask soon."""
        meta = event.obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if not isinstance(uid, str):
            return
        record = following.state.pending(uid) if event.type != "DELETED" else None
        demand = record.parsed.demand if record is not None and record.parsed else None
        if demand is not None and demand.request.kind != "none":
            following.warmer.note(uid, demand)
        else:
            following.warmer.forget(uid)

    def _report(self, applied: Applied) -> None:
        for notice in applied.notices:
            self.notices[notice.kind] = self.notices.get(notice.kind, 0) + 1
            if notice.kind == "inventory_refused":
                log.warning(
                    "node %s takes no GPU pods: %s",
                    notice.name,
                    notice.message,
                    extra={"node": notice.name, "outcome": notice.kind},
                )
                reason = NOTICE_REASONS[notice.kind]
                self.events.record(NodeEvent(notice.name, reason, notice.message, warning=True))
                continue
            log.warning(
                "pod %s/%s: %s",
                notice.namespace,
                notice.name,
                notice.message,
                extra={"pod": f"{notice.namespace}/{notice.name}", "outcome": notice.kind},
            )
            if notice.uid:
                self.events.record(
                    PodEvent(
                        notice.namespace,
                        notice.name,
                        notice.uid,
                        NOTICE_REASONS[notice.kind],
                        notice.message,
                        warning=True,
                    )
                )

    async def _refresh_workload_forever(self) -> None:
        while True:
            await asyncio.sleep(self.workload_refresh_s)
            await self.refresh_workload()

    async def refresh_workload(self) -> None:
        """Learn the typical-pod workload from the cluster's pods; replace the policy (and
        empty the score caches) only when it changed materially."""
        following = self._following
        if following is None:
            return
        learned = await asyncio.to_thread(following.state.learn_workload)
        if following is self._following and following.state.use_workload(learned):
            self._last = None
            following.warmer.rewarm()

    async def reconfigure(self, config: Config) -> Reconfigured:
        """Apply a new configuration: build a new decision state from the cluster under it
        (the old one serves meanwhile), then swap it in under the bind lock, carrying over
        the reservations of binds in flight. Listener and election settings need a restart
        and are reported, not applied."""
        old = self.config
        self._config_error = None
        restart = _restart_sections(old, config)
        if state_settings(config) == state_settings(old):
            self.config = config
            return Reconfigured(False, restart)
        current = self._following
        workload = current.state.workload if current is not None else None
        following = await self._build(config, workload=workload)
        async with self._lock:
            if current is not None:
                following.state.carry_allocations(current.state)
            following.state.evaluator.refresh()
            for uid, record in list(following.state.pods.items()):
                parsed = record.parsed
                if record.node is None and parsed is not None and parsed.demand is not None:
                    following.warmer.note(uid, parsed.demand)
            self.config = config
            self._install(following)
        return Reconfigured(True, restart)

    def config_rejected(self, problems: Sequence[str]) -> None:
        """The configuration source offered a document that failed validation: the one in
        force stays, and the failure shows in /status and /metrics."""
        self._config_error = "; ".join(problems)

    def serving_problem(self) -> str | None:
        """Why this replica must not answer the scheduling verbs now, or None if it may."""
        if not self.ready:
            return "mpsched is starting: the ledger is not built from the cluster yet"
        if not self.leadership.is_leader():
            return "mpsched standby: another replica holds the leader lease"
        return None

    def _check_ready(self) -> DecisionState:
        problem = self.serving_problem()
        if problem is not None:
            raise NotReady(problem)
        return self.state

    # -- filter and prioritize ---------------------------------------------------------------

    def filter(self, pod: object, node_names: Sequence[str]) -> FilterOutcome:
        """Which of `node_names` can take the pod now. Raises NotReady before `start()`."""
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
        if parsed.key is not None:
            self._last = _LastFilter(parsed.key, state, ev.epoch, passed, scores)
        following = self._following
        if following is not None:  # always, once ready: `state` is its state
            following.warmer.asked(parsed.uid, node_names)
        outcome = FilterOutcome(passed, sweep.failed, sweep.unresolvable)
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

    def prioritize(self, pod: object, node_names: Sequence[str]) -> list[tuple[str, int]]:
        """A 0..10 score per node (see the module docstring for the normalisation)."""
        return list(zip(node_names, self.scores(pod, node_names), strict=True))

    def scores(self, pod: object, node_names: Sequence[str]) -> tuple[int, ...]:
        """`prioritize` as a column: the 0..10 score of each of `node_names`, in order. Asked
        again about the nodes the last filter passed, with none of them changed since, it
        answers the very same tuple each time."""
        state = self._check_ready()
        parsed = state.parser.parse(pod)
        if parsed.demand is None:
            return (0,) * len(node_names)
        ev = state.evaluator
        ev.refresh()
        last = self._last
        if (
            last is not None
            and last.key == parsed.key
            and last.state is state
            and (last.passed is node_names or last.passed == node_names)
            and self._unchanged(last, ev.touched_since(last.epoch))
        ):
            # The scheduler asks about exactly the nodes filter just passed, and none of them
            # has changed since (binds of other pods land in between, on other nodes): the
            # scores are already there (and all known). A raw score depends on its own node
            # only, so the nodes that did change elsewhere do not matter.
            if last.scaled is None:
                last.scaled = _scale(last.scores, native=self.accelerators.native_writer)
            return last.scaled
        raw = self._raw_scores(state, parsed.demand, node_names)
        return tuple(normalise(raw, native=self.accelerators.native_writer))

    def moved_on(self) -> None:
        """kube-scheduler went on from its filter call (prioritize was answered, or a bind
        came): the warmer may compute the call it forecasts next."""
        following = self._following
        if following is not None:
            following.warmer.wake()

    @staticmethod
    def _unchanged(last: _LastFilter, touched: Set[str] | None) -> bool:
        """None of the nodes `last` passed is among `touched` (None: all may have changed)."""
        return touched is not None and touched.isdisjoint(last.passed)

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
