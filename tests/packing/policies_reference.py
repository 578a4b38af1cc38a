"""A frozen copy of the default policy's fragmentation measure and FGD score as they were
before they were made cheaper per call (frag.py, fgd.py at 120293d): the reference that
test_policies.py holds the current code to, bit for bit, so that the extender and the trace
simulator keep making the same decisions and the published quality figures stay put.
Not to be changed along with the code it checks; `mix_leftover`, `fgd_score` and the node-type
rules (scarcity.py) are imported, as they are not part of what was reorganised. Changed once
since, with the rule (issue 30): every type counts with its popularity on every node type, a
node type's look-ahead weight falls with the share of it pinned pods need (none at all past
1), every node type looks ahead with the mix it can host, and where some node type is
contested the others score no lower than FGD's measure scores them and the contested ones no
higher."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from extender.packing.policies.base import WHOLE, NodeState, PodShape, Workload
from extender.packing.policies.fgd import fgd_score
from extender.packing.policies.frag import MEMO_LIMIT, Leftover, mix_leftover
from extender.packing.policies.scarcity import NodeTypes, can_host, pinned_load

_Task = tuple[int, int, frozenset[str], float]

#: A compiled workload: (weight of the CPU-only types, per-size groups), where each group is
#: (size, tasks of that size, weight of this and every larger size), by size.
_Table = tuple[float, tuple[tuple[int, tuple[_Task, ...], float], ...]]


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
        groups.setdefault(need, []).append((s.cpu_milli, s.gpus, s.models, p))
    sizes = sorted(groups.items())
    rest = [sum(t[3] for _, g in sizes[i:] for t in g) for i in range(len(sizes))]
    return cpu_only, tuple((need, tuple(g), r) for (need, g), r in zip(sizes, rest, strict=True))


@dataclass(slots=True)
class ReferenceFragmentation:
    """F_n(M) for one workload and look-ahead weight, memoised (it is a pure function of the node
    state, and of the multiset of free amounts rather than their order). The workload is
    compiled into per-size groups, so one evaluation looks at each distinct per-GPU size once,
    with a binary search in the sorted free amounts instead of a scan per task type.

    With `types` (the cluster's node types), a contested node type looks ahead less, and with
    `mix` the others are filled with the task types they can host (by popularity)."""

    workload: Workload
    #: Weight of L in [0, 1]; 0 gives FGD's measure exactly.
    lookahead: float = 0.0
    #: The cluster's node types for the arrival weights; () weighs by popularity (FGD).
    types: NodeTypes = ()
    #: Look ahead with the workload's mix (M) instead of one type at a time (L).
    mix: bool = False
    _memo: dict[tuple[str, int, tuple[int, ...]], float] = field(
        default_factory=dict, init=False, repr=False
    )
    _base: _Table = field(default=(0.0, ()), init=False, repr=False)
    _tables: dict[tuple[str, int], _Table] = field(default_factory=dict, init=False, repr=False)
    _left: Leftover = field(default=(), init=False, repr=False)
    _lefts: dict[tuple[str, int], Leftover] = field(default_factory=dict, init=False, repr=False)
    _ws: dict[tuple[str, int], float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.lookahead <= 1.0:
            raise ValueError(f"lookahead weight must be in [0, 1], got {self.lookahead}")
        self._base = _compile(self.workload, [tp.popularity for tp in self.workload])
        self._left = mix_leftover(self.workload, [tp.popularity for tp in self.workload])
        popularities = [tp.popularity for tp in self.workload]
        for node_type in self.types:
            key = node_type.key
            self._tables[key] = _compile(self.workload, popularities)
            load = pinned_load(node_type, self.workload, self.types)
            self._ws[key] = self.lookahead * max(0.0, 1.0 - load)
            if self.mix:
                hosted = [
                    p if can_host(node_type, tp.shape) else 0.0
                    for tp, p in zip(self.workload, popularities, strict=True)
                ]
                self._lefts[key] = mix_leftover(self.workload, hosted)

    def __call__(self, node: NodeState) -> float:
        return self.value(node.model, node.cpu_free_milli, node.gpu_free)

    def value(self, model: str, cpu_free_milli: int, gpu_free: tuple[int, ...]) -> float:
        """F of the node (model, free CPU, free threads per GPU in any order)."""
        key = (model, cpu_free_milli, tuple(sorted(gpu_free)))
        memo = self._memo
        value = memo.get(key)
        if value is None:
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            value = memo[key] = self._compute(*key)
        return value

    def _compute(self, model: str, cpu: int, free: tuple[int, ...]) -> float:
        """F of a node whose free amounts are sorted ascending."""
        idle = sum(free)
        if idle == 0:
            return 0.0
        n = len(free)
        w = self._ws.get((model, n), self.lookahead)
        cpu_only, table = self._tables.get((model, n), self._base)
        total = cpu_only * idle
        prefix = [0, *accumulate(free)]
        top = free[-1]
        # M's GPU room: what the node type's mix is expected to fill (used with `mix` only).
        room = 0.0
        mix = self.mix and w > 0.0
        if mix:
            left = self._lefts.get((model, n), self._left)
            for f in free:
                room += f - (left[f] if f <= WHOLE else left[WHOLE] + (f - WHOLE))
        for need, tasks, rest in table:
            if need > top:
                # No GPU holds this size or any larger one: every such type counts all idle.
                total += rest * idle
                break
            k = bisect_left(free, need)
            big = n - k
            sliver = prefix[k]
            slots = -1
            for t_cpu, t_gpus, t_models, p in tasks:
                if big < t_gpus or cpu < t_cpu or (t_models and model not in t_models):
                    total += p * idle
                    continue
                if not w:
                    total += p * sliver
                    continue
                if mix:
                    fill = room
                    if t_cpu > 0:
                        by_cpu = float(cpu // t_cpu * need * t_gpus)
                        if by_cpu < fill:
                            fill = by_cpu
                    total += p * ((1.0 - w) * sliver + w * (idle - fill))
                    continue
                if need >= WHOLE:
                    times = big // t_gpus
                else:
                    if slots < 0:
                        slots = sum(f // need for f in free[k:])
                    times = slots
                if t_cpu > 0 and cpu // t_cpu < times:
                    times = cpu // t_cpu
                total += p * ((1.0 - w) * sliver + w * (idle - times * need * t_gpus))
        return total


@dataclass(slots=True)
class ReferenceFgdPolicy:
    """FgdPolicy's score as it was, on a ReferenceFragmentation."""

    workload: Workload
    lookahead: float = 0.0
    types: NodeTypes = ()
    mix: bool = False
    frag: ReferenceFragmentation = field(init=False)
    plain: ReferenceFragmentation = field(init=False)
    floored: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)
    capped: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)
    reserved: frozenset[tuple[str, int]] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        self.frag = ReferenceFragmentation(self.workload, self.lookahead, self.types, self.mix)
        self.plain = ReferenceFragmentation(self.workload)
        loads = {t.key: pinned_load(t, self.workload, self.types) for t in self.types}
        if any(loads.values()) and self.lookahead > 0.0:
            self.floored = frozenset(k for k, v in loads.items() if not v)
            self.capped = frozenset(k for k, v in loads.items() if 0.0 < v < 1.0)
            self.reserved = frozenset(k for k, v in loads.items() if v >= 1.0)

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        s, g = self._score(node, pod, candidates)
        if (node.model, len(node.gpu_free)) in self.reserved and any(
            t.key not in self.reserved and can_host(t, pod) for t in self.types
        ):
            return s - 101.0, g
        return s, g

    def _score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        model, free = node.model, node.gpu_free
        start, cpu_start = node.gpu_free, node.cpu_free_milli
        cpu = node.cpu_free_milli - pod.cpu_milli
        look, plain = self.frag.value, self.plain.value
        floored = (model, len(free)) in self.floored
        capped = (model, len(free)) in self.capped

        def delta_score(after: tuple[int, ...]) -> int:
            s = fgd_score(look(model, cpu_start, start) - look(model, cpu, after))
            if floored or capped:
                base = fgd_score(plain(model, cpu_start, start) - plain(model, cpu, after))
                s = max(s, base) if floored else min(s, base)
            return s

        if not pod.is_share:
            if pod.gpus:
                left = list(free)
                for g in sorted(candidates)[: pod.gpus]:
                    left[g] = 0
                free = tuple(left)
            return delta_score(free), None
        best = -1
        chosen: int | None = None
        tried: dict[int, int] = {}
        for g in candidates:
            f = free[g]
            s = tried.get(f)
            if s is None:
                left = list(free)
                left[g] = f - pod.threads
                s = tried[f] = delta_score(tuple(left))
            if s > best or (s == best and chosen is not None and f < free[chosen]):
                best, chosen = s, g
        return float(best), chosen
