"""Scoring policies: FGD fragmentation by hand-computed cases (including the structure of the
FGD authors' fixtures), score rules, the policy API's properties, the typical-pod workload."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.packing.policies import (
    POLICY_NAMES,
    NodeState,
    PodShape,
    PolicySettings,
    TypicalPod,
    Workload,
    canonical,
    fits,
    make_policy,
    share_candidates,
    typical_workload,
)
from extender.packing.policies.base import WHOLE
from extender.packing.policies.bestfit import BestFitPolicy, SpreadPolicy
from extender.packing.policies.fgd import FgdPolicy, fgd_score
from extender.packing.policies.frag import Fragmentation, Leftover, mix_leftover
from extender.packing.policies.scarcity import NodeType
from tests.packing.policies_reference import ReferenceFgdPolicy

ANY: frozenset[str] = frozenset()

# The measures of one task type as the module docstring of frag.py defines them, written plainly:
# what the policy's per-node computation over a whole workload is held to.


def _fits_now(node: NodeState, task: PodShape, need: int) -> bool:
    if task.gpus == 0 or task.threads == 0 or not task.allows(node.model):
        return False
    if node.cpu_free_milli < task.cpu_milli:
        return False
    return sum(1 for f in node.gpu_free if f >= need) >= task.gpus


def task_fragmentation(node: NodeState, task: PodShape) -> int:
    """F_n(m) of one task type (FGD), in thread percent."""
    need = min(task.threads, WHOLE)
    if not _fits_now(node, task, need):
        return sum(node.gpu_free)
    return sum(f for f in node.gpu_free if f < need)


def task_lookahead(node: NodeState, task: PodShape) -> int:
    """L_n(m) of one task type, in thread percent."""
    idle = sum(node.gpu_free)
    need = min(task.threads, WHOLE)
    if not _fits_now(node, task, need):
        return idle
    if need >= WHOLE:
        times = sum(1 for f in node.gpu_free if f >= WHOLE) // task.gpus
    else:
        times = sum(f // need for f in node.gpu_free)
    if task.cpu_milli > 0:
        times = min(times, node.cpu_free_milli // task.cpu_milli)
    return idle - times * need * task.gpus


def task_mix_lookahead(node: NodeState, task: PodShape, left: Leftover) -> float:
    """M_n(m) of one task type, in thread percent, with the mix's leftover table `left`."""
    idle = sum(node.gpu_free)
    need = min(task.threads, WHOLE)
    if not _fits_now(node, task, need):
        return float(idle)
    # Free amounts above a whole GPU (oversubscription) keep their excess.
    room = sum(f - (left[min(f, WHOLE)] + max(f - WHOLE, 0)) for f in node.gpu_free)
    if task.cpu_milli > 0:
        room = min(room, float(node.cpu_free_milli // task.cpu_milli * need * task.gpus))
    return idle - room


def share(cpu: int, threads: int, models: frozenset[str] = ANY) -> PodShape:
    return PodShape(cpu, threads, 1, models)


def whole(cpu: int, k: int) -> PodShape:
    return PodShape(cpu, 100, k)


CPU_ONLY = PodShape(4000, 0, 0)

# -- F_n(m) by hand -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        # fits: only GPUs too small for the task count (30 < 47)
        (NodeState("T4", 8000, (100, 30)), share(4000, 47), 30),
        # lacks CPU: every idle GPU counts
        (NodeState("T4", 8000, (100, 30)), share(16000, 47), 130),
        # lacks GPU: no GPU has 47 free
        (NodeState("T4", 8000, (40, 30)), share(4000, 47), 70),
        # CPU-only task: no idle GPU can serve it
        (NodeState("T4", 8000, (100, 30)), CPU_ONLY, 130),
        # model mismatch
        (NodeState("T4", 8000, (100, 30)), share(4000, 47, frozenset({"V100"})), 130),
        # model match
        (NodeState("V100", 8000, (100, 30)), share(4000, 47, frozenset({"V100", "A100"})), 30),
        # k whole GPUs fit: the partial GPU is a sliver for this task
        (NodeState("G2", 64000, (100, 100, 50, 0)), whole(8000, 2), 50),
        # k whole GPUs do not fit
        (NodeState("G2", 64000, (100, 60, 50, 0)), whole(8000, 2), 210),
        # a full node has nothing to fragment
        (NodeState("G2", 64000, (0, 0)), share(1000, 10), 0),
    ],
)
def test_task_fragmentation_by_hand(node: NodeState, task: PodShape, expected: int) -> None:
    assert task_fragmentation(node, task) == expected


