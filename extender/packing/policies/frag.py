"""GPU fragmentation of a node with respect to a typical-pod workload, in thread-percent units
(1 thread % = 10 paper milli): FGD's one-step measure and mpsched's look-ahead measure.

FGD (the FGD paper, §3), F_n(m): the idle GPU of node n that task type m
cannot use now. If m fits (CPU, model and k GPUs with enough free), only the GPUs too small for
m count; otherwise every idle GPU counts; a CPU-only task counts every idle GPU.

Look-ahead ("fill"), L_n(m): the idle GPU that would still be idle if n kept receiving m until m
no longer fits. m fits floor(free/d) times on a GPU with `free` left (k whole GPUs: floor(idle
GPUs / k) times), and at most floor(free CPU / CPU of m) times in all. So L counts what FGD
counts, plus the remainders on the GPUs m does fit, plus the GPU that runs out of CPU before it
runs out of room: the part FGD cannot see. A G2 node (8 GPUs, 96 cores) that takes a 32-core
CPU-only pod still fits every task type, so FGD sees no change; but 11-core GPU pods can now
use only 5 of its 8 GPUs, and L grows by 3 GPUs for them.

F_n(M) = sum over m of popularity(m) * ((1 - w) * F_n(m) + w * L_n(m)); w = 0 is FGD.

Mix look-ahead ("mix fill", the default policy's; `typefill` uses L), M_n(m): one future for every
task type instead of one per type. A GPU with f free keeps receiving typical GPU pods drawn from
the workload's mix (in proportion to their weights, among those that fit; a k-GPU pod counts once
on each of its GPUs) until none fits; left[f] is the idle it is expected to keep (`mix_leftover`,
one table per node type). The mix is expected to fill R_n = sum over GPUs of (f - left[f]); the
CPU limit stays per type, as in L: M_n(m) = idle - min(R_n, floor(free CPU / CPU of m) * GPU of
one m pod) where m fits now, all idle where it does not. Unlike L, a partly used GPU is not lost
to whole-GPU types (shares will fill it), and a share's remainder counts only as far as the
typical sizes cannot fill it (a 190m sliver beside an 810m share stays nearly all idle; a 530m
one beside a 470m share does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from extender.packing import native
from extender.packing.policies.base import WHOLE, NodeState, Workload
from extender.packing.policies.scarcity import NodeTypes, can_host, pinned_load

if TYPE_CHECKING:
    from extender.packing._native import Plan as NativePlan

#: Memo entries kept before the memo is dropped and rebuilt (bounds memory in a long-running
#: service; a replay of the openb trace touches about 50k distinct node states).
MEMO_LIMIT = 500_000

#: Native plans kept (one per GPU model and GPU count seen) before they are built afresh.
NATIVE_PLAN_LIMIT = 1024

#: left[f] for f = 0..WHOLE: the idle a GPU with f free is expected to keep (`mix_leftover`).
Leftover = tuple[float, ...]


def mix_leftover(workload: Workload, weights: Sequence[float]) -> Leftover:
    """left[f], f = 0..WHOLE: the idle a GPU with f free threads is expected to keep when it
    receives typical GPU pods, each drawn from the workload with its weight among the types that
    still fit (a k-GPU pod counts k times, once per GPU), until none fits. CPU-only types and
    types of weight 0 take no part."""
    sizes: dict[int, float] = {}
    for tp, p in zip(workload, weights, strict=True):
        s = tp.shape
        if s.gpus == 0 or s.threads == 0 or p <= 0.0:
            continue
        need = min(s.threads, WHOLE)
        sizes[need] = sizes.get(need, 0.0) + p * s.gpus
    ranked = sorted(sizes.items())
    left = [0.0] * (WHOLE + 1)
    for f in range(1, WHOLE + 1):
        total = 0.0
        kept = 0.0
        for need, q in ranked:
            if need > f:
                break
            total += q
            kept += q * left[f - need]
        left[f] = kept / total if total > 0.0 else float(f)
    return tuple(left)


def _left(left: Leftover, f: int) -> float:
    """left[f]; free amounts above a whole GPU (oversubscription) keep their excess."""
    return left[f] if f <= WHOLE else left[WHOLE] + (f - WHOLE)


#: A compiled task type: (CPU millicores, GPU count, allowed models, popularity, GPU of one pod:
#: size × GPU count).
_Task = tuple[int, int, frozenset[str], float, int]
#: A compiled workload: (weight of the CPU-only types, per-size groups), where each group is
#: (size, tasks of that size, weight of this and every larger size), by size.
_Table = tuple[float, tuple[tuple[int, tuple[_Task, ...], float], ...]]
#: Per node type: its compiled workload, its mix's `left` and gap[f] = f - left[f] for
#: f = 0..WHOLE (what the mix is expected to fill on a GPU with f free); both with `mix` only,
#: else empty.
_Plan = tuple[_Table, Leftover, tuple[float, ...], float]


def _compile(workload: Workload, weights: Sequence[float]) -> _Table:
    cpu_only = 0.0
    groups: dict[int, list[_Task]] = {}
    for tp, p in zip(workload, weights, strict=True):
        s = tp.shape
        if s.gpus == 0 or s.threads == 0:
            # Never uses idle GPU: the full idle counts in both measures.
            cpu_only += p
            continue
        if p == 0.0:
            continue
        need = min(s.threads, WHOLE)
        groups.setdefault(need, []).append((s.cpu_milli, s.gpus, s.models, p, need * s.gpus))
    sizes = sorted(groups.items())
    rest = [sum(t[3] for _, g in sizes[i:] for t in g) for i in range(len(sizes))]
    return cpu_only, tuple((need, tuple(g), r) for (need, g), r in zip(sizes, rest, strict=True))


def _gaps(left: Leftover) -> tuple[float, ...]:
    # The same subtraction M's room makes per GPU, done once per free amount instead.
    return tuple(f - left[f] for f in range(len(left)))


def _room(free: tuple[int, ...], top: int, left: Leftover, gaps: tuple[float, ...]) -> float:
    """M's GPU room on a node whose free amounts are sorted ascending (`top` the largest):
    what the node type's mix is expected to fill."""
    room = 0.0
    if free[0] >= 0 and top <= WHOLE:
        for f in free:
            room += gaps[f]
    else:
        for f in free:
            room += f - _left(left, f)
    return room


