"""Fit and score of one pod shape on many nodes, fast: the hot path of /filter and /prioritize.

Owns the caches that make a filter over 5,000 nodes cost one array read per node:

- every node's state is reduced to a small integer, its *state id*: equal ids mean equal GPU
  budgets, usage, UIDs and free CPU, hence equal fit and score for any request. A node's id is
  recomputed only when the service reports that the node changed (`touch`), so a filter never
  walks the GPUs of unchanged nodes;
- results are kept per request *signature* (the pod's concrete demand fields: its asks, UID and
  CPU, never its identity, so all replicas of a Deployment share them) in flat arrays indexed by
  state id: a status byte, a score, the chosen GPU and a misfit's reason (a shared string),
  eighteen bytes per node and shape;
- behind those, fit results are shared per (fit signature, state id), where the fit signature
  leaves out CPU: a new CPU size of a known GPU ask only needs the policy's score;
- and scores per (state id, pod shape, candidate GPUs): a policy is a pure function of those
  three, and signatures differ in much a policy does not see (the UID, the container layout,
  asks in memory or units that come to the same thread percent on a GPU). Replaying the
  realistic pods of scripts/bench-extender in process, two in five of the scores a new
  signature needed on a node were known already.

In the compiled build the fill of one node is a C call (`_native.c`): each state id keeps a
packed record of what the share fit reads, and for FGD's descent (the default policy) one call
gives the fit, the score and the GPU without building a Fit or a policy view; elsewhere (the
pure build, another policy, whole GPUs, a node no GPU of which fits) the fill is Python's, with
the same results (tests/packing/test_native.py).

`warm` fills a signature's arrays for many nodes ahead of time (the service does it for pods it
sees pending, before the scheduler asks). Nothing here does I/O; the ledger is only read.

The result arrays, the fit results and the reason strings are bounded together in bytes
(truth rule 6 of docs/design.md), by an estimate kept as they grow: every new request shape adds
arrays as long as the state index, so a count of signatures bounds nothing at 5,000 nodes, and a
stream of distinct shapes would grow the caches without end. Past the budget the least recently used
signatures go, then fit tables no signature uses any more. What is evicted is recomputed on
demand, with the same answers.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Hashable, Sequence, Set
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import itemgetter
from typing import Any, Final

from extender.packing import native as _native
from extender.packing.fit import Fit, FitResult, Misfit, ShapeDemands, fit_node, share_probe
from extender.packing.ledger import GpuUsage, Ledger, NodeUsage
from extender.packing.model import GpuInfo
from extender.packing.policies import NodeState, PodShape, Policy
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.request import Demand as GpuDemand
from extender.packing.request import ShareRequest, demand_on
from extender.packing.settings import BudgetSettings
from extender.packing.usage import uids_mixed
from extender.packing.view import node_state, pod_shape, share_gpu

#: Bytes the result caches may hold by default, by their own estimate. A share shape computed
#: on every node costs ~250 bytes per node (the Fit objects dominate), ~1.2 MB at 5,000 nodes:
#: 128 MiB holds ~100 such shapes there, and all of a few hundred nodes' shapes in practice.
DEFAULT_MAX_BYTES: Final = 128 << 20
#: Estimated bytes, measured with tracemalloc (tests/packing/test_evaluate_bounds.py checks the
#: estimate against it): per state id, a signature's arrays (status 1, score 8, GPU 1, reason
#: pointer 8, plus the arrays' over-allocation) and a fit table's pointer;
_RESULT_BYTES_PER_STATE: Final = 20
_FIT_BYTES_PER_STATE: Final = 9
#: fixed costs of a signature's Results and of a fit table (objects, headers, dict slots);
_RESULTS_OVERHEAD: Final = 600
_TABLE_OVERHEAD: Final = 200
#: a Misfit besides its reason string, a Fit besides its tuples' items, per tuple item, per
#: distinct Demand object, and a str object besides its characters.
_MISFIT_BYTES: Final = 80
_FIT_BYTES: Final = 150
_ITEM_BYTES: Final = 8
_DEMAND_BYTES: Final = 90
_STR_BYTES: Final = 49
#: A fit table's demand and budget probe for one GPU shape (shared by all its nodes).
_SHAPE_BYTES: Final = 400
#: A signature's first pod shape with its memo dict, and each further one (tracemalloc: 540
#: bytes for a one-entry dict with its PodShape).
_POD_SHAPE_FIRST_BYTES: Final = 540
_POD_SHAPE_BYTES: Final = 300
#: The share of the budget the reason strings' index may take before it is emptied.
_REASONS_SHARE: Final = 16
#: A shared score: its key (state id, PodShape, candidate tuple, share flag), its value
#: (score, GPU) and its dict slot; the shape and candidates are the Results' and the Fit's own.
_SCORE_BYTES: Final = 230
#: The share of the budget the shared scores may take before they are emptied.
_SCORES_SHARE: Final = 8
#: A pod shape's number for the shared scores (a dict slot and an int).
_SHAPE_ID_BYTES: Final = 100
#: The state index may grow to this many times the node count (plus a floor) before every
#: cache is rebuilt: the old states of busy nodes accumulate otherwise.
GROWTH_FACTOR: Final = 4
GROWTH_FLOOR: Final = 4096
#: Touches remembered for `touched_since`: between a filter and its prioritize a few binds
#: land; more than this and the caller recomputes instead.
TOUCH_LOG: Final = 64
#: Free CPU assumed for nodes without GPU inventory (the service does not track their CPU).
NO_GPU_NODE_CPU: Final = 10**9

#: A fit record's UIDs of a GPU (`_native.c`): none, every share without one, every share as
#: one UID, shares of several UIDs.
_UIDS_NONE: Final = 0
_UIDS_UNSET: Final = 1
_UIDS_ONE: Final = 2
_UIDS_MANY: Final = 3
#: Status bytes of a result array.
UNKNOWN: Final = 0
FITS: Final = 1
NO_ROOM: Final = 2  # resolvable: evicting pods could make room
NEVER: Final = 3  # unresolvable
#: Status bytes → 1 where the status is the one named, 0 elsewhere (bytes.translate tables).
_IS_FIT: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x01\x00\x00")
_IS_ROOM: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x00\x01\x00")
_IS_NEVER: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x00\x00\x01")


@dataclass(slots=True)
class Sweep:
    """One request shape over a list of nodes: those that pass (in input order) with their raw
    scores, the reasons of those that do not, and the names with no GPU inventory."""

    passed: list[str]
    #: The raw policy score of each passed node, in the same order.
    scores: tuple[float, ...]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Demand:
    """A parsed pod as the evaluator needs it: the request and its signatures."""

    request: ShareRequest
    cpu_milli: int
    #: Everything fit and score depend on: the key of the result arrays.
    signature: Hashable
    #: What fit alone depends on (no CPU: kube-scheduler checks CPU itself), so that pods
    #: differing only in CPU share their fit results.
    fit_signature: Hashable


def make_demand(request: ShareRequest, cpu_milli: int) -> Demand:
    """The request with its signatures; two pods with equal signatures get equal results."""
    asks = tuple(
        (a.init, a.threads, a.memory_mib, a.units, a.gpus, a.clients) for a in request.containers
    )
    # UID isolation only matters for shares; whole GPUs and CPU-only pods fit regardless.
    user = request.run_as_user if request.kind == "share" else None
    fit_sig = (request.kind, request.whole_gpus, user, asks)
    return Demand(request, cpu_milli, (fit_sig, cpu_milli), fit_sig)


class _FitTable:
    """The fit results of one fit signature, indexed by state id, shared by the signatures
    that differ only in CPU; `users` counts them."""

    __slots__ = ("fits", "gpu_demands", "key", "nbytes", "packed_demands", "shapes", "users")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.fits: list[FitResult | None] = []
        #: The request's demands per GPU shape, for fit_node to share across nodes.
        self.shapes: ShapeDemands = {}
        #: For the native fit: the demand on each GPU shape by its number in the fit records
        #: (the same objects as in `shapes`), and those demands packed as the C fit reads them.
        self.gpu_demands: list[GpuDemand] = []
        self.packed_demands = b""
        self.users = 0
        self.nbytes = _TABLE_OVERHEAD


def _fit_bytes(fit: FitResult) -> int:
    if isinstance(fit, Misfit):
        return _MISFIT_BYTES + _STR_BYTES + len(fit.reason)
    # Demands are shared between the node's GPUs of one memory size and units (nearly always
    # one object for the whole node: counting it is cheaper than a set of ids).
    demands = fit.demands
    if not demands:
        distinct = 0
    elif all(d is demands[0] for d in demands):
        distinct = 1
    else:
        distinct = len({id(d) for d in demands})
    return _FIT_BYTES + _ITEM_BYTES * (len(fit.gpus) + len(fit.demands)) + _DEMAND_BYTES * distinct


class Results:
    """One signature's results, indexed by state id."""

    __slots__ = ("fits", "gpu", "nbytes", "reasons", "score", "shapes", "status", "table")

    def __init__(self, table: _FitTable) -> None:
        self.status = bytearray()
        self.score = array("d")
        self.gpu = array("b")
        #: The reason of each state that does not fit, one shared string per distinct reason.
        #: Derivable from `fits`, kept because a filter then reads a hundred nodes' reasons
        #: without touching their Misfit objects: 62 against 96 us with cold caches (measured).
        self.reasons: list[str] = []
        #: The fit results of the signature's fit signature (shared with other CPU sizes).
        self.table = table
        self.fits = table.fits
        #: The policy's view of the pod per thread percent it takes on a node's GPU (one per
        #: GPU memory size in the cluster), with its number in the shared scores: built once
        #: per signature, not once per node state (a frozen dataclass's construction was a
        #: tenth of a filter's CPU).
        self.shapes: dict[int, tuple[PodShape, int]] = {}
        #: Estimated bytes of the arrays above (the fit table counts its own).
        self.nbytes = _RESULTS_OVERHEAD

    def grow(self, size: int) -> None:
        missing = size - len(self.status)
        if missing > 0:
            self.status.extend(bytes(missing))
            self.score.frombytes(bytes(8 * missing))
            self.gpu.frombytes(b"\xff" * missing)  # -1: no GPU chosen
            self.reasons.extend([""] * missing)