def test_workload_fragmentation_is_the_popularity_weighted_sum() -> None:
    workload: Workload = (
        TypicalPod(share(4000, 47), 0.5),
        TypicalPod(whole(8000, 1), 0.3),
        TypicalPod(CPU_ONLY, 0.2),
    )
    node = NodeState("T4", 8000, (100, 30, 60))
    # 47: fits, slivers 30 → 30; whole: fits, slivers 30 + 60 → 90; CPU-only: 190.
    expected = 0.5 * 30 + 0.3 * 90 + 0.2 * 190
    frag = Fragmentation(workload)
    assert frag(node) == pytest.approx(expected)
    assert frag(node) == pytest.approx(expected)  # memoised: same answer


# The FGD authors' frag_test.go asserts 2566.62, 3802.40, 7604.80, 251.91, 887.20, 554.40 and
# 4000 (milli). Their structure, reconstructed: on a node that lacks CPU for every GPU task
# type, F = idle × Σ popularity; on an idle node with CPU, only CPU-only types and types that
# need more CPU (or more GPUs) than the node has count, each with all idle GPU. 1 % = 10 milli.


def test_cpu_starved_node_counts_all_idle_gpu() -> None:
    # 251.91 = 0.0933 × 2700 milli: one typical type at 9.33 %, node with 1 core and 4 GPUs
    # of which 200 + 1000 + 1000 + 500 milli are free.
    one = Fragmentation((TypicalPod(share(6000, 46), 0.0933),))
    assert 10 * one(NodeState("1080", 1000, (20, 100, 100, 50))) == pytest.approx(251.91)
    # 3802.40 and 7604.80 = 4000 and 8000 milli × 0.9506 (the popularity of GPU types listed).
    many = Fragmentation(
        (
            TypicalPod(share(2000, 46), 0.5),
            TypicalPod(whole(4000, 1), 0.3),
            TypicalPod(whole(14000, 2), 0.1506),
        )
    )
    assert 10 * many(NodeState("1080", 1000, (100,) * 4)) == pytest.approx(3802.40)
    assert 10 * many(NodeState("1080", 1000, (100,) * 8)) == pytest.approx(7604.80)
    assert 10 * many(NodeState("1080", 1000, (20, 100, 100, 50))) == pytest.approx(2566.62)


def test_idle_node_counts_only_types_it_cannot_serve() -> None:
    workload = (
        TypicalPod(whole(15700, 1), 0.80),
        TypicalPod(CPU_ONLY, 0.0954),  # CPU-only types together
        TypicalPod(whole(120200, 8), 0.0048),  # needs more CPU than any node here
        TypicalPod(whole(60200, 4), 0.0123),  # needs more than 32 cores
        TypicalPod(whole(64000, 8), 0.0053),  # needs 8 GPUs
        TypicalPod(whole(2000, 1), 0.0822),
    )
    frag = Fragmentation(workload)
    # 8 idle GPUs, 64 cores: CPU-only 9.54 % and the 120-core type 0.48 % → 8000 × 10.02 %...
    # plus nothing else: 64 cores hold the 60.2 and 64-core types.
    assert 10 * frag(NodeState("P100", 64000, (100,) * 8)) == pytest.approx(8000 * 0.1002)
    # half the GPUs taken, 32 cores: also the 60.2-core and the 8-GPU types count.
    half = NodeState("P100", 32000, (100,) * 4 + (0,) * 4)
    assert 10 * frag(half) == pytest.approx(4000 * (0.0954 + 0.0048 + 0.0123 + 0.0053))
    # no CPU at all: every type counts → all 4000 milli.
    assert 10 * frag(NodeState("P100", 0, (100,) * 4 + (0,) * 4)) == pytest.approx(4000)


