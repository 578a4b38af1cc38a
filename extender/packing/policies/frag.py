"""GPU fragmentation of a node with respect to a typical-pod workload (FGD paper §3,
reference fgd-benchmark.md §3), in thread-percent units (1 thread % = 10 paper milli).

F_n(m): the idle GPU of node n that task type m cannot use. If m fits (CPU, model and k GPUs
with enough free), only the GPUs too small for m count; otherwise every idle GPU counts; a
CPU-only task counts every idle GPU. F_n(M) = sum over m of popularity(m) * F_n(m).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extender.packing.policies.base import WHOLE, NodeState, PodShape, Workload

#: Memo entries kept before the memo is dropped and rebuilt (bounds memory in a long-running
#: service; a replay of the openb trace touches about 50k distinct node states).
MEMO_LIMIT = 500_000


def task_fragmentation(node: NodeState, task: PodShape) -> int:
    """F_n(m) of one task type, in thread percent."""
    idle = sum(node.gpu_free)
    if task.gpus == 0 or task.threads == 0 or not task.allows(node.model):
        return idle
    if node.cpu_free_milli < task.cpu_milli:
        return idle
    need = min(task.threads, WHOLE)
    big = sum(1 for f in node.gpu_free if f >= need)
    if big < task.gpus:
        return idle
    return sum(f for f in node.gpu_free if f < need)


@dataclass(slots=True)
class Fragmentation:
    """F_n(M) for one workload, memoised on the node state (a pure function of it).

    The workload is compiled once into per-size groups so that one evaluation scans the GPUs
    once per distinct size instead of once per task type."""

    workload: Workload
    _memo: dict[NodeState, float] = field(default_factory=dict, init=False, repr=False)
    #: Popularity of task types that never use idle GPU (CPU-only), all charged the full idle.
    _cpu_only: float = field(default=0.0, init=False, repr=False)
    #: (need, [(cpu, gpus, models, popularity)]) per distinct per-GPU size.
    _sizes: tuple[tuple[int, tuple[tuple[int, int, frozenset[str], float], ...]], ...] = field(
        default=(), init=False, repr=False
    )

    def __post_init__(self) -> None:
        groups: dict[int, list[tuple[int, int, frozenset[str], float]]] = {}
        for tp in self.workload:
            s = tp.shape
            if s.gpus == 0 or s.threads == 0:
                self._cpu_only += tp.popularity
                continue
            groups.setdefault(min(s.threads, WHOLE), []).append(
                (s.cpu_milli, s.gpus, s.models, tp.popularity)
            )
        self._sizes = tuple((need, tuple(g)) for need, g in sorted(groups.items()))

    def __call__(self, node: NodeState) -> float:
        memo = self._memo
        value = memo.get(node)
        if value is None:
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            value = memo[node] = self._compute(node)
        return value

    def _compute(self, node: NodeState) -> float:
        free = node.gpu_free
        idle = sum(free)
        if idle == 0:
            return 0.0
        total = self._cpu_only * idle
        cpu = node.cpu_free_milli
        model = node.model
        for need, tasks in self._sizes:
            big = 0
            sliver = 0
            for f in free:
                if f >= need:
                    big += 1
                else:
                    sliver += f
            for t_cpu, t_gpus, t_models, p in tasks:
                if big >= t_gpus and cpu >= t_cpu and (not t_models or model in t_models):
                    total += p * sliver
                else:
                    total += p * idle
        return total