@dataclass(slots=True)
class Fragmentation:
    """F_n(M) for one workload and look-ahead weight, memoised (it is a pure function of the node
    state, and of the multiset of free amounts rather than their order). The workload is
    compiled into per-size groups, so one evaluation looks at each distinct per-GPU size once,
    with one walk up the sorted free amounts instead of a scan per task type.

    Every task type counts with its popularity on every node, as in FGD. With `types` (the
    cluster's node types), a node type's look-ahead weight is `lookahead` × (1 - its pinned
    load), none past 1 (`scarcity.pinned_load`: FGD's measure where pinned pods need the
    whole node type), and with `mix` each is filled with the typical pods it can host
    (`scarcity.can_host`: pinned types only on their models). A node whose (model, GPU count)
    is not in `types` looks ahead with the whole workload's mix.

    With `mix`, the look-ahead is the mix fill M (module docstring) instead of L.

    The arithmetic is the published figures': every float operation is made on the same
    operands in the same order as when they were produced (tests/packing/policies_reference.py
    holds it to that bit for bit); what is done once per table or per node state instead of
    once per task type gives the same values."""

    workload: Workload
    #: Weight of L in [0, 1]; 0 gives FGD's measure exactly.
    lookahead: float = 0.0
    #: The cluster's node types (what each can host, how much pinned pods need it); () looks
    #: ahead the same way on every node.
    types: NodeTypes = ()
    #: Look ahead with the workload's mix (M) instead of one type at a time (L).
    mix: bool = False
    #: Measure with the compiled build's C plans where it has them (False: in Python only).
    compiled: bool = True
    #: Every pod shape seen with its share of the pods (coverage 1), which the pinned loads
    #: are computed from; () takes `workload`'s. The typical workload's cut drops rare shapes,
    #: and pinned shapes, each split over the models it names, are the rare ones.
    demand: Workload = ()
    #: The node types (model, GPU count) whose scores FGD's must floor (scarcity.py): the
    #: uncontested ones, where some are contested and the measure looks ahead.
    floored: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)
    #: The node types whose scores FGD's must cap: the contested ones that still look ahead
    #: (pinned load between 0 and 1).
    capped: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)
    #: The node types pinned pods alone are expected to fill (pinned load 1 or more), where
    #: the measure looks ahead elsewhere: a pod that may run on another node type is placed
    #: there last (`FgdPolicy.score`).
    reserved: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)
    _memo: dict[tuple[str, int, tuple[int, ...]], float] = field(
        default_factory=dict, init=False, repr=False
    )
    _base: _Plan = field(default=((0.0, ()), (), (), 0.0), init=False, repr=False)
    _plans: dict[tuple[str, int], _Plan] = field(default_factory=dict, init=False, repr=False)
    #: The C plan class (None in the pure build) and its plans by (model, GPU count).
    _native: type[NativePlan] | None = field(default=None, init=False, repr=False)
    _natives: dict[tuple[str, int], NativePlan | None] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.lookahead <= 1.0:
            raise ValueError(f"lookahead weight must be in [0, 1], got {self.lookahead}")
        popularities = [tp.popularity for tp in self.workload]
        left: Leftover = mix_leftover(self.workload, popularities) if self.mix else ()
        self._base = (_compile(self.workload, popularities), left, _gaps(left), self.lookahead)
        table = self._base[0]
        demand = self.demand or self.workload
        loads = [pinned_load(t, demand, self.types) for t in self.types]
        if any(loads) and self.lookahead > 0.0:
            # Scores FGD's must bound (scarcity.py): uncontested types from below, the
            # contested ones that still look ahead from above.
            self.floored = frozenset(t.key for t, v in zip(self.types, loads, strict=True) if not v)
            self.capped = frozenset(
                t.key for t, v in zip(self.types, loads, strict=True) if 0.0 < v < 1.0
            )
            self.reserved = frozenset(
                t.key for t, v in zip(self.types, loads, strict=True) if v >= 1.0
            )
        for node_type, load in zip(self.types, loads, strict=True):
            # The look-ahead gives way to FGD's measure as far as pinned pods need the node
            # type (scarcity.py says why).
            w = self.lookahead * max(0.0, 1.0 - load)
            left = ()
            if self.mix and w > 0.0:
                # The mix a node is filled with: the typical pods that may run there.
                hosted = [
                    tp.popularity if can_host(node_type, tp.shape) else 0.0 for tp in self.workload
                ]
                left = mix_leftover(self.workload, hosted)
            self._plans[node_type.key] = (table, left, _gaps(left), w)
        self._native = native.PLAN if self.compiled else None

    def native_plan(self, model: str, gpus: int) -> NativePlan | None:
        """The measure and the FGD score of nodes of this model and GPU count in C, where the
        compiled build has them (None otherwise): the same plan as `_compute` takes, with
        each task type's model rule decided for `model` once. Same results, bit for bit.
        None too for a workload the C plan cannot hold (a figure past 64 bits, a negative CPU
        ask): Python measures it, and the refusal is remembered like a plan."""
        plan_type = self._native
        if plan_type is None or gpus > native.MAX_GPUS:
            return None
        key = (model, gpus)
        found = self._natives.get(key)
        if found is None and key not in self._natives:
            if len(self._natives) >= NATIVE_PLAN_LIMIT:
                self._natives.clear()
            (cpu_only, groups), left, gaps, w = self._plans.get(key, self._base)
            resolved = tuple(
                (
                    need,
                    tuple(
                        (t_cpu, t_gpus, not t_models or model in t_models, p, t_ask)
                        for t_cpu, t_gpus, t_models, p, t_ask in tasks
                    ),
                    rest,
                )
                for need, tasks, rest in groups
            )
            try:
                found = plan_type(cpu_only, resolved, left, gaps, w, self.mix and w > 0.0)
            except (OverflowError, ValueError):
                found = None
            self._natives[key] = found
        return found

    def __call__(self, node: NodeState) -> float:
        return self.value(node.model, node.cpu_free_milli, node.gpu_free)

    def value(self, model: str, cpu_free_milli: int, gpu_free: tuple[int, ...]) -> float:
        """F of the node (model, free CPU, free threads per GPU in any order)."""
        return self.value_sorted(model, cpu_free_milli, tuple(sorted(gpu_free)))

    def value_sorted(self, model: str, cpu_free_milli: int, free: tuple[int, ...]) -> float:
        """F of the node (model, free CPU, free threads per GPU sorted ascending): `value`
        for a caller that has them sorted already."""
        key = (model, cpu_free_milli, free)
        memo = self._memo
        value = memo.get(key)
        if value is None:
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            value = memo[key] = self._compute(model, cpu_free_milli, free)
        return value

    def _compute(self, model: str, cpu: int, free: tuple[int, ...]) -> float:
        """F of a node whose free amounts are sorted ascending: one walk up them per size, for
        L and M alike (they differ only in the term of a type that fits)."""
        idle = sum(free)
        if idle == 0:
            return 0.0
        n = len(free)
        table, left, gaps, w = self._plans.get((model, n), self._base)
        cpu_only, groups = table
        total = cpu_only * idle
        top = free[-1]
        mix = self.mix and w > 0.0
        room = _room(free, top, left, gaps) if mix else 0.0
        keep = 1.0 - w
        # With the mix, every type that fits and whose CPU does not bind looks ahead to the
        # same room: its look-ahead term is the same float, so it is made once per state.
        open_room = w * (idle - room)
        # free[:k] are the GPUs too small for the current size; sliver = their sum.
        k = 0
        sliver = 0
        for need, tasks, rest in groups:
            if need > top:
                # No GPU holds this size or any larger one: every such type counts all idle.
                total += rest * idle
                break
            while free[k] < need:
                sliver += free[k]
                k += 1
            big = n - k
            kept = keep * sliver
            unlimited = kept + open_room
            slots = -1
            for t_cpu, t_gpus, t_models, p, t_ask in tasks:
                if big < t_gpus or cpu < t_cpu or (t_models and model not in t_models):
                    total += p * idle
                    continue
                if mix:
                    if t_cpu > 0:
                        by_cpu = float(cpu // t_cpu * t_ask)
                        if by_cpu < room:
                            total += p * (kept + w * (idle - by_cpu))
                            continue
                    total += p * unlimited
                    continue
                if not w:
                    total += p * sliver
                    continue
                if need >= WHOLE:
                    times = big // t_gpus
                else:
                    if slots < 0:
                        slots = sum(f // need for f in free[k:])
                    times = slots
                if t_cpu > 0 and cpu // t_cpu < times:
                    times = cpu // t_cpu
                total += p * (kept + w * (idle - times * t_ask))
        return total
