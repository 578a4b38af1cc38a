"""The placement engine of a replay: for each arriving pod, filter and score every node the way
kube-scheduler with mpsched would, place the pod on the best one through the packing core's
ledger (which enforces the three per-GPU budgets), or count it as failed.

Speed comes from grouping, not from skipping nodes: nodes whose policy view (model, free CPU,
sorted free threads per GPU) is identical form one group, scored once per pod shape and cached
for the life of the engine (a policy score is a pure function of that view). Within a group the
node that wins is the first, in the seeded tie order, that also passes the per-node checks the
view leaves out (host memory). Pods and nodes the grouped view cannot describe exactly (explicit
memory asks, several MPS clients, UIDs, pre-Volta GPUs in whole-only mode, oversubscription)
are checked node by node through `fit_node`, as the extender's filter does.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

from extender.packing.errors import InvariantViolation
from extender.packing.fit import Misfit, allocate, fit_node
from extender.packing.ledger import GpuUsage, Ledger, NodeUsage
from extender.packing.policies import WHOLE, NodeState, PodShape, Policy, fits, share_candidates
from extender.packing.settings import BudgetSettings
from extender.simulate.types import SimNode, SimPod

#: Cached "the pod does not fit this view".
_NOFIT = (float("-inf"), None)
Scored = tuple[float, int | None]
#: Where a pod went: node index, and the GPU index for a share (None otherwise).
Placement = tuple[int, int | None]


class Engine:
    """Mutable cluster state of one replay, and the placement rule."""

    def __init__(
        self, nodes: Sequence[SimNode], policy: Policy, budgets: BudgetSettings, rank: Sequence[int]
    ) -> None:
        if sorted(rank) != list(range(len(nodes))):
            raise ValueError("rank must be a permutation of the node indexes")
        self.policy = policy
        self.budgets = budgets
        self.ledger = Ledger(budgets)
        self.usage: list[NodeUsage] = []
        for node in nodes:
            self.ledger.set_node(node.inventory)
            self.usage.append(self.ledger.node(node.name))
        self.names = [n.name for n in nodes]
        self.cpu = [n.cpu_milli for n in nodes]
        self.mem = [n.memory_mib for n in nodes]
        self.model = [n.model for n in nodes]
        self.rank = list(rank)
        self._by_rank = [0] * len(nodes)
        for i, r in enumerate(self.rank):
            self._by_rank[r] = i
        #: Proportional memory base per GPU (0 when memory is not derived from threads).
        self._grouped = [
            all(g.capacity.threads == WHOLE for g in u.gpus) and budgets.thread_capacity() == WHOLE
            for u in self.usage
        ]
        self.eff = [[self._effective(g) for g in u.gpus] for u in self.usage]
        self._perm: list[tuple[int, ...]] = [()] * len(nodes)
        self._gid = [-1] * len(nodes)
        self._groups: dict[int, list[int]] = {}
        self._states: list[NodeState] = []
        self._state_ids: dict[NodeState, int] = {}
        self._cache: dict[PodShape, dict[int, Scored]] = {}
        self._loose = [i for i, ok in enumerate(self._grouped) if not ok]
        for i, ok in enumerate(self._grouped):
            if ok:
                self._regroup(i)

    # -- views -------------------------------------------------------------------------------

    def _effective(self, g: GpuUsage) -> int:
        """Free thread % of `g` as a single-client, proportional-memory share sees it: capped
        by the memory left once one more client is counted; 0 with no client slot left. A GPU
        holding any share reads at most 99 so that it never looks idle to a whole-GPU pod."""
        cap = g.capacity
        if g.owner is not None or cap.threads == 0 or g.clients >= cap.clients:
            return 0
        free = cap.threads - g.threads
        left = cap.memory_left(g.memory_mib, g.clients + 1)
        if left < 0:
            return 0
        base = cap.memory_mib if self.budgets.proportional else 0
        if base and base * free // 100 > left:
            free = min(free, (100 * (left + 1) - 1) // base)
        return min(free, WHOLE - 1) if g.shares else free

    def state(self, i: int) -> NodeState:
        """Node i as a policy sees it, GPUs in index order."""
        return NodeState(self.model[i], self.cpu[i], tuple(self.eff[i]))

    def _regroup(self, i: int) -> None:
        old = self._gid[i]
        if old >= 0:
            ranks = self._groups[old]
            del ranks[bisect_left(ranks, self.rank[i])]
            if not ranks:
                del self._groups[old]
        eff = self.eff[i]
        order = tuple(sorted(range(len(eff)), key=eff.__getitem__))
        view = NodeState(self.model[i], self.cpu[i], tuple(eff[j] for j in order))
        gid = self._state_ids.get(view)
        if gid is None:
            gid = self._state_ids[view] = len(self._states)
            self._states.append(view)
        self._perm[i] = order
        self._gid[i] = gid
        insort(self._groups.setdefault(gid, []), self.rank[i])

    @staticmethod
    def groupable(pod: SimPod) -> bool:
        """The grouped view describes this pod's fit exactly."""
        req = pod.request
        if req.kind != "share":
            return True
        if req.run_as_user is not None or len(req.containers) != 1:
            return False
        ask = req.containers[0]
        return (
            not ask.init
            and ask.clients == 1
            and ask.memory_mib is None
            and ask.units is None
            and ask.threads is not None
            and 0 < ask.threads < WHOLE
        )

    # -- placement ---------------------------------------------------------------------------

    def place(self, pod: SimPod) -> Placement | None:
        """Place the pod on the best node; None if it fits nowhere."""
        shape = pod.shape
        if not self.groupable(pod):
            return self._place_loose(pod, range(len(self.usage)))
        cache = self._cache.get(shape)
        if cache is None:
            cache = self._cache[shape] = {}
        best = float("-inf")
        level: list[int] = []
        states = self._states
        for gid in self._groups:
            scored = cache.get(gid)
            if scored is None:
                scored = cache[gid] = self._evaluate(states[gid], shape)
            s = scored[0]
            if s >= best and s != _NOFIT[0]:
                if s > best:
                    best = s
                    level = [gid]
                else:
                    level.append(gid)
        choice = self._first_in(level, pod) if level else None
        if choice is None and level:
            choice = self._fallback(pod, cache)
        if self._loose:
            return self._place_loose(pod, self._loose, grouped=(best, choice))
        if choice is None:
            return None
        i, gid = choice
        gpu = cache[gid][1]
        return self._apply(i, pod, None if gpu is None else self._perm[i][gpu])

    def _evaluate(self, view: NodeState, shape: PodShape) -> Scored:
        candidates = share_candidates(view, shape)
        if not fits(view, shape, candidates):
            return _NOFIT
        return self.policy.score(view, shape, candidates)

    def _first_in(self, gids: Sequence[int], pod: SimPod) -> tuple[int, int] | None:
        """Among nodes of these groups that pass the memory check, the first in tie order."""
        best: tuple[int, int, int] | None = None
        need = pod.memory_mib
        for gid in gids:
            for r in self._groups[gid]:
                if best is not None and r >= best[0]:
                    break
                i = self._by_rank[r]
                if self.mem[i] >= need:
                    best = (r, i, gid)
                    break
        return None if best is None else (best[1], best[2])

    def _fallback(self, pod: SimPod, cache: dict[int, Scored]) -> tuple[int, int] | None:
        """The top-scoring groups had no node with enough memory: go down the score levels."""
        levels: dict[float, list[int]] = {}
        for gid in self._groups:
            s = cache[gid][0]
            if s != _NOFIT[0]:
                levels.setdefault(s, []).append(gid)
        for s in sorted(levels, reverse=True):
            choice = self._first_in(levels[s], pod)
            if choice is not None:
                return choice
        return None

    def _place_loose(
        self,
        pod: SimPod,
        nodes: Sequence[int] | range,
        grouped: tuple[float, tuple[int, int] | None] | None = None,
    ) -> Placement | None:
        """Score `nodes` one by one through `fit_node`; the grouped winner, if any, competes."""
        best: tuple[float, int, int, int | None] | None = None
        if grouped is not None and grouped[1] is not None:
            i, gid = grouped[1]
            gpu = self._cache[pod.shape][gid][1]
            best = (grouped[0], -self.rank[i], i, None if gpu is None else self._perm[i][gpu])
        for i in nodes:
            if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
                continue
            if pod.shape.gpus and not pod.shape.allows(self.model[i]):
                continue
            fit = fit_node(self.usage[i], pod.request, self.budgets)
            if isinstance(fit, Misfit):
                continue
            view = NodeState(
                self.model[i], self.cpu[i], tuple(g.threads_free for g in self.usage[i].gpus)
            )
            if not fits(view, pod.shape, fit.gpus):
                continue
            s, gpu = self.policy.score(view, pod.shape, fit.gpus)
            key = (s, -self.rank[i], i, gpu)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            return None
        return self._apply(best[2], pod, best[3])

    def _apply(self, i: int, pod: SimPod, gpu: int | None) -> Placement:
        """Book the pod on node i through the core: fit, allocate, ledger.assume."""
        usage = self.usage[i]
        if pod.request.kind != "none":
            fit = fit_node(usage, pod.request, self.budgets)
            if isinstance(fit, Misfit):
                raise InvariantViolation(f"{pod.name} chosen for {self.names[i]}: {fit.reason}")
            alloc = allocate(usage, pod.request, fit, gpu, self.budgets)
            self.ledger.assume(alloc)
            for ref in alloc.gpus:
                self.eff[i][ref.index] = self._effective(usage.gpus[ref.index])
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        if self.cpu[i] < 0 or self.mem[i] < 0:
            raise InvariantViolation(f"{pod.name} overcommits {self.names[i]}")
        if self._grouped[i]:
            self._regroup(i)
        return i, gpu

    @property
    def group_count(self) -> int:
        return len(self._groups)