# -- the look-ahead measure L_n(m) by hand --------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        # 8 idle GPUs and 96 cores feed 8 pods of 11.3 cores: nothing stranded
        (NodeState("G2", 96000, (100,) * 8), whole(11300, 1), 0),
        # after a 32-core CPU-only pod, 64 cores feed only 5: 3 GPUs stranded (FGD sees 0)
        (NodeState("G2", 64000, (100,) * 8), whole(11300, 1), 300),
        # 47 % shares: 100 holds two, 60 one, 30 none → 190 idle - 3 × 47 = 49 (FGD: 30)
        (NodeState("T4", 10**6, (100, 60, 30)), share(1000, 47), 49),
        # ... and with CPU for only one more share: 190 - 47
        (NodeState("T4", 1500, (100, 60, 30)), share(1000, 47), 143),
        # 2-GPU pods on 3 idle GPUs: one fits, one GPU stays idle
        (NodeState("G2", 10**6, (100, 100, 100, 0)), whole(1000, 2), 100),
        # does not fit now: all idle, as in FGD
        (NodeState("G2", 500, (100, 100)), whole(1000, 1), 200),
        (NodeState("G2", 10**6, (100, 100)), CPU_ONLY, 200),
    ],
)
def test_task_lookahead_by_hand(node: NodeState, task: PodShape, expected: int) -> None:
    assert task_lookahead(node, task) == expected
    assert task_lookahead(node, task) >= task_fragmentation(node, task)


#: Node states of two models, any free CPU and 1-8 GPUs with any free threads.
NODE_STATES = st.builds(
    NodeState,
    st.sampled_from(["G2", "T4"]),
    st.integers(0, 96000),
    st.lists(st.integers(0, 100), min_size=1, max_size=8).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(node=NODE_STATES, w=st.sampled_from([0.0, 0.3, 1.0]))
def test_blended_measure_is_the_weighted_sum(node: NodeState, w: float) -> None:
    expected = sum(
        t.popularity
        * ((1 - w) * task_fragmentation(node, t.shape) + w * task_lookahead(node, t.shape))
        for t in WORKLOAD
    )
    assert Fragmentation(WORKLOAD, w)(node) == pytest.approx(expected)


def test_lookahead_weight_is_checked() -> None:
    with pytest.raises(ValueError, match="lookahead"):
        Fragmentation(WORKLOAD, 1.5)


# -- the mix look-ahead (the default policy's; `typefill` looks ahead per type) ------------------

MIX: Workload = (TypicalPod(share(1000, 30), 0.5), TypicalPod(whole(1000, 1), 0.5))


def test_mix_leftover_by_hand() -> None:
    left = mix_leftover(MIX, [0.5, 0.5])
    # 100 free: a whole pod (p 1/2) leaves 0; a 30 share leaves 70 → 40 → 10, where only
    # shares fit and none fits 10 → 5.
    assert left[100] == pytest.approx(5.0)
    assert left[60] == pytest.approx(0.0)  # two 30s
    assert left[29] == pytest.approx(29.0)  # nothing fits
    assert left[0] == 0.0
    # A k-GPU pod counts once on each of its GPUs: 2-GPU pods at half the popularity weigh
    # as much on one GPU as 1-GPU pods; CPU-only pods take no part.
    two = (TypicalPod(share(1000, 30), 0.5), TypicalPod(whole(1000, 2), 0.25))
    assert mix_leftover(two, [0.5, 0.25])[100] == pytest.approx(5.0)
    with_cpu = (*MIX, TypicalPod(CPU_ONLY, 0.3))
    assert mix_leftover(with_cpu, [0.5, 0.5, 0.3]) == left


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        # room: (100 - 5) + (60 - 0) + (25 - 25) = 155 of 185 idle; the 60 GPU is not lost to
        # whole-GPU types (L counts it all: 185 - 100 = 85)
        (NodeState("T4", 10**6, (100, 60, 25)), whole(1000, 1), 30.0),
        (NodeState("T4", 10**6, (100, 60, 25)), share(1000, 30), 30.0),
        # CPU for one pod of the type: the room is one whole GPU, as in L
        (NodeState("T4", 1500, (100, 60, 25)), whole(1000, 1), 85.0),
        # does not fit now: all idle, as in FGD
        (NodeState("T4", 500, (100, 60, 25)), whole(1000, 1), 185.0),
        (NodeState("T4", 10**6, (60, 25)), whole(1000, 1), 85.0),
    ],
)
def test_task_mix_lookahead_by_hand(node: NodeState, task: PodShape, expected: float) -> None:
    left = mix_leftover(MIX, [0.5, 0.5])
    assert task_mix_lookahead(node, task, left) == pytest.approx(expected)
    assert task_mix_lookahead(node, task, left) <= task_lookahead(node, task) + 1e-9


