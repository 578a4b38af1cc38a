"""The extender service's runtime: following the cluster into a decision state and keeping it
current, swapping that state whole on reconfiguration (truth rule 7 of docs/design.md), the one
lock that serialises check-and-reserve in bind, warm-up, the operator's notices, readiness and
bounded shutdown. `ExtenderService` (`extender.service.core`) adds the verbs on top.

Leadership and the configuration's health are inputs (a `Leadership`; `reconfigure` /
`config_rejected`), never flags set from outside.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from extender.cluster import AlwaysLeader, Cluster, EventStream, Leadership, Synced
from extender.config import Config
from extender.packing.state import DecisionState
from extender.packing.state_records import Applied, StateSettings
from extender.packing.workload import DEFAULT_WORKLOAD
from extender.service.binding import Binder
from extender.service.cycle import CycleRegistry
from extender.service.errors import NotReady
from extender.service.events import EventSink, NodeEvent, PodEvent
from extender.service.warm import Warmer
from extender.service.why import FilterReasons

log = logging.getLogger(__name__)

#: Seconds `close()` waits for its tasks to finish after cancelling them.
CLOSE_TIMEOUT_S: Final = 5.0
#: Why nothing is served before the first decision state is built from the cluster.
STARTING: Final = "mpsched is starting: the ledger is not built from the cluster yet"
#: The Warning Event's reason of each kind of notice (reality the ledger reported).
NOTICE_REASONS: Final = {
    "over_budget": "GpuOverBudget",
    "allocation_changed": "GpuAllocationChanged",
    "allocation_unreadable": "GpuAllocationUnreadable",
    "allocation_unplaced": "GpuAllocationUnplaced",
    "inventory_refused": "GpuInventoryRefused",
}


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """What a configuration change did: sections that only a restart applies are listed."""

    rebuilt: bool
    needs_restart: tuple[str, ...] = ()


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


class ServiceRuntime:
    """One extender instance's runtime over one cluster (see the module docstring); the base
    of `ExtenderService`."""

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
        #: The pods' scheduling cycles, filter to bind, by uid (`extender.service.cycle`).
        self.cycles = CycleRegistry()
        #: Every pod's latest filter answer, bounded, for `/status/why`.
        self.why = FilterReasons()
        #: Events about pods: queued, bounded, and sent by one task of their own.
        self.events = EventSink(cluster)
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
        return self._current().state

    @property
    def warmer(self) -> Warmer:
        """The warm-up queue of the state in force."""
        return self._current().warmer

    def _current(self) -> _Following:
        following = self._following
        if following is None:
            raise NotReady(STARTING)
        return following

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
        state = DecisionState(
            state_settings(config),
            workload=DEFAULT_WORKLOAD if workload is None else workload,
            native=self.accelerators.native_fit,
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
        self.cycles.clear()
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
        """Feed one state from its own stream (an old state's stream feeds only it)."""
        async for item in iterator:
            if isinstance(item, Synced):
                continue
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
            # Every node counts as changed now: no cycle taken before holds.
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
            return STARTING
        if not self.leadership.is_leader():
            return "mpsched standby: another replica holds the leader lease"
        return None

    def _check_ready(self) -> DecisionState:
        problem = self.serving_problem()
        if problem is not None:
            raise NotReady(problem)
        return self.state
