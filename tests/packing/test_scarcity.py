"""Node types (scarcity.py): what each can host, which ones pinned pods contend for, and the
default policy keeping those for the pinned pods as FGD does."""

from __future__ import annotations

import pytest

from extender.packing.policies import (
    NodeState,
    NodeType,
    PodShape,
    PolicySettings,
    TypicalPod,
    all_shapes,
    make_policy,
    node_types,
    share_candidates,
    typical_workload,
)
from extender.packing.policies.frag import Fragmentation
from extender.packing.policies.scarcity import (
    UNBOUNDED_CPU,
    can_host,
    contested,
    pinned,
    pinned_load,
)
from extender.packing.workload import types_materially_different

ON_A = frozenset({"A"})
#: 30 % of pods: one whole GPU, and only on model A; the rest may go anywhere.
WORKLOAD = (
    TypicalPod(PodShape(8000, 100, 1, ON_A), 0.3),
    TypicalPod(PodShape(8000, 100, 1), 0.5),
    TypicalPod(PodShape(4000, 50, 1), 0.1),
    TypicalPod(PodShape(8000, 0, 0), 0.1),
)
#: Model A on small 2-GPU nodes, model B on 8-GPU nodes.
TYPES = (NodeType("A", 2, 64_000, 10), NodeType("B", 8, 96_000, 10))


def test_can_host_checks_model_gpu_count_and_cpu() -> None:
    node = NodeType("A", 2, 16_000, 1)
    assert can_host(node, PodShape(16_000, 100, 2, ON_A))
    assert not can_host(node, PodShape(16_000, 100, 4))
    assert not can_host(node, PodShape(16_001, 50, 1))
    assert not can_host(node, PodShape(1000, 50, 1, frozenset({"B"})))
    assert can_host(node, PodShape(1000, 0, 0, frozenset({"B"})))


def test_node_types_group_by_model_and_gpu_count() -> None:
    types = node_types([("A", 2, 16_000), ("A", 2, 32_000), ("A", 4, None), ("B", 0, 8000)])
    assert types == (NodeType("A", 2, 32_000, 2), NodeType("A", 4, UNBOUNDED_CPU, 1))


def test_a_node_or_two_more_is_not_a_different_cluster_a_new_type_is() -> None:
    old = (NodeType("A", 8, 96_000, 500), NodeType("B", 2, 64_000, 400))
    assert not types_materially_different(old, (old[0], NodeType("B", 2, 64_000, 402)))
    assert types_materially_different(old, (old[0], NodeType("B", 2, 64_000, 600)))
    assert types_materially_different(old, (*old, NodeType("C", 1, 8000, 1)))


def test_a_type_is_pinned_only_where_its_models_keep_it_off_a_node_type_it_fits() -> None:
    assert pinned(PodShape(1000, 100, 1, ON_A), TYPES)
    assert pinned(PodShape(1000, 30, 1, frozenset({"A", "C"})), TYPES)
    # Every node type that could host it is allowed: it may go anywhere.
    assert not pinned(PodShape(1000, 100, 1, frozenset({"A", "B"})), TYPES)
    # B is the only type with 8 GPUs: naming it keeps the pod off nothing it could use.
    assert not pinned(PodShape(1000, 100, 8, frozenset({"B"})), TYPES)
    assert not pinned(PodShape(1000, 100, 1), TYPES)
    assert not pinned(PodShape(1000, 0, 0, ON_A), TYPES)


def test_a_node_type_is_contested_where_a_pinned_type_may_run() -> None:
    assert contested(TYPES[0], WORKLOAD, TYPES)
    assert not contested(TYPES[1], WORKLOAD, TYPES)
    unpinned = tuple(tp for tp in WORKLOAD if not tp.shape.models)
    assert not any(contested(t, unpinned, TYPES) for t in TYPES)
    # A pinned type too big for the node type (CPU) does not contest it.
    big = (TypicalPod(PodShape(65_000, 100, 1, ON_A), 1.0),)
    assert not contested(TYPES[0], big, TYPES)


def test_contested_nodes_get_fgds_measure_the_others_look_ahead() -> None:
    fgd = Fragmentation(WORKLOAD)
    measure = Fragmentation(WORKLOAD, 0.3, TYPES, mix=True)
    plain = Fragmentation(WORKLOAD, 0.3, mix=True)
    a = NodeState("A", 30_000, (100, 70))
    b = NodeState("B", 30_000, (100, 100, 40, 0, 0, 0, 0, 0))
    assert measure(a) == fgd(a)
    assert measure(a) != plain(a)
    # On B the mix holds only the types B can host: the pinned type takes no part in it.
    hosted = tuple(
        TypicalPod(tp.shape, tp.popularity if not tp.shape.models else 0.0) for tp in WORKLOAD
    )
    assert measure(b) == pytest.approx(Fragmentation(hosted, 0.3, mix=True)(b) + 0.3 * 240)