@settings(max_examples=150, deadline=None)
@given(node=NODE_STATES, w=st.sampled_from([0.0, 0.3, 1.0]))
def test_mix_measure_is_the_weighted_sum(node: NodeState, w: float) -> None:
    left = mix_leftover(WORKLOAD, [t.popularity for t in WORKLOAD])
    expected = sum(
        t.popularity
        * (
            (1 - w) * task_fragmentation(node, t.shape)
            + w * task_mix_lookahead(node, t.shape, left)
        )
        for t in WORKLOAD
    )
    assert Fragmentation(WORKLOAD, w, mix=True)(node) == pytest.approx(expected)


def test_mix_is_the_one_expected_on_the_node_type() -> None:
    # The 30 share is pinned to V100: on a T4 node only whole pods arrive, so a 60 GPU stays
    # idle (left[60] = 60) where the cluster-wide mix fills it with two 30s.
    pinned = (
        TypicalPod(share(1000, 30, frozenset({"V100"})), 0.5),
        TypicalPod(whole(1000, 1), 0.5),
    )
    node = NodeState("T4", 10**6, (100, 60))
    # One V100 node: the pinned share alone asks more than its GPUs (scarcity.pinned_load).
    types = (NodeType("T4", 2, 10**6, 10), NodeType("V100", 2, 10**6, 1))
    # Both types count with their popularity; the pinned share cannot use a T4 and counts all
    # 160 idle; the whole type: 160 idle - room (100 - 0) + (60 - 60) = 60.
    assert Fragmentation(pinned, 1.0, types, mix=True)(node) == pytest.approx(0.5 * 160 + 0.5 * 60)
    # cluster-wide mix: left[100] = 5, left[60] = 0, so the whole type keeps 160 - 155 = 5
    assert Fragmentation(pinned, 1.0, mix=True)(node) == pytest.approx(0.5 * 160.0 + 0.5 * 5.0)
    # The V100 node, which the pinned share needs whole, gets FGD's measure (the
    # pinned share sees the 60 GPU as free room, the whole type sees it as a sliver).
    v100 = NodeState("V100", 10**6, (100, 60))
    assert Fragmentation(pinned, 1.0, types, mix=True)(v100) == pytest.approx(0.5 * 60)


