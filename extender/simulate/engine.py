"""The placement engine of a replay: for each arriving pod, filter and score every node the way
kube-scheduler with mpsched would, place the pod on the best one through the packing core's
ledger (which enforces the three per-GPU budgets), or count it as failed; and, for a replay in
time, give a departed pod's share back.

Speed comes from grouping, not from skipping nodes: nodes whose policy view (model, free CPU,
sorted free threads per GPU) is identical form one group, scored once per pod shape and cached
for the life of the engine (a policy score is a pure function of that view). Within a group the
node that wins is the first, in the seeded tie order, that also passes the per-node checks the
view leaves out (host memory). Pods and nodes the grouped view cannot describe exactly (explicit
memory asks, several MPS clients, UIDs, pre-Volta GPUs in whole-only mode, oversubscription,
and a node once it holds a share of another UID than the trace's, which UID isolation keeps
the trace's pods off) are checked node by node through `fit_node`, as the extender's filter
does.

Every view is the extender's: a node's free share per GPU is `packing.view.gpu_free` (the cache
keeps it per GPU and updates the GPUs a placement touched), and a pod checked node by node is
scored with its demand on that node's GPU (`packing.view.pod_shape`), so that a replay ranks
nodes as `serve` would.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from extender.packing.errors import InvariantViolation
from extender.packing.fit import Misfit, allocate, fit_node
from extender.packing.ledger import Ledger, NodeUsage
from extender.packing.policies import WHOLE, NodeState, PodShape, Policy, fits
from extender.packing.settings import BudgetSettings
from extender.packing.view import gpu_free, node_state, pod_shape, share_gpu
from extender.simulate.types import TRACE_USER, SimNode, SimPod

#: Cached "the pod does not fit this view".
_NOFIT = (float("-inf"), None)
Scored = tuple[float, int | None]
Ids = npt.NDArray[np.int64]
#: Where a pod went: node index, and the GPU index for a share (None otherwise).
Placement = tuple[int, int | None]


class ShapeScores:
    """The scores of one pod shape on every node view seen so far, indexed by view id (NaN: not
    scored yet), and the canonical GPU each share choice took. An array, so that the best of
    some hundred live views is found with a few vector operations per pod."""

    __slots__ = ("gpus", "values")

    def __init__(self, size: int) -> None:
        self.values: npt.NDArray[np.float64] = np.full(max(size, 1024), np.nan)
        self.gpus: dict[int, int] = {}

    def reserve(self, size: int) -> None:
        if size > len(self.values):
            more = np.full(max(size, 2 * len(self.values)) - len(self.values), np.nan)
            self.values = np.concatenate([self.values, more])


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
        #: Nodes the grouped view describes exactly: every GPU shareable, 100 % thread capacity.
        self._grouped = [
            all(g.capacity.threads == WHOLE for g in u.gpus) and budgets.thread_capacity() == WHOLE
            for u in self.usage
        ]
        self.eff = [list(self._view(i).gpu_free) for i in range(len(nodes))]
        self._perm: list[tuple[int, ...]] = [()] * len(nodes)
        self._gid = [-1] * len(nodes)
        self._groups: dict[int, list[int]] = {}
        self._states: list[NodeState] = []
        self._state_ids: dict[NodeState, int] = {}
        self._tables: dict[PodShape, ShapeScores] = {}
        #: Ids of the views some node has now (the first `_alive_n` entries; at most one per
        #: node), with positions for O(1) removal.
        self._alive: Ids = np.zeros(max(1, len(nodes)), dtype=np.int64)
        self._alive_n = 0
        self._alive_at: dict[int, int] = {}
        self._loose = [i for i, ok in enumerate(self._grouped) if not ok]
        for i, ok in enumerate(self._grouped):
            if ok:
                self._regroup(i)

    # -- views -------------------------------------------------------------------------------

    def _regroup(self, i: int) -> None:
        if self._gid[i] >= 0:
            self._leave_group(i)
        eff = self.eff[i]
        order = tuple(sorted(range(len(eff)), key=eff.__getitem__))
        view = NodeState(self.model[i], self.cpu[i], tuple(eff[j] for j in order))
        gid = self._state_ids.get(view)
        if gid is None:
            gid = self._state_ids[view] = len(self._states)
            self._states.append(view)
        self._perm[i] = order
        self._gid[i] = gid
        members = self._groups.get(gid)
        if members is None:
            members = self._groups[gid] = []
            self._alive_at[gid] = self._alive_n
            self._alive[self._alive_n] = gid
            self._alive_n += 1
        insort(members, self.rank[i])

    def _drop_alive(self, gid: int) -> None:
        at = self._alive_at.pop(gid)
        self._alive_n -= 1
        last = int(self._alive[self._alive_n])
        if last != gid:
            self._alive[at] = last
            self._alive_at[last] = at

    def _uid_apart(self, kind: str, user: int | None, usage: NodeUsage) -> bool:
        """A share of `user` on the node keeps the trace's user off its GPU (UID isolation),
        which the grouped view, free threads only, does not show."""
        return (
            kind == "share"
            and user != TRACE_USER
            and self.budgets.uid_isolation
            and not usage.inventory.multi_user
        )

    def _leave_group(self, i: int) -> None:
        gid = self._gid[i]
        ranks = self._groups[gid]
        del ranks[bisect_left(ranks, self.rank[i])]
        if not ranks:
            del self._groups[gid]
            self._drop_alive(gid)
        self._gid[i] = -1

    def _ungroup(self, i: int) -> None:
        """Node i is checked node by node from now on (`_uid_apart`)."""
        self._leave_group(i)
        self._grouped[i] = False
        insort(self._loose, i)

    @staticmethod
    def groupable(pod: SimPod) -> bool:
        """The grouped view describes this pod's fit exactly. It leaves UIDs out: the shares
        it places all run as the trace's one user (a pod of another UID, or of none known,
        is checked node by node)."""
        req = pod.request
        if req.kind != "share":
            return True
        if req.run_as_user != TRACE_USER or len(req.containers) != 1:
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
        table = self._tables.get(shape)
        if table is None:
            table = self._tables[shape] = ShapeScores(len(self._states))
        table.reserve(len(self._states))
        alive = self._alive[: self._alive_n]
        values = table.values[alive]
        missing = np.isnan(values)
        if missing.any():
            for gid in alive[missing].tolist():
                score, gpu = self._evaluate(self._states[gid], shape)
                table.values[gid] = score
                if gpu is not None:
                    table.gpus[gid] = gpu
            values = table.values[alive]
        best = float(values.max()) if len(values) else _NOFIT[0]
        choice = None
        if best != _NOFIT[0]:
            choice = self._first_in(alive[values == best].tolist(), pod)
            if choice is None:
                choice = self._fallback(pod, alive, values)
        if self._loose:
            return self._place_loose(pod, self._loose, grouped=(best, choice))
        if choice is None:
            return None
        i, gid = choice
        gpu = table.gpus.get(gid)
        return self._apply(i, pod, None if gpu is None else self._perm[i][gpu])

    def _evaluate(self, view: NodeState, shape: PodShape) -> Scored:
        """Score a canonical view (free amounts ascending, so the GPUs that can take the pod
        are a suffix of it)."""
        if view.cpu_free_milli < shape.cpu_milli:
            return _NOFIT
        if shape.gpus == 0:
            return self.policy.score(view, shape, ())
        if not shape.allows(view.model):
            return _NOFIT
        free = view.gpu_free
        first = bisect_left(free, shape.threads if shape.is_share else WHOLE)
        if len(free) - first < shape.gpus:
            return _NOFIT
        return self.policy.score(view, shape, range(first, len(free)))

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

    def _fallback(
        self, pod: SimPod, alive: Ids, values: npt.NDArray[np.float64]
    ) -> tuple[int, int] | None:
        """The top-scoring groups had no node with enough memory: go down the score levels."""
        for level in np.unique(values[values > _NOFIT[0]])[::-1][1:].tolist():
            choice = self._first_in(alive[values == level].tolist(), pod)
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
            gpu = self._tables[pod.shape].gpus.get(gid)
            best = (grouped[0], -self.rank[i], i, None if gpu is None else self._perm[i][gpu])
        for i in nodes:
            scored = self._score_loose(i, pod)
            if scored is None:
                continue
            key = (scored[0], -self.rank[i], i, scored[1])
            if best is None or key[:2] > best[:2]:
                best = key
        return None if best is None else self._apply(best[2], pod, best[3])

    def _score_loose(self, i: int, pod: SimPod) -> Scored | None:
        """The pod's score and GPU on node i through `fit_node`; None where it does not fit."""
        if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
            return None
        if pod.shape.gpus and not pod.shape.allows(self.model[i]):
            return None
        fit = fit_node(self.usage[i], pod.request, self.budgets)
        if isinstance(fit, Misfit):
            return None
        view = self._view(i)
        # The shape on this node's GPU, as the extender scores it (a memory or units ask means
        # a different thread share on each model).
        threads = fit.demands[0].threads if fit.demands else 0
        shape = pod_shape(pod.request, pod.cpu_milli, threads=threads, models=pod.shape.models)
        if not fits(view, shape, fit.gpus):
            return None
        score, gpu = self.policy.score(view, shape, fit.gpus)
        return score, share_gpu(view, fit.gpus, gpu) if pod.request.kind == "share" else None

    def scores(self, pod: SimPod) -> list[float | None]:
        """The score `place` gives the pod on each node (in node order), None where it does not
        fit: what the replay ranks, exposed so that it can be compared with the extender's."""
        out: list[float | None] = []
        groupable = self.groupable(pod)
        for i in range(len(self.usage)):
            if groupable and self._grouped[i]:
                score, _ = self._evaluate(self._states[self._gid[i]], pod.shape)
                fit = score != _NOFIT[0] and self.mem[i] >= pod.memory_mib
                out.append(score if fit else None)
            else:
                scored = self._score_loose(i, pod)
                out.append(None if scored is None else scored[0])
        return out

    def view(self, i: int) -> NodeState:
        """Node i as the policy sees it now, GPUs in index order (the grouped cache scores the
        same view with its GPUs sorted)."""
        return NodeState(self.model[i], self.cpu[i], tuple(self.eff[i]))

    def _view(self, i: int) -> NodeState:
        """Node i as the extender's evaluator shows it to the policy (GPUs in index order)."""
        return node_state(self.usage[i], self.cpu[i], proportional=self.budgets.proportional)

    def _apply(self, i: int, pod: SimPod, gpu: int | None) -> Placement:
        """Book the pod on node i through the core: fit, allocate, ledger.assume."""
        usage = self.usage[i]
        if pod.request.kind != "none":
            fit = fit_node(usage, pod.request, self.budgets)
            if isinstance(fit, Misfit):
                raise InvariantViolation(f"{pod.name} chosen for {self.names[i]}: {fit.reason}")
            alloc = allocate(usage, pod.request, fit, gpu, self.budgets)
            prop = self.budgets.proportional
            self.ledger.assume(alloc)
            for ref in alloc.gpus:
                self.eff[i][ref.index] = gpu_free(usage.gpus[ref.index], proportional=prop)
            if self._grouped[i] and self._uid_apart(alloc.kind, alloc.run_as_user, usage):
                self._ungroup(i)
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        if self.cpu[i] < 0 or self.mem[i] < 0:
            raise InvariantViolation(f"{pod.name} overcommits {self.names[i]}")
        if self._grouped[i]:
            self._regroup(i)
        return i, gpu

    def bind(self, i: int, pod: SimPod) -> Placement | None:
        """Book the pod on node i (where a cluster already runs it), on the GPU `place` would
        choose there; None where it does not fit node i."""
        scored = self._score_loose(i, pod)
        return None if scored is None else self._apply(i, pod, scored[1])

    def release(self, i: int, pod: SimPod) -> None:
        """Give back what `pod` holds on node i (it has left): its share or GPUs through the
        ledger, its CPU and memory, and node i's view."""
        usage = self.usage[i]
        alloc = self.ledger.release(pod.request.pod_uid) if pod.request.kind != "none" else None
        if alloc is not None:
            prop = self.budgets.proportional
            for ref in alloc.gpus:
                self.eff[i][ref.index] = gpu_free(usage.gpus[ref.index], proportional=prop)
        self.cpu[i] += pod.cpu_milli
        self.mem[i] += pod.memory_mib
        if self._grouped[i]:
            self._regroup(i)
