"""Arrival weights (scarcity.py) by hand-computed cases, and the default policy keeping a node
type that pinned pods need for them where FGD cannot tell the nodes apart."""

from __future__ import annotations

import pytest

from extender.packing.policies import (
    NodeState,
    NodeType,
    PodShape,
    PolicySettings,
    TypicalPod,
    make_policy,
    node_types,
    share_candidates,
)
from extender.packing.policies.frag import Fragmentation
from extender.packing.policies.scarcity import UNBOUNDED_CPU, arrival_weights, can_host, fill
from extender.packing.workload import types_materially_different

ON_A = frozenset({"A"})
#: 20 % of pods: one whole GPU, and only on model A; 80 %: half a GPU, anywhere.
PINNED = TypicalPod(PodShape(1000, 100, 1, ON_A), 0.2)
HALF = TypicalPod(PodShape(1000, 50, 1), 0.8)
WORKLOAD = (PINNED, HALF)
#: Model A is a quarter of the cluster: one 2-GPU node; model B three.
TYPES = (NodeType("A", 2, 32_000, 1), NodeType("B", 2, 32_000, 3))


def test_a_pinned_type_fills_its_scarce_model_and_the_rest_spreads_over_the_others() -> None:
    # Mean ask G = 0.2*100 + 0.8*50 = 60; cluster 800 thread-%. Demand: pinned 800*20/60 =
    # 266.7 on A's 200 (A full: weight = G/100 * 200/200 = 0.6, the rest is dropped); the
    # halves 800*40/60 = 533.3 on what is left, B's 600: weight = G/50 * 533.3/600 = 16/15.
    w = arrival_weights(WORKLOAD, TYPES)
    assert w[("A", 2)] == pytest.approx((0.6, 0.0))
    assert w[("B", 2)] == pytest.approx((0.0, 16 / 15))


def test_without_constraints_the_weights_are_the_popularities() -> None:
    workload = (TypicalPod(PodShape(1000, 100, 1), 0.3), TypicalPod(PodShape(1000, 25, 1), 0.7))
    w = arrival_weights(workload, TYPES)
    assert w[("A", 2)] == pytest.approx((0.3, 0.7))
    assert w[("B", 2)] == pytest.approx((0.3, 0.7))


def test_a_type_goes_only_where_it_fits_and_keeps_fgds_rule_where_a_node_is_too_small() -> None:
    types = (NodeType("A", 8, 96_000, 1), NodeType("A", 2, 16_000, 4))
    eight = TypicalPod(PodShape(8000, 100, 8), 0.1)
    big_cpu = TypicalPod(PodShape(40_000, 0, 0), 0.1)
    one = TypicalPod(PodShape(1000, 100, 1), 0.8)
    w = arrival_weights((eight, big_cpu, one), types)
    # Cluster 16 GPUs, G = 0.1*800 + 0.8*100 = 160. Eight-GPU pods: demand 16*80/160 = 8 GPUs,
    # all of the 8-GPU node: weight 160/800 * 8/8 = 0.2. Then one-GPU pods: demand 8 GPUs on
    # the 8 left on the 2-GPU nodes: 160/100 * 8/8 = 1.6 there, nothing on the full node.
    # The 40-core CPU-only pods fit only the 96-core node: 0.1 * 16/8 = 0.2 there. On the
    # 2-GPU nodes, too small for both, they keep their popularity (FGD: all idle is fragment).
    assert w[("A", 8)] == pytest.approx((0.2, 0.2, 0.0))
    assert w[("A", 2)] == pytest.approx((0.1, 0.1, 1.6))


def test_fill_never_gives_more_than_is_left() -> None:
    left = [100.0, 300.0, 50.0]
    assert fill(200.0, [0, 1], left) == pytest.approx({0: 50.0, 1: 150.0})
    assert left == pytest.approx([50.0, 150.0, 50.0])
    assert fill(1000.0, [0, 1], left) == pytest.approx({0: 50.0, 1: 150.0})
    assert left == pytest.approx([0.0, 0.0, 50.0])
    assert fill(10.0, [0, 1], left) == {}


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


def test_the_measure_weighs_the_pinned_type_on_its_model_only() -> None:
    frag = Fragmentation(WORKLOAD, 0.0, TYPES)
    # One GPU half used: the pinned whole-GPU type sees the 50 % sliver, the halves none.
    assert frag.value("A", 32_000, (50, 100)) == pytest.approx(0.6 * 50)
    assert frag.value("B", 32_000, (50, 100)) == pytest.approx(0.0)
    # FGD (no node types) weighs it by popularity on both, and counts the idle of B for it.
    fgd = Fragmentation(WORKLOAD, 0.0)
    assert fgd.value("A", 32_000, (50, 100)) == pytest.approx(0.2 * 50)
    assert fgd.value("B", 32_000, (50, 100)) == pytest.approx(0.2 * 150)


def test_a_node_type_pinned_pods_need_is_kept_for_them() -> None:
    # A fifth of the pods must have model A (a quarter of the cluster), a fifth model B; the
    # rest are halves that can go anywhere. G = 20 + 20 + 30 = 70; A's pinned demand 800 * 20 /
    # 70 = 228.6 fills A (weight 0.7 * 200/200 = 0.7, no room for halves there); B's takes
    # 228.6 of B's 600 (weight 0.7 * 228.6/600 = 0.267), halves the remaining 371.4.
    workload = (
        TypicalPod(PodShape(1000, 100, 1, ON_A), 0.2),
        TypicalPod(PodShape(1000, 100, 1, frozenset({"B"})), 0.2),
        TypicalPod(PodShape(1000, 50, 1), 0.6),
    )
    settings = PolicySettings(lookahead=0.0)
    half = workload[2].shape
    a, b = NodeState("A", 32_000, (100, 100)), NodeState("B", 32_000, (100, 100))
    default = make_policy("default", workload=workload, settings=settings, types=TYPES)
    # A half on A breaks a GPU its pinned pods need: ΔF = -0.7 * 50, int(100 * sigmoid(-0.35))
    # = 41; on B: ΔF = -0.267 * 50, 46. The half goes to B.
    assert default.score(a, half, share_candidates(a, half))[0] == 41
    assert default.score(b, half, share_candidates(b, half))[0] == 46
    # FGD: on either node the half adds a 50 sliver for the type pinned there and takes 50 of
    # the idle, all fragment, of the type pinned elsewhere: ΔF = 0 on both, a tie (50).
    fgd = make_policy("fgd", workload=workload, settings=settings, types=TYPES)
    assert fgd.score(a, half, share_candidates(a, half))[0] == 50
    assert fgd.score(b, half, share_candidates(b, half))[0] == 50