@pytest.mark.parametrize("name", ["default", "typefill"])
def test_the_lookahead_policies_without_lookahead_are_fgd(name: str) -> None:
    node = NodeState("G2", 40000, (100, 53, 19, 100))
    policy = make_policy(name, workload=WORKLOAD, settings=PolicySettings(lookahead=0.0))
    fgd = FgdPolicy(WORKLOAD)
    assert policy.name == name
    for pod in (share(3152, 47), share(8000, 16), whole(11300, 1), CPU_ONLY):
        candidates = share_candidates(node, pod)
        assert policy.score(node, pod, candidates) == fgd.score(node, pod, candidates)


OPENB_LIKE: Workload = (
    TypicalPod(share(1000, 81), 0.3),
    TypicalPod(share(1000, 47), 0.2),
    TypicalPod(share(1000, 32), 0.1),
    TypicalPod(whole(1000, 1), 0.4),
)


def test_default_and_typefill_rank_partly_used_gpus_differently() -> None:
    # A 47 share: node A (40, 53) → (40, 6), node B (0, 70) → (0, 23). With L (look-ahead
    # alone), F falls 77.2 → 42.8 on A and 54.2 → 23.0 on B: A. With the mix, A's 53 GPU was
    # expected to be filled anyway (a 47, then 6 idle) and its 40 GPU by a 32 (8 idle), so A
    # starts at 70.8 and gains less: B.
    left = mix_leftover(OPENB_LIKE, [t.popularity for t in OPENB_LIKE])
    assert [round(left[f], 2) for f in (6, 40, 53, 70)] == [6.0, 8.0, 11.0, 17.33]
    a, b = NodeState("T4", 10**6, (40, 53)), NodeState("T4", 10**6, (0, 70))
    pod = share(1000, 47)
    settings_ = PolicySettings(lookahead=1.0)
    for name, better in (("typefill", a), ("default", b)):
        policy = make_policy(name, workload=OPENB_LIKE, settings=settings_)
        scores = {n: policy.score(n, pod, share_candidates(n, pod))[0] for n in (a, b)}
        worse = b if better is a else a
        assert scores[better] > scores[worse], name


def test_default_sends_cpu_only_pods_where_cpu_is_not_needed_by_gpus() -> None:
    workload = (TypicalPod(whole(11300, 1), 0.7), TypicalPod(PodShape(32000, 0, 0), 0.3))
    g2 = NodeState("G2", 96000, (100,) * 8)  # 12 cores per GPU: the GPUs need them
    t4 = NodeState("T4", 104000, (100, 100))  # 52 cores per GPU: plenty to spare
    pod = PodShape(32000, 0, 0)
    fgd = make_policy("fgd", workload=workload, settings=PolicySettings())
    default = make_policy("default", workload=workload, settings=PolicySettings())
    # FGD sees no difference: every type still fits on both nodes right after.
    assert fgd.score(g2, pod, ())[0] == fgd.score(t4, pod, ())[0]
    # The look-ahead sees the 3 G2 GPUs that 64 remaining cores can no longer feed.
    assert default.score(g2, pod, ())[0] < default.score(t4, pod, ())[0]


# -- score rules --------------------------------------------------------------------------------


def test_fgd_score_is_the_truncated_sigmoid_of_delta_in_gpus() -> None:
    assert fgd_score(0.0) == 50
    assert fgd_score(100.0) == int(100 / (1 + math.exp(-1)))  # Δ = one GPU → 73
    assert fgd_score(-100.0) == 26
    assert fgd_score(3.9) == 50  # below one score point: a tie
    assert fgd_score(1e6) == 100
    assert fgd_score(-1e6) == 0


def test_fgd_prefers_the_gpu_whose_leftover_the_workload_can_use() -> None:
    workload = (TypicalPod(share(1000, 50), 1.0),)
    policy = FgdPolicy(workload)
    node = NodeState("G2", 64000, (100, 100))
    # A 50 % share on an idle GPU leaves 50: still usable by the workload, Δ = 0.
    score, gpu = policy.score(node, share(1000, 50), share_candidates(node, share(1000, 50)))
    assert (score, gpu) == (50.0, 0)
    # A 60 % share leaves 40 on one GPU: a sliver the workload cannot use, F grows by 40.
    node2 = NodeState("G2", 64000, (60, 100))
    score2, gpu2 = policy.score(node2, share(1000, 60), (0, 1))
    assert gpu2 == 0  # filling the 60 exactly leaves no sliver
    assert score2 == fgd_score(0)