@pytest.mark.parametrize("name", ["default", "typefill"])
def test_unpinned_pods_are_kept_off_the_nodes_pinned_pods_need(name: str) -> None:
    # FGD scores a whole unpinned GPU pod 59 on a B node and 52 on an A node: on B it takes
    # GPU that is all fragment for the type pinned to A. The arrival weighting this replaced
    # counted the pinned type 0 on B and the unpinned types nearly 0 on A, and scored 52 on
    # both: a tie, which sent unpinned pods onto A and failed the pinned ones.
    pod = PodShape(8000, 100, 1)
    policy = make_policy(name, workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    fgd = make_policy("fgd", workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    for a, b in [
        (NodeState("A", 64_000, (100, 100)), NodeState("B", 96_000, (100,) * 8)),
        (NodeState("A", 56_000, (0, 100)), NodeState("B", 88_000, (0,) + (100,) * 7)),
    ]:
        on_a = policy.score(a, pod, share_candidates(a, pod))[0]
        on_b = policy.score(b, pod, share_candidates(b, pod))[0]
        assert on_a < fgd.score(a, pod, share_candidates(a, pod))[0]
        assert on_b > on_a


@pytest.mark.parametrize("name", ["default", "typefill"])
def test_a_pod_that_may_go_elsewhere_is_placed_last_where_pinned_pods_alone_fill(
    name: str,
) -> None:
    # The pinned type alone would take 1.76 of A's GPUs (its pinned load). FGD scores an
    # unpinned half 61 beside a half left on A and 48 on an empty B: on A it fills a GPU
    # exactly, and FGD sends it there, taking GPU a pinned pod would have used (in the pinned
    # grid's share-heavy cells the pinned pods that then fail are what the default lost to
    # FGD). A node type pinned pods alone fill is the last place for such a pod.
    policy = make_policy(name, workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    fgd = make_policy("fgd", workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    a = NodeState("A", 64_000, (100, 50))
    b = NodeState("B", 96_000, (100,) * 8)
    half = PodShape(4000, 50, 1)
    assert fgd.score(a, half, share_candidates(a, half)) > fgd.score(b, half, (0,))
    on_a = policy.score(a, half, share_candidates(a, half))
    assert on_a[1] == 1
    # Below every score a node that is not reserved can have (0 to 100).
    assert on_a[0] < 0.0
    # A pod pinned to A has nowhere else to go: it gets FGD's score there.
    pinned_pod = PodShape(8000, 100, 1, ON_A)
    candidates = share_candidates(a, pinned_pod)
    assert policy.score(a, pinned_pod, candidates) == fgd.score(a, pinned_pod, candidates)


def test_where_a_node_type_is_contested_the_others_score_no_lower_than_fgd() -> None:
    # The look-ahead alone scores these pods lower on B than FGD does (a half beside a half
    # left, a CPU-only pod on a node whose CPU GPU pods need). With A contested, B's score is
    # floored at FGD's: the look-ahead may draw pods to B, never push them to A.
    policy = make_policy("default", workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    alone = make_policy("default", workload=WORKLOAD, settings=PolicySettings(), types=TYPES[1:])
    fgd = make_policy("fgd", workload=WORKLOAD, settings=PolicySettings(), types=TYPES)
    b = NodeState("B", 40_000, (50,) + (100,) * 7)
    for pod in (PodShape(4000, 50, 1), PodShape(8000, 0, 0)):
        candidates = share_candidates(b, pod)
        floor = fgd.score(b, pod, candidates)
        assert alone.score(b, pod, candidates)[0] < floor[0]
        assert policy.score(b, pod, candidates) == floor
    # Where the look-ahead scores higher, it stands.
    pod = PodShape(8000, 100, 1)
    b = NodeState("B", 96_000, (100,) * 8)
    candidates = share_candidates(b, pod)
    assert policy.score(b, pod, candidates) == alone.score(b, pod, candidates)


def test_the_pinned_load_is_the_share_of_its_hosts_pinned_demand_would_take() -> None:
    # GPU asked per pod on average: 0.3*100 + 0.5*100 + 0.1*50 = 85; the cluster's 100 GPUs
    # filled, the pinned type asks 100 * 30 / 85 = 35.3 GPUs, all on A's 20: 1.76.
    assert pinned_load(TYPES[0], WORKLOAD, TYPES) == pytest.approx(100 * 30 / 85 / 20)
    assert pinned_load(TYPES[1], WORKLOAD, TYPES) == 0.0
    # Ten times fewer pinned pods (mean ask 0.03*100 + 0.5*100 + 0.1*50 = 58) ask 100 * 3 / 58
    # = 5.2 GPUs, 0.26 of A: A looks ahead with 0.74 of the weight.
    light = (TypicalPod(WORKLOAD[0].shape, 0.03), *WORKLOAD[1:])
    load = pinned_load(TYPES[0], light, TYPES)
    assert load == pytest.approx(100 * 3 / 58 / 20)
    a = NodeState("A", 30_000, (100, 70))
    measure = Fragmentation(light, 0.3, TYPES, mix=True)
    weighed = Fragmentation(light, 0.3 * (1.0 - load), TYPES[:1], mix=True)
    assert measure(a) == weighed(a)


def test_a_contested_node_type_that_looks_ahead_scores_no_higher_than_fgd() -> None:
    # With few pinned pods A keeps part of its look-ahead (load 0.26), which alone scores a
    # half on an empty A above FGD; A's score is capped at FGD's, so the look-ahead can make a
    # node pinned pods need less attractive than FGD finds it, never more.
    light = (TypicalPod(WORKLOAD[0].shape, 0.03), *WORKLOAD[1:])
    load = pinned_load(TYPES[0], light, TYPES)
    settings = PolicySettings()
    policy = make_policy("default", workload=light, settings=settings, types=TYPES)
    alone = make_policy(
        "default",
        workload=light,
        settings=PolicySettings(lookahead=settings.lookahead * (1.0 - load)),
        types=TYPES[:1],
    )
    fgd = make_policy("fgd", workload=light, settings=settings, types=TYPES)
    a = NodeState("A", 64_000, (100, 100))
    pod = PodShape(4000, 50, 1)
    candidates = share_candidates(a, pod)
    assert alone.score(a, pod, candidates)[0] > fgd.score(a, pod, candidates)[0]
    assert policy.score(a, pod, candidates) == fgd.score(a, pod, candidates)
    # Where the look-ahead scores lower, it stands.
    a = NodeState("A", 64_000, (50, 100))
    candidates = share_candidates(a, pod)
    assert alone.score(a, pod, candidates)[0] < fgd.score(a, pod, candidates)[0]
    assert policy.score(a, pod, candidates) == alone.score(a, pod, candidates)


def _rare_pins() -> list[PodShape]:
    # 95 unpinned pods of two shapes, and 5 pinned to A, each of its own shape: the typical
    # workload's cut (the most frequent shapes up to 95 % of the pods) keeps no pinned shape,
    # though the pinned pods ask 5 % of the GPU.
    unpinned = [PodShape(8000, 100, 1)] * 60 + [PodShape(4000, 50, 1)] * 35
    return unpinned + [PodShape(1000 * (k + 1), 100, 1, ON_A) for k in range(5)]


def test_the_pinned_load_counts_the_pinned_shapes_the_typical_cut_drops() -> None:
    shapes = _rare_pins()
    typical = typical_workload(shapes)
    assert not any(tp.shape.models for tp in typical)
    assert pinned_load(TYPES[0], typical, TYPES) == 0.0
    # Mean ask 0.6*100 + 0.35*50 + 0.05*100 = 82.5: the pinned pods ask 100 * 5 / 82.5 = 6.1
    # of the cluster's 100 GPUs, all on A's 20.
    demand = all_shapes(shapes)
    assert pinned_load(TYPES[0], demand, TYPES) == pytest.approx(100 * 5 / 82.5 / 20)
    assert pinned_load(TYPES[1], demand, TYPES) == 0.0


def test_a_node_type_rare_pinned_shapes_need_is_bounded_by_fgd() -> None:
    # Measured against the typical workload alone, A is uncontested and the look-ahead scores
    # a half on an empty A above FGD. With every shape's demand A is contested: its score is
    # capped at FGD's, and B's floored there.
    shapes = _rare_pins()
    typical = typical_workload(shapes)
    settings = PolicySettings()
    blind = make_policy("default", workload=typical, settings=settings, types=TYPES)
    policy = make_policy(
        "default", workload=typical, settings=settings, types=TYPES, demand=all_shapes(shapes)
    )
    fgd = make_policy("fgd", workload=typical, settings=settings, types=TYPES)
    a = NodeState("A", 64_000, (100, 100))
    pod = PodShape(4000, 50, 1)
    candidates = share_candidates(a, pod)
    assert blind.score(a, pod, candidates)[0] > fgd.score(a, pod, candidates)[0]
    assert policy.score(a, pod, candidates) == fgd.score(a, pod, candidates)
