"""Fit and score of one pod shape on many nodes, fast: the hot path of /filter and /prioritize.

Owns the caches that make a filter over 5,000 nodes cost one array read per node, over the
state ids of `extender.packing.state_index` (equal ids: equal fit and score for any request):

- results are kept per request *signature* (the pod's concrete demand fields: its asks, UID and
  CPU, never its identity, so all replicas of a Deployment share them) in flat arrays indexed by
  state id: a status byte, a score, the chosen GPU and a misfit's reason (a shared string);
- behind those, fit results are shared per (fit signature, state id), where the fit signature
  leaves out CPU: a new CPU size of a known GPU ask only needs the policy's score;
- and scores per (state id, pod shape, candidate GPUs): a policy is a pure function of those
  three, and signatures differ in much a policy does not see (the UID, the container layout,
  asks in memory or units that come to the same thread percent on a GPU), so replaying
  realistic pods finds many of the scores a new signature needs known already.

In the compiled build the fill of one node is a C call (`_native.c`): each state id keeps a
packed record of what the share fit reads, and for FGD's descent (the default policy) one call
gives the fit, the score and the GPU without building a Fit or a policy view; elsewhere (the
pure build, another policy, whole GPUs, a node no GPU of which fits) the fill is Python's, with
the same results (tests/packing/test_native.py).

`warm` fills a signature's arrays for many nodes ahead of time (the service does it for pods it
sees pending, before the scheduler asks). Nothing here does I/O; the ledger is only read. The
caches are bounded in bytes (`extender.packing.results` says how); what is evicted is
recomputed on demand, with the same answers.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from itertools import compress
from typing import Final

from extender.packing import native as _native
from extender.packing.fit import Fit, FitResult, Misfit, fit_node
from extender.packing.ledger import Ledger
from extender.packing.policies import NodeState, PodShape, Policy
from extender.packing.policies.fgd import FgdPolicy, in_python
from extender.packing.request import Demand as GpuDemand
from extender.packing.request import ShareRequest, demand_on
from extender.packing.results import (
    DEFAULT_MAX_BYTES,
    FIT_BYTES_PER_STATE,
    FITS,
    IS_FIT,
    IS_NEVER,
    IS_ROOM,
    ITEM_BYTES,
    NEVER,
    NO_ROOM,
    POD_SHAPE_BYTES,
    POD_SHAPE_FIRST_BYTES,
    REASONS_SHARE,
    RESULT_BYTES_PER_STATE,
    SCORE_BYTES,
    SCORES_SHARE,
    SHAPE_BYTES,
    SHAPE_ID_BYTES,
    STR_BYTES,
    UNKNOWN,
    Demand,
    FitTable,
    Results,
    Sweep,
    fit_bytes,
    pick_items,
    pick_scores,
    pick_status,
)
from extender.packing.settings import BudgetSettings
from extender.packing.state_index import StateIndex
from extender.packing.view import pod_shape, share_gpu

#: The state index may grow to this many times the node count (plus a floor) before every
#: cache is rebuilt: the old states of busy nodes accumulate otherwise.
GROWTH_FACTOR: Final = 4
GROWTH_FLOOR: Final = 4096
#: Free CPU assumed for nodes without GPU inventory (the service does not track their CPU).
NO_GPU_NODE_CPU: Final = 10**9


class Evaluator(StateIndex):
    """Cached fit and score over the ledger's nodes for the current policy."""

    def __init__(
        self,
        ledger: Ledger,
        budgets: BudgetSettings,
        policy: Policy,
        *,
        cpu_free: Callable[[str], int],
        max_bytes: int = DEFAULT_MAX_BYTES,
        native: bool = True,
    ) -> None:
        super().__init__(ledger, budgets, cpu_free=cpu_free, native=native)
        #: Whether the compiled build's C parts may compute (fit, score, gathers).
        self._compiled = native
        self.policy = policy if self._compiled else in_python(policy)
        #: Results `sweep` computed itself, none being known yet (a filter or prioritize call
        #: waited for them): what warming ahead did not foresee.
        self.swept_results = 0
        self._max_bytes = max_bytes
        #: Estimated bytes of everything below: the sum of the Results', the tables' and the
        #: reason strings' own counts.
        self.nbytes = 0
        #: Least recently used first: a use moves a signature to the end, eviction takes the
        #: first. `_recent` (the last one returned, so already last) skips that move when the
        #: same shape is asked again, as prioritize does after filter.
        self._results: dict[Hashable, Results] = {}
        self._recent: Results | None = None
        #: Every fit table, and (oldest first) those no signature uses: evicted before any
        #: signature, kept while there is room (a policy change or a new CPU size reuses them).
        self._fits: dict[Hashable, FitTable] = {}
        self._orphans: dict[Hashable, FitTable] = {}
        #: Every distinct reason string once (reasons repeat across nodes and states).
        self._reasons: dict[str, str] = {}
        self._reason_bytes = 0
        #: (state id, pod shape's number, candidates, is a share) → (score, GPU or -1), for
        #: every signature (see the module docstring).
        self._scores: dict[tuple[int, int, tuple[int, ...], bool], tuple[float, int]] = {}
        #: Pod shape → its number in `_scores` keys (`_shape_id`), and the numbers given out.
        self._shape_ids: dict[PodShape, int] = {}
        self._shape_count = 0
        self._score_bytes = 0
        #: The C fit and score in one call (None in the pure build), for FGD's descent: the
        #: policy when it is one, whose native plans it scores with.
        self._fill_share = _native.FILL_SHARE if native else None
        self._fgd = policy if isinstance(policy, FgdPolicy) else None

    # -- node state -----------------------------------------------------------------------

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy if self._compiled else in_python(policy)
        self._fgd = policy if isinstance(policy, FgdPolicy) else None
        for results in self._results.values():
            self.nbytes -= results.nbytes
        self._results.clear()
        self._recent = None
        self._drop_scores()
        # Fit does not depend on the policy: the tables stay, unused until a shape comes back.
        for table in self._fits.values():
            table.users = 0
        self._orphans = dict(self._fits)
        self.epoch += 1
        self._touches.append((self.epoch, None))

    def refresh(self) -> None:
        """Recompute the state ids of the nodes touched since the last call."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            self._restate(name)
        if abs(len(self._state_of) - self._compacted) * 20 > self._compacted:
            self.compact()
        if len(self._intern) > GROWTH_FACTOR * len(self._state_of) + GROWTH_FLOOR:
            # Old states of busy nodes pile up in the index and the caches: start afresh.
            self._intern.clear()
            self._states.clear()
            self._records.clear()
            self._results.clear()
            self._recent = None
            self._fits.clear()
            self._orphans.clear()
            self._reasons.clear()
            self._reason_bytes = 0
            self._drop_scores()
            self.nbytes = 0
            for name in list(self._state_of):
                self._restate(name)

    def _native_fit(
        self, sid: int, name: str, request: ShareRequest, table: FitTable
    ) -> Fit | None:
        """The share's Fit on the node by the C fit, or None where the Python fit must decide
        (no record, or no GPU fits: only the Python fit says why)."""
        fit_share = self._fit_share
        if fit_share is None:
            return None
        record = self._records[sid]
        if record is None:
            return None
        try:
            found = fit_share(
                record, self._packed_demands(request, table), request.run_as_user,
                self.budgets.uid_isolation,
            )  # fmt: skip
        except OverflowError:
            return None  # a figure past 64 bits: Python's integers fit it
        if found is None:
            return None
        gpus, shapes = found
        demands = table.gpu_demands
        return Fit(name, gpus, tuple([demands[i] for i in shapes]))

    def _packed_demands(self, request: ShareRequest, table: FitTable) -> bytes:
        """The request's demand on every GPU shape the records number, packed for the C fit
        (computed once per fit signature and shape, shared with the Python fit's). Raises
        OverflowError for a demand past 64 bits, with the table's packed demands unchanged
        (the caller fits in Python)."""
        demands = table.gpu_demands
        if len(demands) < len(self._shape_infos):
            shapes = len(table.shapes)
            added: list[GpuDemand] = []
            for info in self._shape_infos[len(demands) :]:
                shape = (info.memory_mib, info.units)
                known = table.shapes.get(shape)
                if known is None:
                    known = table.shapes[shape] = demand_on(request, info, self.budgets)
                added.append(known)
            size = SHAPE_BYTES * (len(table.shapes) - shapes)
            table.nbytes += size
            self.nbytes += size
            packed = array(
                "q", [x for d in (*demands, *added) for x in (d.threads, d.memory_mib, d.clients)]
            ).tobytes()
            demands.extend(added)
            table.packed_demands = packed
        return table.packed_demands

    def _fill_native(self, results: Results, demand: Demand, sid: int) -> bool:
        """Fit and score a share on state `sid` in one C call where the policy is FGD's
        descent (the default) and the node has a record: the result into `results`, True.
        False where the Python path must: no GPU fits (only it says why), no record, another
        policy, or figures past 64 bits. No Fit is kept (`entry` makes one for a bind)."""
        fill_share, fgd = self._fill_share, self._fgd
        if fill_share is None or fgd is None:
            return False
        record = self._records[sid]
        if record is None:
            return False
        state = self._states[sid]
        free = state.gpu_free
        plan = fgd.native_plan(state.model, len(free))
        if plan is None:
            return False
        request = demand.request
        try:
            packed = self._packed_demands(request, results.table)
            found = fill_share(
                record, packed, request.run_as_user, self.budgets.uid_isolation, plan,
                state.cpu_free_milli, free, demand.cpu_milli,
            )  # fmt: skip
        except OverflowError:
            return False
        if found is None:
            return False
        results.score[sid], results.gpu[sid] = found
        results.status[sid] = FITS
        return True

    # -- results ----------------------------------------------------------------------------

    def results(self, demand: Demand) -> Results:
        """The result arrays of this signature, sized for every current state id. May evict
        other signatures (never this one): call it once per request, before filling."""
        found = self._results.get(demand.signature)
        if found is None:
            found = self._new_results(demand)
        elif found is not self._recent:
            del self._results[demand.signature]
            self._results[demand.signature] = found
        self._recent = found
        size = len(self._intern)
        if len(found.status) < size:
            grown = RESULT_BYTES_PER_STATE * (size - len(found.status))
            found.grow(size)
            found.nbytes += grown
            self.nbytes += grown
        if len(found.fits) < size:
            missing = size - len(found.fits)
            found.fits.extend([None] * missing)
            found.table.nbytes += FIT_BYTES_PER_STATE * missing
            self.nbytes += FIT_BYTES_PER_STATE * missing
        if self.nbytes > self._max_bytes:
            self._evict(found)
        return found

    def _new_results(self, demand: Demand) -> Results:
        key = demand.fit_signature
        table = self._fits.get(key)
        if table is None:
            table = self._fits[key] = FitTable(key)
            self.nbytes += table.nbytes
        elif not table.users:
            del self._orphans[key]
        table.users += 1
        found = self._results[demand.signature] = Results(table)
        self.nbytes += found.nbytes
        return found

    def _evict(self, keep: Results) -> None:
        """Drop unused fit tables, then least recently used signatures, until under budget;
        `keep` (the most recently used) stays even if it alone is over. Each step is O(1)."""
        while self.nbytes > self._max_bytes:
            if self._orphans:
                key = next(iter(self._orphans))
                table = self._orphans.pop(key)
                del self._fits[key]
                self.nbytes -= table.nbytes
                continue
            signature = next(iter(self._results))
            oldest = self._results[signature]
            if oldest is keep:
                return
            del self._results[signature]
            self.nbytes -= oldest.nbytes
            table = oldest.table
            table.users -= 1
            if not table.users:
                self._orphans[table.key] = table

    def fill(self, results: Results, demand: Demand, name: str) -> int:
        """Compute the result for node `name` (refreshed) into `results`; its status byte."""
        sid = self._state_of[name]
        request = demand.request
        fit = results.fits[sid]
        if fit is None:
            if request.kind == "share" and self._fill_native(results, demand, sid):
                return FITS
            fit = self._fit(results, request, sid, name)
        if isinstance(fit, Misfit):
            status = NO_ROOM if fit.resolvable else NEVER
            results.reasons[sid] = self._reason(fit.reason)
            results.status[sid] = status
            return status
        threads = fit.demands[0].threads if fit.demands else 0
        found = results.shapes.get(threads)
        if found is None:
            size = POD_SHAPE_BYTES if results.shapes else POD_SHAPE_FIRST_BYTES
            shape = pod_shape(request, demand.cpu_milli, threads=threads)
            found = results.shapes[threads] = (shape, self._shape_id(shape))
            results.nbytes += size
            self.nbytes += size
        shape, shape_id = found
        share = request.kind == "share"
        key = (sid, shape_id, fit.gpus, share)
        known = self._scores.get(key)
        if known is None:
            known = self._scores[key] = self._score(self._states[sid], shape, fit.gpus, share)
            self._score_bytes += SCORE_BYTES
            self.nbytes += SCORE_BYTES
            if self._score_bytes * SCORES_SHARE > self._max_bytes:
                self._drop_scores()
        results.score[sid], results.gpu[sid] = known
        results.status[sid] = FITS
        return FITS

    def _fit(self, results: Results, request: ShareRequest, sid: int, name: str) -> FitResult:
        """The request's fit on state `sid` (node `name`), kept in the fit table."""
        table = results.table
        fit: FitResult | None = None
        if request.kind == "share":
            fit = self._native_fit(sid, name, request, table)
        shapes = len(table.shapes)
        if fit is None:
            fit = fit_node(self.ledger.node(name), request, self.budgets, shapes=table.shapes)
        results.fits[sid] = fit
        size = fit_bytes(fit) + SHAPE_BYTES * (len(table.shapes) - shapes)
        table.nbytes += size
        self.nbytes += size
        return fit

    def _score(
        self, state: NodeState, shape: PodShape, candidates: tuple[int, ...], share: bool
    ) -> tuple[float, int]:
        """The policy's score of the pod on the node, and the GPU a share goes to (else -1)."""
        score, gpu = self.policy.score(state, shape, candidates)
        return float(score), share_gpu(state, candidates, gpu) if share else -1

    def _shape_id(self, shape: PodShape) -> int:
        """The number the shared scores know `shape` by: a PodShape's hash is a Python-level
        dataclass method, an int's is not. Numbers are never reused (`_drop_scores` forgets
        the shapes, not the count), so a signature's number stays unique to its shape."""
        found = self._shape_ids.get(shape)
        if found is None:
            found = self._shape_ids[shape] = self._shape_count
            self._shape_count += 1
            self._score_bytes += SHAPE_ID_BYTES
            self.nbytes += SHAPE_ID_BYTES
        return found

    def _drop_scores(self) -> None:
        self.nbytes -= self._score_bytes
        self._scores.clear()
        self._shape_ids.clear()
        self._score_bytes = 0

    def _reason(self, reason: str) -> str:
        """The one shared copy of this reason string. The index is emptied when it outgrows
        its share of the budget: reasons embed request sizes, so distinct shapes add new ones."""
        shared = self._reasons.get(reason)
        if shared is not None:
            return shared
        if self._reason_bytes * REASONS_SHARE > self._max_bytes:
            self.nbytes -= self._reason_bytes
            self._reasons.clear()
            self._reason_bytes = 0
        self._reasons[reason] = reason
        size = 2 * ITEM_BYTES + STR_BYTES + len(reason)
        self._reason_bytes += size
        self.nbytes += size
        return reason

    def entry(self, demand: Demand, name: str) -> tuple[FitResult, float, int | None] | None:
        """Fit, score and GPU for one node, checking the ledger's generation: the
        authoritative path bind uses. None when the node has no inventory."""
        self.refresh()
        usage = self.ledger.get_node(name)
        if usage is None:
            return None
        if self._generation.get(name) != usage.generation:
            self._restate(name)
        results = self.results(demand)
        sid = self._state_of[name]
        if not results.status[sid]:
            self.fill(results, demand, name)
        fit = results.fits[sid]
        if fit is None:  # filled in C, which keeps no Fit
            fit = self._fit(results, demand.request, sid, name)
        gpu = results.gpu[sid]
        return fit, results.score[sid], None if gpu < 0 else gpu

    def sweep(self, demand: Demand, names: Sequence[str]) -> Sweep:
        """Fit and score `demand` on every node of `names` (refresh first). The per-node work is
        done in C (itemgetter, the gathers by state id, bytes.translate, compress over the status
        bytes); Python code runs only for nodes whose result is not known yet. Plain builtins
        rather than numpy here: with the caches cold between calls, as they are in a
        scheduler's loop, numpy's per-call overhead cost more than its vector loops saved."""
        results = self.results(demand)
        unknown: list[str] = []
        try:
            sids = pick_items(self._state_of, names)
        except KeyError:
            found = list(map(self._state_of.get, names))
            known = [sid is not None for sid in found]
            unknown = [name for name, k in zip(names, known, strict=True) if not k]
            names = list(compress(names, known))
            sids = tuple(sid for sid in found if sid is not None)
        status = results.status
        native = self._compiled
        states = pick_status(status, sids, native=native)
        if UNKNOWN in states:
            for name, sid in zip(names, sids, strict=True):
                if not status[sid]:
                    self.fill(results, demand, name)
                    self.swept_results += 1
            states = pick_status(status, sids, native=native)
        fit = states.translate(IS_FIT)
        everything = 0 not in fit
        fit_sids = sids if everything else tuple(compress(sids, fit))
        out = Sweep(
            list(names) if everything else list(compress(names, fit)),
            pick_scores(results.score, fit_sids, native=native),
            unknown=unknown,
        )
        if not everything:
            for table, target in ((IS_ROOM, out.failed), (IS_NEVER, out.unresolvable)):
                mask = states.translate(table)
                if 1 in mask:
                    reasons = pick_items(results.reasons, tuple(compress(sids, mask)))
                    target.update(zip(compress(names, mask), reasons, strict=True))
        return out

    def warm(self, demand: Demand, names: Sequence[str]) -> int:
        """Fill the signature's results for `names` ahead of time; how many were computed."""
        return self.warm_from(demand, names, 0, len(names))[0]

    def warm_from(
        self, demand: Demand, names: Sequence[str], start: int, limit: int
    ) -> tuple[int, int]:
        """Fill the signature's results for `names[start:]`, stopping once `limit` results are
        computed: how many were, and the index after the last name looked at (`len(names)`
        when all were). Lets a caller compute in slices of bounded time."""
        self.refresh()
        results = self.results(demand)
        state_of, status = self._state_of, results.status
        done = 0
        i = start
        end = len(names)
        while i < end and done < limit:
            sid = state_of.get(names[i])
            if sid is not None and not status[sid]:
                self.fill(results, demand, names[i])
                done += 1
            i += 1
        return done, i

    def evaluate_no_gpu(self, demand: Demand) -> float:
        """The score of a node without GPUs for a pod that asks for none."""
        state = NodeState("", NO_GPU_NODE_CPU, ())
        shape = pod_shape(demand.request, demand.cpu_milli, threads=0)
        score, _ = self.policy.score(state, shape, ())
        return float(score)