def test_bestfit_matches_the_paper_formula() -> None:
    node = NodeState("T4", 64000, (100, 70))
    pod = share(8000, 50)
    # leftover = 0.5 × 56000/128000 + 0.5 × 1200 milli/8000 = 0.21875 + 0.075 → 70.625 → 70
    assert BestFitPolicy().score(node, pod, (0, 1)) == (70.0, 1)
    assert SpreadPolicy().score(node, pod, (0, 1)) == (29.0, 0)


def test_whole_gpu_pods_get_no_gpu_from_any_policy() -> None:
    node = NodeState("G2", 64000, (100, 100, 30))
    pod = whole(8000, 2)
    workload = (TypicalPod(pod, 1.0),)
    for name in POLICY_NAMES:
        policy = make_policy(name, workload=workload, settings=PolicySettings())
        assert policy.score(node, pod, (0, 1))[1] is None
        assert policy.score(node, CPU_ONLY, ())[1] is None


def test_make_policy_rejects_unknown_names_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match="fgd") as err:
        make_policy("tetris", workload=(), settings=PolicySettings())
    assert "tetris" in str(err.value)


# -- the API's properties -----------------------------------------------------------------------

free_amounts = st.lists(st.integers(0, 100), min_size=1, max_size=8).map(tuple)
node_states = st.builds(
    NodeState, st.sampled_from(["G2", "T4"]), st.integers(0, 96000), free_amounts
)
pod_shapes = st.one_of(
    st.builds(share, st.integers(0, 32000), st.integers(1, 99)),
    st.builds(whole, st.integers(0, 32000), st.integers(1, 4)),
    st.builds(PodShape, st.integers(0, 32000), st.just(0), st.just(0)),
)
WORKLOAD: Workload = (
    TypicalPod(share(3152, 81), 0.3),
    TypicalPod(share(8000, 47), 0.2),
    TypicalPod(whole(11300, 1), 0.3),
    TypicalPod(whole(30000, 4), 0.05),
    TypicalPod(PodShape(12500, 0, 0), 0.15),
)


@settings(max_examples=150, deadline=None)
@given(node=node_states, pod=pod_shapes, name=st.sampled_from(POLICY_NAMES))
def test_scores_are_pure_pick_a_candidate_and_ignore_gpu_order(
    node: NodeState, pod: PodShape, name: str
) -> None:
    candidates = share_candidates(node, pod)
    if not fits(node, pod, candidates):
        return
    policy = make_policy(name, workload=WORKLOAD, settings=PolicySettings())
    score, gpu = policy.score(node, pod, candidates)
    assert math.isfinite(score)
    assert policy.score(node, pod, candidates) == (score, gpu)
    if not pod.is_share:
        assert gpu is None
        return
    assert gpu in candidates
    view, order = canonical(node)
    c_score, c_gpu = policy.score(view, pod, share_candidates(view, pod))
    assert c_score == score
    assert c_gpu is not None
    # the canonical choice maps back to a real GPU with the same free amount
    assert node.gpu_free[order[c_gpu]] == view.gpu_free[c_gpu]


@settings(max_examples=150, deadline=None)
@given(node=node_states)
def test_fragmentation_is_bounded_by_idle_gpu(node: NodeState) -> None:
    frag = Fragmentation(WORKLOAD)(node)
    assert 0 <= frag <= sum(node.gpu_free) + 1e-9
    assert frag == pytest.approx(
        sum(t.popularity * task_fragmentation(node, t.shape) for t in WORKLOAD)
    )


