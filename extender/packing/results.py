"""The evaluator's result caches: one request shape's results per state id, the fit results
shared by the shapes that differ only in CPU, and the estimate of their bytes that bounds them.

Owns the records (`Demand` and its signatures, `Results`, the fit tables, a sweep's answer
`Sweep`), the status bytes of a result array and the byte estimates, measured with tracemalloc
(tests/packing/test_evaluate_bounds.py checks the estimate against it).

The result arrays, the fit results and the reason strings are bounded together in bytes
(truth rule 6 of docs/design.md), by an estimate kept as they grow: every new request shape adds
arrays as long as the state index, so a count of signatures bounds nothing at 5,000 nodes, and a
stream of distinct shapes would grow the caches without end. Past the budget the least recently
used signatures go, then fit tables no signature uses any more.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

from extender.packing import native as _native
from extender.packing.fit import FitResult, Misfit, ShapeDemands
from extender.packing.policies import PodShape
from extender.packing.request import Demand as GpuDemand
from extender.packing.request import ShareRequest

#: Bytes the result caches may hold by default, by their own estimate. A share shape computed
#: on every node costs ~250 bytes per node (the Fit objects dominate), ~1.2 MB at 5,000 nodes:
#: 128 MiB holds ~100 such shapes there, and all of a few hundred nodes' shapes in practice.
DEFAULT_MAX_BYTES: Final = 128 << 20
#: Estimated bytes, measured with tracemalloc (tests/packing/test_evaluate_bounds.py checks the
#: estimate against it): per state id, a signature's arrays (status 1, score 8, GPU 1, reason
#: pointer 8, plus the arrays' over-allocation) and a fit table's pointer;
RESULT_BYTES_PER_STATE: Final = 20
FIT_BYTES_PER_STATE: Final = 9
#: fixed costs of a signature's Results and of a fit table (objects, headers, dict slots);
RESULTS_OVERHEAD: Final = 600
TABLE_OVERHEAD: Final = 200
#: a Misfit besides its reason string, a Fit besides its tuples' items, per tuple item, per
#: distinct Demand object, and a str object besides its characters.
MISFIT_BYTES: Final = 80
FIT_BYTES: Final = 150
ITEM_BYTES: Final = 8
DEMAND_BYTES: Final = 90
STR_BYTES: Final = 49
#: A fit table's demand for one GPU shape (shared by all its nodes).
SHAPE_BYTES: Final = 400
#: A signature's first pod shape with its memo dict, and each further one (tracemalloc: 540
#: bytes for a one-entry dict with its PodShape).
POD_SHAPE_FIRST_BYTES: Final = 540
POD_SHAPE_BYTES: Final = 300
#: The share of the budget the reason strings' index may take before it is emptied.
REASONS_SHARE: Final = 16
#: A shared score: its key (state id, PodShape, candidate tuple, share flag), its value
#: (score, GPU) and its dict slot; the shape and candidates are the Results' and the Fit's own.
SCORE_BYTES: Final = 230
#: The share of the budget the shared scores may take before they are emptied.
SCORES_SHARE: Final = 8
#: A pod shape's number for the shared scores (a dict slot and an int).
SHAPE_ID_BYTES: Final = 100
#: Status bytes of a result array.
UNKNOWN: Final = 0
FITS: Final = 1
NO_ROOM: Final = 2  # resolvable: evicting pods could make room
NEVER: Final = 3  # unresolvable
#: Status bytes → 1 where the status is the one named, 0 elsewhere (bytes.translate tables).
IS_FIT: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x01\x00\x00")
IS_ROOM: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x00\x01\x00")
IS_NEVER: Final = bytes.maketrans(b"\x00\x01\x02\x03", b"\x00\x00\x00\x01")


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


class FitTable:
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
        self.nbytes = TABLE_OVERHEAD


def fit_bytes(fit: FitResult) -> int:
    if isinstance(fit, Misfit):
        return MISFIT_BYTES + STR_BYTES + len(fit.reason)
    # Demands are shared between the node's GPUs of one memory size and units (nearly always
    # one object for the whole node: counting it is cheaper than a set of ids).
    demands = fit.demands
    if not demands:
        distinct = 0
    elif all(d is demands[0] for d in demands):
        distinct = 1
    else:
        distinct = len({id(d) for d in demands})
    return FIT_BYTES + ITEM_BYTES * (len(fit.gpus) + len(fit.demands)) + DEMAND_BYTES * distinct


class Results:
    """One signature's results, indexed by state id."""

    __slots__ = ("fits", "gpu", "nbytes", "reasons", "score", "shapes", "status", "table")

    def __init__(self, table: FitTable) -> None:
        self.status = bytearray()
        self.score = array("d")
        self.gpu = array("b")
        #: The reason of each state that does not fit, one shared string per distinct reason.
        #: Derivable from `fits`, kept because a filter then reads a hundred nodes' reasons
        #: without touching their Misfit objects, markedly cheaper with cold caches.
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
        self.nbytes = RESULTS_OVERHEAD

    def grow(self, size: int) -> None:
        missing = size - len(self.status)
        if missing > 0:
            self.status.extend(bytes(missing))
            self.score.frombytes(bytes(8 * missing))
            self.gpu.frombytes(b"\xff" * missing)  # -1: no GPU chosen
            self.reasons.extend([""] * missing)


def pick_status(status: bytearray, sids: tuple[int, ...], *, native: bool) -> bytes:
    """The status byte of each state of `sids`: in one C pass in the compiled build (without
    itemgetter's tuple of ints between), else `bytes(pick_items(...))`."""
    pick = _native.PICK_BYTES if native else None
    if pick is not None:
        return pick(status, sids)
    return bytes(pick_items(status, sids))


def pick_scores(score: array[float], sids: tuple[int, ...], *, native: bool) -> tuple[float, ...]:
    """The score of each state of `sids`: in one C pass in the compiled build (without a
    subscript call per item), else `pick_items`."""
    pick = _native.PICK_DOUBLES if native else None
    if pick is not None:
        return pick(score, sids)
    return pick_items(score, sids)


def pick_items(source: Any, keys: Sequence[Any]) -> tuple[Any, ...]:
    """`tuple(source[k] for k in keys)` in one C call (itemgetter returns a bare item for one
    key, hence the special cases)."""
    if len(keys) > 1:
        return itemgetter(*keys)(source)  # type: ignore[no-any-return]
    return (source[keys[0]],) if keys else ()
