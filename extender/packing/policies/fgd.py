"""FGD, Fragmentation Gradient Descent (Weng et al., USENIX ATC '23), as the paper's simulator
implements it: place the pod where the workload-weighted fragmentation grows least; and
mpsched's default policy, the same descent on a fragmentation measure that looks ahead (frag.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from extender.packing.policies.base import NodeState, PodShape, Policy, Workload
from extender.packing.policies.frag import MEMO_LIMIT, Fragmentation
from extender.packing.policies.scarcity import NodeTypes, can_host

if TYPE_CHECKING:
    from extender.packing._native import Plan as NativePlan

#: The paper's Δ is in milli-GPU and divided by 1000 before the sigmoid; in thread percent
#: (1 % = 10 milli) that is a division by 100.
DELTA_SCALE = 100.0
#: sigmoid(±50) is 0 or 1 to double precision; clamping keeps exp() from overflowing.
EXP_LIMIT = 50.0
#: What a reserved node type's score loses for a pod that may go elsewhere: more than the
#: whole score range, so every other node it fits ranks first.
RESERVE = 101.0


def fgd_score(delta: float) -> int:
    """int(100 * sigmoid(Δ / 1000 milli)). The integer truncation is part of the algorithm:
    it makes many nodes tie, and ties go to a random node order (reference §5: using the raw Δ
    instead drops FGD from 95.2 % to 92.1 % on the openb trace)."""
    x = max(-EXP_LIMIT, min(EXP_LIMIT, delta / DELTA_SCALE))
    return int(100.0 / (1.0 + math.exp(-x)))


@dataclass(slots=True)
class FgdPolicy:
    """Score = fgd_score(F_n(M) - F_n'(M)). A share goes to the candidate GPU with the highest
    score; among GPUs with equal (integer) scores, the one with the least free threads (then
    the lowest index). The paper's simulator takes the lowest index among equal scores; taking
    the tightest makes the choice independent of GPU order (so one cache entry serves every
    permutation of a node) and replays the paper's figures all the same.

    Pure as a function; it memoises F per node state internally (bounded), which a caller
    need not know about. Not thread-safe: call it from one thread (the event loop). In the
    compiled build the score is computed by the C plan of the node's type (`native_plan`),
    which repeats the arithmetic below operation for operation."""

    workload: Workload
    name: str = "fgd"
    #: Weight of the look-ahead fragmentation (0: the paper's FGD).
    lookahead: float = 0.0
    #: The cluster's node types: which ones pinned pods contend for, what each can host
    #: (scarcity.py); () looks ahead the same way on every node.
    types: NodeTypes = ()
    #: Look ahead with the workload's mix instead of one type at a time (frag.py): the
    #: default policy does; `typefill` does not.
    mix: bool = False
    #: Score with the compiled build's C plans where it has them (False: in Python only).
    compiled: bool = True
    #: Every pod shape seen, for the pinned loads (`Fragmentation.demand`).
    demand: Workload = ()
    frag: Fragmentation = field(init=False)
    #: FGD's own measure, where some node types' scores are bounded by FGD's
    #: (`Fragmentation.floored`, `Fragmentation.capped`); None elsewhere.
    plain: Fragmentation | None = field(default=None, init=False)
    #: Per pod shape: whether some node type outside `Fragmentation.reserved` can host it.
    _elsewhere: dict[PodShape, bool] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.frag = Fragmentation(
            self.workload,
            self.lookahead,
            self.types,
            self.mix,
            compiled=self.compiled,
            demand=self.demand,
        )
        if self.frag.floored or self.frag.capped:
            self.plain = Fragmentation(self.workload, compiled=self.compiled)

    def native_plan(self, model: str, gpus: int) -> NativePlan | None:
        """The C plan that scores nodes of this model and GPU count, where the compiled build
        has one (`Fragmentation.native_plan`); None for a node type whose score FGD's bounds
        (the C plan scores one measure: Python scores those, from both) or that is reserved
        (the score depends on where else the pod could go)."""
        key = (model, gpus)
        if key in self.frag.floored or key in self.frag.capped or key in self.frag.reserved:
            return None
        return self.frag.native_plan(model, gpus)

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        s, g = self._score(node, pod, candidates)
        if (node.model, len(node.gpu_free)) in self.frag.reserved and self._goes_elsewhere(pod):
            # Below every node of the types pinned pods do not fill (scores are 0..100).
            return s - RESERVE, g
        return s, g

    def _goes_elsewhere(self, pod: PodShape) -> bool:
        known = self._elsewhere.get(pod)
        if known is None:
            if len(self._elsewhere) >= MEMO_LIMIT:
                self._elsewhere.clear()
            reserved = self.frag.reserved
            known = self._elsewhere[pod] = any(
                t.key not in reserved and can_host(t, pod) for t in self.types
            )
        return known

    def _score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        frag = self.frag
        model, free = node.model, node.gpu_free
        native = self.native_plan(model, len(free))
        if native is not None:
            try:
                return native.score(
                    node.cpu_free_milli, free, pod.cpu_milli, pod.threads, pod.gpus, candidates
                )
            except OverflowError:
                pass  # figures past 64 bits: Python's integers measure them below
        # The measure reads free amounts sorted; each state after a placement is derived from
        # the sorted state before it instead of being sorted again.
        ordered = tuple(sorted(free))
        before = frag.value_sorted(model, node.cpu_free_milli, ordered)
        cpu = node.cpu_free_milli - pod.cpu_milli
        key = (model, len(free))
        capped = key in frag.capped
        plain = self.plain if key in frag.floored or capped else None
        # Bounded node types: the look-ahead's score, but never below FGD's on an uncontested
        # node type nor above it on a contested one (scarcity.py).
        plain_before = 0.0
        if plain is not None:
            plain_before = plain.value_sorted(model, node.cpu_free_milli, ordered)

        def scored(after: tuple[int, ...]) -> int:
            s = fgd_score(before - frag.value_sorted(model, cpu, after))
            if plain is None:
                return s
            base = fgd_score(plain_before - plain.value_sorted(model, cpu, after))
            return min(s, base) if capped else max(s, base)

        if not pod.is_share:
            after = ordered
            if pod.gpus:
                left = list(free)
                for g in sorted(candidates)[: pod.gpus]:
                    left[g] = 0
                after = tuple(sorted(left))
            return scored(after), None
        threads = pod.threads
        best = -1
        chosen: int | None = None
        # The candidates' free amounts repeat (most of a node's GPUs are alike): each distinct
        # one is scored once. A node has a handful of GPUs, so a list search beats a dict.
        tried_free: list[int] = []
        tried_score: list[int] = []
        for g in candidates:
            f = free[g]
            if f in tried_free:
                s = tried_score[tried_free.index(f)]
            else:
                s = scored(_taken(ordered, f, threads))
                tried_free.append(f)
                tried_score.append(s)
            if s > best or (s == best and chosen is not None and f < free[chosen]):
                best, chosen = s, g
        return float(best), chosen


def _taken(ordered: tuple[int, ...], f: int, threads: int) -> tuple[int, ...]:
    """`ordered` (ascending) with one GPU's free amount going from `f` to `f - threads`: one f
    taken out, the new amount put in before the amounts it is not above (bisect_left's
    places, found by a scan: a node has a handful of GPUs)."""
    v = f - threads
    out = list(ordered)
    i = out.index(f)
    del out[i]
    j = 0
    while j < i and out[j] < v:
        j += 1
    out.insert(j, v)
    return tuple(out)


def in_python(policy: Policy) -> Policy:
    """`policy`, scoring in Python only (without the compiled build's C plans) where it is
    FGD's; any other policy has none."""
    if isinstance(policy, FgdPolicy) and policy.compiled:
        return replace(policy, compiled=False)
    return policy