def _gpu_key(g: GpuUsage) -> tuple[object, ...]:
    cap = g.capacity
    uids = tuple(sorted(g.uids, key=lambda u: -1 if u is None else u)) if g.uids else ()
    return (
        g.info.memory_mib,
        g.info.units,
        g.info.model,
        cap.threads,
        cap.memory_mib,
        cap.clients,
        cap.client_overhead_mib,
        g.threads,
        g.memory_mib,
        g.clients,
        g.owner is not None,
        len(g.extra_owners),
        len(g.shares),
        uids,
    )


def _pick_status(status: bytearray, sids: tuple[int, ...], *, native: bool) -> bytes:
    """The status byte of each state of `sids`: in one C pass in the compiled build (without
    itemgetter's tuple of ints between), else `bytes(_pick(...))`."""
    pick = _native.PICK_BYTES if native else None
    if pick is not None:
        return pick(status, sids)
    return bytes(_pick(status, sids))


def _pick_scores(score: array[float], sids: tuple[int, ...], *, native: bool) -> tuple[float, ...]:
    """The score of each state of `sids`: in one C pass in the compiled build (without a
    subscript call per item), else `_pick`."""
    pick = _native.PICK_DOUBLES if native else None
    if pick is not None:
        return pick(score, sids)
    return _pick(score, sids)