def test_canonical_sorts_ascending_and_keeps_the_mapping() -> None:
    view, order = canonical(NodeState("T4", 1, (50, 0, 100, 50)))
    assert view.gpu_free == (0, 50, 50, 100)
    assert order == (1, 0, 3, 2)
    same, ident = canonical(view)
    assert same is view and ident == (0, 1, 2, 3)


# -- typical workload ---------------------------------------------------------------------------


def test_typical_workload_keeps_the_top_shapes_covering_the_threshold() -> None:
    shapes = [share(1000, 50)] * 60 + [whole(0, 1)] * 30 + [whole(9000, 8)] * 6 + [CPU_ONLY] * 4
    wl = typical_workload(shapes, coverage=0.95)
    # 60 + 30 = 90 % < 95 %, + 6 = 96 % ≥ 95 %: three shapes, renormalised over 96 pods.
    assert [t.shape for t in wl] == [share(1000, 50), whole(100, 1), whole(9000, 8)]
    assert [t.popularity for t in wl] == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    assert sum(t.popularity for t in typical_workload(shapes, coverage=1.0)) == pytest.approx(1)
    assert typical_workload([]) == ()
    with pytest.raises(ValueError, match="coverage"):
        typical_workload(shapes, coverage=0)


# -- the measure is the one the published figures were made with ------------------------------

#: Free amounts past a whole GPU happen under oversubscription (frag.py's `_left`).
OVERSUBSCRIBED_STATES = st.builds(
    NodeState,
    st.sampled_from(["G2", "T4", "V100"]),
    st.integers(0, 130000),
    st.lists(st.integers(0, 130), min_size=0, max_size=8).map(tuple),
)
PINNED = (ANY, ANY, frozenset({"T4"}), frozenset({"V100", "G2"}))
drawn_workloads = st.lists(
    st.builds(
        TypicalPod,
        st.one_of(
            pod_shapes,
            st.builds(share, st.integers(0, 32000), st.integers(1, 99), st.sampled_from(PINNED)),
        ),
        st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
    ),
    max_size=8,
).map(lambda tps: (TypicalPod(share(3152, 81), 0.3), *tps))
CLUSTER_TYPES = (
    NodeType("G2", 8, 96000, 549),
    NodeType("T4", 2, 104000, 387),
    NodeType("T4", 4, 96000, 17),
    NodeType("V100", 1, 8000, 19),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    workload=st.one_of(st.sampled_from([WORKLOAD, OPENB_LIKE, MIX]), drawn_workloads),
    w=st.sampled_from([0.0, 0.3, 1.0]),
    mix=st.booleans(),
    types=st.one_of(st.just(()), st.lists(st.sampled_from(CLUSTER_TYPES), unique=True)),
    nodes=st.lists(st.one_of(NODE_STATES, OVERSUBSCRIBED_STATES), min_size=1, max_size=4),
    pods=st.lists(pod_shapes, min_size=1, max_size=4),
    subset=st.randoms(use_true_random=False),
)
def test_measure_and_score_are_the_references_bit_for_bit(
    workload: Workload,
    w: float,
    mix: bool,
    types: list[NodeType],
    nodes: list[NodeState],
    pods: list[PodShape],
    subset: random.Random,
) -> None:
    # Exact equality: the extender and the simulator must take the same decisions as the
    # code the published figures were made with (tests/packing/policies_reference.py).
    policy = FgdPolicy(workload, lookahead=w, types=tuple(types), mix=mix)
    reference = ReferenceFgdPolicy(workload, lookahead=w, types=tuple(types), mix=mix)
    # Repeated states and pods go through the memo as well as through the computation.
    for node in [*nodes, *nodes]:
        assert policy.frag(node) == reference.frag(node)
        for pod in pods:
            fitting = share_candidates(node, pod)
            any_gpus = tuple(i for i in range(len(node.gpu_free)) if subset.random() < 0.5)
            for candidates in (fitting, any_gpus):
                assert policy.score(node, pod, candidates) == reference.score(node, pod, candidates)
