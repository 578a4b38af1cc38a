"""The extender service: decides with the packing core, acts through the cluster interface.

Owns the verbs' semantics (filter, prioritize, bind, preempt, status) independent of HTTP, the
ledger's lifecycle (built from the cluster, kept current by its watch), and the one lock that
serialises check-and-assume in bind. Filter and prioritize are synchronous and do no I/O: they
read the ledger through the evaluator's caches (see `evaluate`), so kube-scheduler's serial loop
pays microseconds per node.

Scores: the policy's raw score is mapped to kube-scheduler's 0..10 by min-max over the
candidate nodes of the call: the best node gets 10, the worst 0, the rest in proportion,
rounded; when all are equal every node gets 10 (no preference). Nodes that do not fit get 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from extender.cluster import Cluster, EventStream, Synced
from extender.config import Config
from extender.metrics import LedgerSample
from extender.packing.evaluate import Demand, Evaluator
from extender.packing.ledger import Allocation, Ledger
from extender.packing.parsing import PodParser
from extender.packing.policies import NodeState, make_policy, typical_workload
from extender.packing.policies.frag import Fragmentation
from extender.packing.preempt import node_victims
from extender.packing.workload import DEFAULT_WORKLOAD, materially_different
from extender.service.binding import Binder
from extender.service.cluster_state import TERMINAL_PHASES, ClusterState
from extender.service.errors import NotReady
from extender.service.status import (
    STATUS_BATCH,
    sample_metrics,
    status_document,
    stream_status,
)
from extender.service.warm import Warmer

log = logging.getLogger(__name__)

MAX_SCORE = 10


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
class _LastFilter:
    key: tuple[str, str]
    epoch: int
    passed: list[str]
    scores: Sequence[float]


def normalise(raw: Sequence[float | None]) -> list[int]:
    """Raw policy scores → 0..MAX_SCORE by min-max, rounded half up; None (no fit) → 0."""
    if None not in raw:
        return _scale(cast(Sequence[float], raw))
    fits = [s is not None for s in raw]
    scaled = iter(_scale([s for s in raw if s is not None]))
    return [next(scaled) if f else 0 for f in fits]


def _scale(raw: Sequence[float]) -> list[int]:
    """`normalise` of scores that are all known: the hot path of /prioritize."""
    if not raw:
        return []
    lo, hi = min(raw), max(raw)
    if not hi > lo:
        return [MAX_SCORE] * len(raw)
    k = MAX_SCORE / (hi - lo)
    # Policies give few distinct values (FGD: integers 0..100): map each distinct one once and
    # translate the list in C. Plain builtins: in a scheduler's loop the caches are cold
    # between calls, and there numpy's machinery cost more than it saved (measured).
    table = {s: int((s - lo) * k + 0.5) for s in set(raw)}
    return list(map(table.__getitem__, raw))


class ExtenderService:
    """One extender instance over one cluster. Call `start()` inside the event loop before
    serving and `close()` when done."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        config: Config,
        config_source: str | None = None,
        workload_refresh_s: float = 60.0,
        warm_budget_s: float = 120.0,
        preempt_extra_victims: bool = True,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.config_source = config_source
        self.config_error: str | None = None
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
        self.ready = False
        #: False on a standby replica: another replica holds the leader Lease (DESIGN §5). The
        #: standby keeps its ledger current through the watch, so that it can serve at once
        #: when it takes over.
        self.leading = True
        self._ready_event = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last: _LastFilter | None = None
        self._limits_version = -1
        self._limits: tuple[int | None, int | None] = (None, None)
        self._build(config)

    def _build(self, config: Config) -> None:
        self.ledger = Ledger(config.budgets)
        self.state = ClusterState(self.ledger, config, on_change=self._changed)
        self.workload = DEFAULT_WORKLOAD
        policy = make_policy(config.policy.name, workload=self.workload, settings=config.policy)
        self.frag = Fragmentation(self.workload)
        self.evaluator = Evaluator(
            self.ledger, config.budgets, policy, cpu_free=self.state.cpu_free
        )
        self.parser = PodParser(
            config.budgets, cpu_milli=self.state.pod_cpu_milli, limits=self._gpu_limits
        )
        self.warmer = Warmer(self.evaluator, lambda: list(self.evaluator.state_ids()))
        self.binder = Binder(
            cluster=self.cluster,
            ledger=self.ledger,
            evaluator=self.evaluator,
            parser=self.parser,
            budgets=config.budgets,
            lock=self._lock,
            unknown_reason=self._unknown_reason,
            spawn=self._spawn,
        )

    def _changed(self, node: str) -> None:
        self.evaluator.touch(node)

    def _gpu_limits(self) -> tuple[int | None, int | None]:
        version = self.state.inventory_version
        if version != self._limits_version:
            self._limits_version = version
            self._limits = self.state.max_gpu_facts()
        return self._limits

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the ledger from the cluster, then follow its changes."""
        stream = self.cluster.follow()
        await self._sync(stream)
        started = time.monotonic()
        # Before ready only health probes compete for the loop: larger slices.
        await self.warmer.drain(budget_s=self.warm_budget_s, chunk=256)
        log.info(
            "caches warmed for pending pods in %.1f s (%d results)",
            time.monotonic() - started,
            self.warmer.computed,
        )
        self.ready = True
        self._ready_event.set()
        self._spawn(self._follow(stream))
        self._spawn(self._refresh_workload_forever())
        self._spawn(self.warmer.run())

    async def wait_ready(self) -> None:
        """Return once `start()` has built the ledger (for embedders: the demo, tests)."""
        await self._ready_event.wait()

    async def _sync(self, stream: EventStream) -> None:
        async for item in stream:
            if isinstance(item, Synced):
                break
            if item.kind == "Node":
                self.state.apply_node(item.obj)
            else:
                self.state.apply_pod(item.obj)
                self._note_pending(item.obj)
        await self.refresh_workload()
        self.evaluator.refresh()
        log.info(
            "ledger built from %s: %d GPU nodes, %d allocations, %d pods",
            self.cluster.description,
            len(self.ledger),
            sum(1 for _ in self.ledger.allocations()),
            len(self.state.pods),
        )

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self, stream: Any) -> None:
        try:
            async for event in stream:
                if isinstance(event, Synced):
                    continue
                try:
                    self.state.handle(event)
                    if event.kind == "Pod" and event.type != "DELETED":
                        self._note_pending(event.obj)
                    elif event.kind == "Pod":
                        uid = event.obj.get("metadata", {}).get("uid")
                        if isinstance(uid, str):
                            self.warmer.forget(uid)
                except Exception:  # one bad object must not stop the watch
                    log.exception("cannot apply %s %s event", event.type, event.kind)
        finally:
            stream.close()

    def _note_pending(self, pod: Mapping[str, Any]) -> None:
        """Queue the shape of an unbound GPU pod for warming: the scheduler will ask soon."""
        meta = pod.get("metadata")
        spec = pod.get("spec")
        status = pod.get("status")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if not isinstance(uid, str) or not isinstance(spec, Mapping):
            return
        bound = bool(spec.get("nodeName"))
        if bound or (isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES):
            self.warmer.forget(uid)
            return
        demand = self.parser.parse(pod).demand
        if demand is not None and demand.request.kind != "none":
            self.warmer.note(uid, demand)

    async def _refresh_workload_forever(self) -> None:
        while True:
            await asyncio.sleep(self.workload_refresh_s)
            await self.refresh_workload()

    async def refresh_workload(self) -> None:
        """Learn the typical-pod workload from the cluster's pods; replace the policy (and
        empty the score caches) only when it changed materially."""
        shapes = [r.shape for r in self.state.pods.values() if r.shape is not None]
        coverage = self.config.policy.workload_coverage
        learned = await asyncio.to_thread(typical_workload, shapes, coverage=coverage)
        workload = learned or DEFAULT_WORKLOAD
        if not materially_different(self.workload, workload):
            return
        self.workload = workload
        self.frag = Fragmentation(workload)
        policy = make_policy(
            self.config.policy.name, workload=workload, settings=self.config.policy
        )
        self.evaluator.set_policy(policy)
        self._last = None
        self.warmer.rewarm()

    async def reconfigure(self, config: Config) -> None:
        """Apply a new configuration. A policy change takes effect at once; a change to the
        budgets, node selection or isolation changes every GPU's capacity, so the ledger is
        rebuilt from the cluster (not ready meanwhile). Listener settings need a restart."""
        old = self.config
        async with self._lock:
            same_ledger = (config.budgets, config.nodes, config.isolation) == (
                old.budgets,
                old.nodes,
                old.isolation,
            )
            if same_ledger:
                self.config = config
                if config.policy != old.policy:
                    settings = config.policy
                    policy = make_policy(settings.name, workload=self.workload, settings=settings)
                    self.evaluator.set_policy(policy)
                    self._last = None
                    self.warmer.rewarm()
                return
            self.ready = False
            self._ready_event.clear()
            await self.close()
            self.config = config
            self._limits_version = -1
            self._last = None
            self._build(config)
            await self.start()

    def serving_problem(self) -> str | None:
        """Why this replica must not answer the scheduling verbs now, or None if it may."""
        if not self.ready:
            return "mpsched is starting: the ledger is not built from the cluster yet"
        if not self.leading:
            return "mpsched standby: another replica holds the leader lease"
        return None

    def _check_ready(self) -> None:
        problem = self.serving_problem()
        if problem is not None:
            raise NotReady(problem)

    # -- filter and prioritize ---------------------------------------------------------------

    def filter(self, pod: object, node_names: Sequence[str]) -> FilterOutcome:
        """Which of `node_names` can take the pod now. Raises NotReady before `start()`."""
        self._check_ready()
        parsed = self.parser.parse(pod)
        ev = self.evaluator
        ev.refresh()
        if parsed.demand is None:
            reason = parsed.error or "invalid request"
            return FilterOutcome([], {}, dict.fromkeys(node_names, reason))
        demand = parsed.demand
        sweep = ev.sweep(demand, node_names)
        passed, scores = sweep.passed, sweep.scores
        if sweep.unknown and demand.request.kind == "none":
            # A pod that asks for no GPU may go anywhere, GPU-less nodes included.
            passed.extend(sweep.unknown)
            scores = (*scores, *[ev.evaluate_no_gpu(demand)] * len(sweep.unknown))
        else:
            for name in sweep.unknown:
                sweep.unresolvable[name] = self._unknown_reason(name)
        if parsed.key is not None:
            self._last = _LastFilter(parsed.key, ev.epoch, passed, scores)
        return FilterOutcome(passed, sweep.failed, sweep.unresolvable)

    def _unknown_reason(self, name: str) -> str:
        return self.state.excluded.get(name) or "node unknown to mpsched (no such node seen)"

    def prioritize(self, pod: object, node_names: Sequence[str]) -> list[tuple[str, int]]:
        """A 0..10 score per node (see the module docstring for the normalisation)."""
        return list(zip(node_names, self.scores(pod, node_names), strict=True))

    def scores(self, pod: object, node_names: Sequence[str]) -> list[int]:
        """`prioritize` as a column: the 0..10 score of each of `node_names`, in order."""
        self._check_ready()
        parsed = self.parser.parse(pod)
        if parsed.demand is None:
            return [0] * len(node_names)
        ev = self.evaluator
        ev.refresh()
        last = self._last
        if (
            last is not None
            and last.key == parsed.key
            and last.epoch == ev.epoch
            and (last.passed is node_names or last.passed == node_names)
        ):
            # The scheduler asks about exactly the nodes filter just passed, and nothing has
            # changed since: the scores are already there (and all known).
            return _scale(last.scores)
        return normalise(self._raw_scores(parsed.demand, node_names))

    def _raw_scores(self, demand: Demand, node_names: Sequence[str]) -> list[float | None]:
        ev = self.evaluator
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
        return await self.binder.bind(name=name, namespace=namespace, uid=uid, node=node)

    # -- preempt ----------------------------------------------------------------------------

    def preempt(self, pod: object, victims: Mapping[str, Victims]) -> dict[str, Victims]:
        """Per candidate node, the victims (drawn from the scheduler's proposal) whose eviction
        frees room for the pod on one GPU; nodes where nothing works are left out. See
        `extender.packing.preempt.node_victims` for the rule."""
        self._check_ready()
        parsed = self.parser.parse(pod)
        if parsed.demand is None:
            return {}
        out: dict[str, Victims] = {}
        for node, proposal in victims.items():
            # A uid the cluster shows on another node is not this node's to evict.
            uids = [u for u in proposal.uids if self._may_be_on(u, node)]
            chosen = node_victims(
                self.ledger,
                node,
                parsed.demand.request,
                uids,
                self.config.budgets,
                extra=self.preempt_extra_victims,
            )
            if chosen is not None:
                out[node] = Victims(chosen, min(proposal.pdb_violations, len(chosen)))
        return out

    def _may_be_on(self, uid: str, node: str) -> bool:
        record = self.state.pods.get(uid)
        return record is None or record.node == node

    # -- status -----------------------------------------------------------------------------

    def status(self, *, node: str | None = None) -> dict[str, Any]:
        """The `/status` document; the schema is on `extender.service.status.status_document`.
        Blocks the loop for O(nodes) (0.3 s at 5,000 nodes): servers use `status_stream`."""
        self.evaluator.refresh()
        return status_document(
            self.ledger,
            states=self._node_states(),
            frag=self.frag,
            policy=self.config.policy.name,
            source=self.config_source,
            error=self.config_error,
            node=node,
        )

    async def status_stream(
        self, *, node: str | None = None, batch: int = STATUS_BATCH
    ) -> AsyncIterator[bytes]:
        """The `/status` document as JSON, in pieces, yielding to the loop every `batch` nodes
        so that filter calls never wait behind a large cluster's status. The pieces concatenate
        to what `status()` returns (nodes added or removed meanwhile may be missed)."""
        config = {
            "policy": self.config.policy.name,
            "source": self.config_source,
            "error": self.config_error,
        }
        async for piece in stream_status(
            self.ledger, self.evaluator, self.frag, config=config, node=node, batch=batch
        ):
            yield piece

    async def metrics_sample(self, *, batch: int = STATUS_BATCH) -> LedgerSample:
        """The ledger gauges for one scrape, built `batch` nodes at a time between requests."""
        return await sample_metrics(
            self.ledger,
            self.evaluator,
            self.frag,
            config_ok=self.config_error is None,
            batch=batch,
        )

    def _node_states(self) -> dict[str, NodeState]:
        ev = self.evaluator
        return {n: s for n in self.ledger.node_names() if (s := ev.node_state(n)) is not None}