def _pick(source: Any, keys: Sequence[Any]) -> tuple[Any, ...]:
    """`tuple(source[k] for k in keys)` in one C call (itemgetter returns a bare item for one
    key, hence the special cases)."""
    if len(keys) > 1:
        return itemgetter(*keys)(source)  # type: ignore[no-any-return]
    return (source[keys[0]],) if keys else ()


class Evaluator:
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
        self.ledger = ledger
        self.budgets = budgets
        #: Whether the compiled build's C parts may compute (fit, score, gathers).
        self._compiled = native
        policy = self._plain(policy)
        self.policy = policy
        self._cpu_free = cpu_free
        #: Bumped on every change that can alter any result: a touched node, a new policy.
        self.epoch = 0
        #: Results `sweep` computed itself, none being known yet (a filter or prioritize call
        #: waited for them): what warming ahead did not foresee.
        self.swept_results = 0
        #: (epoch after the change, node touched or None for a change to every node), newest
        #: last: what changed since an epoch, for callers that keep results across calls.
        self._touches: deque[tuple[int, str | None]] = deque(maxlen=TOUCH_LOG)
        self._dirty: set[str] = set()
        self._state_of: dict[str, int] = {}
        #: Index size at the last `compact`; nodes added since are scattered again.
        self._compacted = 0
        #: The policy's view of each state id.
        self._states: list[NodeState] = []
        self._generation: dict[str, int] = {}
        self._intern: dict[tuple[object, ...], int] = {}
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
        self._fits: dict[Hashable, _FitTable] = {}
        self._orphans: dict[Hashable, _FitTable] = {}
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
        #: The compiled build's C share fit (None in the pure build), the packed fit record of
        #: each state id it can fit (`fit_record`), and the GPU shapes (memory MiB, units) the
        #: records number, with a GPU of each shape to compute a request's demand on.
        #: (`native=False` computes in Python where the C extension is installed too: the
        #: tests compare the two.)
        self._fit_share = _native.FIT_SHARE if native else None
        #: The C fit and score in one call (None in the pure build), for FGD's descent: the
        #: policy when it is one, whose native plans it scores with.
        self._fill_share = _native.FILL_SHARE if native else None
        self._fgd = policy if isinstance(policy, FgdPolicy) else None
        self._records: list[bytes | None] = []
        self._gpu_shapes: dict[tuple[int, int], int] = {}
        self._shape_infos: list[GpuInfo] = []

    # -- node state -----------------------------------------------------------------------

    def touch(self, node: str) -> None:
        """The node's usage, inventory or free CPU changed."""
        self._dirty.add(node)
        self.epoch += 1
        self._touches.append((self.epoch, node))

    def touched_since(self, epoch: int) -> Set[str] | None:
        """The nodes whose results may have changed since `epoch` (an earlier `self.epoch`),
        or None when every node's may have (a new policy) or the log no longer reaches back."""
        if epoch == self.epoch:
            return frozenset()
        touches = self._touches
        if not touches or touches[0][0] > epoch + 1:
            return None
        names: set[str] = set()
        for at, name in reversed(touches):
            if at <= epoch:
                break
            if name is None:
                return None
            names.add(name)
        return names

    def _plain(self, policy: Policy) -> Policy:
        """`policy`, scoring in Python only where the evaluator is (`native=False`)."""
        if not self._compiled and isinstance(policy, FgdPolicy) and policy.compiled:
            return replace(policy, compiled=False)
        return policy

    def set_policy(self, policy: Policy) -> None:
        policy = self._plain(policy)
        self.policy = policy
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

    def _restate(self, name: str) -> None:
        usage = self.ledger.get_node(name)
        if usage is None:
            self._state_of.pop(name, None)
            self._generation.pop(name, None)
            return
        cpu = self._cpu_free(name)
        key = (
            usage.inventory.multi_user,
            usage.held_elsewhere,
            len(usage.unplaced),
            cpu,
            tuple(_gpu_key(g) for g in usage.gpus),
        )
        sid = self._intern.get(key)
        if sid is None:
            # Equal state ids are equal policy views and fit inputs: one of each serves them
            # all, read by the id (a list index) where a fill needs it.
            sid = self._intern[key] = len(self._intern)
            self._states.append(node_state(usage, cpu, proportional=self.budgets.proportional))
            if self._fit_share is not None:
                self._records.append(self.fit_record(usage))
        self._state_of[name] = sid
        self._generation[name] = usage.generation

    def fit_record(self, usage: NodeUsage) -> bytes | None:
        """The node's GPUs packed as the C share fit reads them (`_native.c`, FIT_WORDS per
        GPU: what `ledger.share_cause` reads of it), or None where only the Python fit
        decides: no GPUs, GPUs held elsewhere, allocations it cannot place, more GPUs than
        the C fit takes, or figures past 64 bits."""
        gpus = usage.gpus
        if not gpus or usage.held_elsewhere or usage.unplaced or len(gpus) > _native.MAX_GPUS:
            return None
        words = [len(gpus), int(usage.inventory.multi_user)]
        for g in gpus:
            info, cap, uids = g.info, g.capacity, g.uids
            if not uids:
                kind, uid = _UIDS_NONE, 0
            elif uids_mixed(uids):
                kind, uid = _UIDS_MANY, 0
            else:
                only = next(iter(uids))
                kind, uid = (_UIDS_UNSET, 0) if only is None else (_UIDS_ONE, only)
            words += (
                info.index,
                self._gpu_shape(info),
                cap.threads,
                cap.memory_mib,
                cap.clients,
                cap.client_overhead_mib,
                g.threads,
                g.memory_mib,
                g.clients,
                int(g.owner is not None),
                kind,
                uid,
            )
        try:
            return array("q", words).tobytes()
        except OverflowError:
            return None

    def _gpu_shape(self, info: GpuInfo) -> int:
        """The number of the GPU's shape (memory MiB, units: what a share's demand depends
        on) in the fit records; numbers are never reused."""
        key = (info.memory_mib, info.units)
        found = self._gpu_shapes.get(key)
        if found is None:
            found = self._gpu_shapes[key] = len(self._shape_infos)
            self._shape_infos.append(info)
        return found

    def _native_fit(
        self, sid: int, name: str, request: ShareRequest, table: _FitTable
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

    def _packed_demands(self, request: ShareRequest, table: _FitTable) -> bytes:
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
                    d = demand_on(request, info, self.budgets)
                    known = table.shapes[shape] = (d, share_probe(request, d))
                added.append(known[0])
            size = _SHAPE_BYTES * (len(table.shapes) - shapes)
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

    def compact(self) -> None:
        """Rebuild the name index with fresh key strings allocated one after another, in name
        order. A filter call looks up every candidate name: with keys scattered over the heap
        (as the cluster's objects left them) each lookup misses the CPU cache two or three
        times; packed, the index stays in a few hundred KB. Measured with the cache flushed
        between calls, a 500-name filter drops from ~720 to ~520 us."""
        # The ids are fresh int objects too (`sid + 1 - 1` is a new object above 256): the
        # lookup increments each value's reference count, another cache line per name.
        self._state_of = {
            name.encode().decode(): sid + 1 - 1 for name, sid in sorted(self._state_of.items())
        }
        self._compacted = len(self._state_of)

    def state_ids(self) -> dict[str, int]:
        """Node name → state id, for every node with an inventory (after `refresh`)."""
        return self._state_of

    def node_state(self, name: str) -> NodeState | None:
        sid = self._state_of.get(name)
        return None if sid is None else self._states[sid]

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
            grown = _RESULT_BYTES_PER_STATE * (size - len(found.status))
            found.grow(size)
            found.nbytes += grown
            self.nbytes += grown
        if len(found.fits) < size:
            missing = size - len(found.fits)
            found.fits.extend([None] * missing)
            found.table.nbytes += _FIT_BYTES_PER_STATE * missing
            self.nbytes += _FIT_BYTES_PER_STATE * missing
        if self.nbytes > self._max_bytes:
            self._evict(found)
        return found

    def _new_results(self, demand: Demand) -> Results:
        key = demand.fit_signature
        table = self._fits.get(key)
        if table is None:
            table = self._fits[key] = _FitTable(key)
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
            size = _POD_SHAPE_BYTES if results.shapes else _POD_SHAPE_FIRST_BYTES
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
            self._score_bytes += _SCORE_BYTES
            self.nbytes += _SCORE_BYTES
            if self._score_bytes * _SCORES_SHARE > self._max_bytes:
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
        size = _fit_bytes(fit) + _SHAPE_BYTES * (len(table.shapes) - shapes)
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
            self._score_bytes += _SHAPE_ID_BYTES
            self.nbytes += _SHAPE_ID_BYTES
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
        if self._reason_bytes * _REASONS_SHARE > self._max_bytes:
            self.nbytes -= self._reason_bytes
            self._reasons.clear()
            self._reason_bytes = 0
        self._reasons[reason] = reason
        size = 2 * _ITEM_BYTES + _STR_BYTES + len(reason)
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
        scheduler's loop, numpy's per-call overhead cost more than its vector loops saved
        (measured, 500 candidates)."""
        results = self.results(demand)
        unknown: list[str] = []
        try:
            sids = _pick(self._state_of, names)
        except KeyError:
            found = list(map(self._state_of.get, names))
            known = [sid is not None for sid in found]
            unknown = [name for name, k in zip(names, known, strict=True) if not k]
            names = list(compress(names, known))
            sids = tuple(sid for sid in found if sid is not None)
        status = results.status
        native = self._compiled
        states = _pick_status(status, sids, native=native)
        if UNKNOWN in states:
            for name, sid in zip(names, sids, strict=True):
                if not status[sid]:
                    self.fill(results, demand, name)
                    self.swept_results += 1
            states = _pick_status(status, sids, native=native)
        fit = states.translate(_IS_FIT)
        everything = 0 not in fit
        fit_sids = sids if everything else tuple(compress(sids, fit))
        out = Sweep(
            list(names) if everything else list(compress(names, fit)),
            _pick_scores(results.score, fit_sids, native=native),
            unknown=unknown,
        )
        if not everything:
            for table, target in ((_IS_ROOM, out.failed), (_IS_NEVER, out.unresolvable)):
                mask = states.translate(table)
                if 1 in mask:
                    reasons = _pick(results.reasons, tuple(compress(sids, mask)))
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
