"""The capacity plan on hand-made traces whose answers are counted by hand: the replay in time
(waits, departures that make room, the queue's order), the strategies' rewrites, the search
for the smallest cluster, the lower bound and the mix-keeping pool."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from extender.config import Config, load_config_text
from extender.packing.policies import make_policy, typical_workload
from extender.simulate.planner import Settings, Sizing, answer_seed, run_once
from extender.simulate.pool import PoolError, copies, parse_node_type, scaled_order, smallest
from extender.simulate.strategy import StrategyError, parse_strategies, parse_strategy
from extender.simulate.timed import (
    Synthetic,
    TimedPod,
    draw_times,
    lower_bound,
    with_load,
)
from extender.simulate.timeline import percentile, replay
from extender.simulate.trace import trace_pod
from extender.simulate.types import SimNode

BENCH = """
budgets: {memoryReserveMiB: 0, clientOverheadMiB: 0, preVolta: share}
gpuModels:
  G2: {memoryMiB: 32768, computeCapability: "7.0"}
  G3: {memoryMiB: 32768, computeCapability: "7.0"}
"""


@pytest.fixture
def config() -> Config:
    return load_config_text(BENCH)


def node(config: Config, spec: str) -> SimNode:
    return parse_node_type(spec, (), config.gpu_models, budgets=config.budgets)


def pod(
    name: str, milli: int, arrival: float, life: float, *, cpu: int = 1000, gpus: int = 1
) -> TimedPod:
    return TimedPod(trace_pod(name, cpu, 1024, gpus if milli else 0, milli, ""), arrival, life)


def run(
    config: Config, nodes: Sequence[SimNode], pods: Sequence[TimedPod], spec: str, **kw: object
) -> object:
    strategy = parse_strategy(spec)
    workload = typical_workload(strategy.transform(t.pod).shape for t in pods)
    policy = make_policy(strategy.policy, workload=workload, settings=config.policy)
    rank = list(range(len(nodes)))
    return replay(nodes, pods, strategy, policy, config.budgets, rank, **kw)  # type: ignore[arg-type]


def settings(config: Config, template: SimNode, start: int, max_wait: float = 0.0) -> Settings:
    """Clusters of up to 50 nodes of `template`; the search starts at `start` nodes."""
    return Settings(
        Sizing((template,), 50, by_type=True), max_wait, config.budgets, config.policy, start
    )


# -- the strategies ----------------------------------------------------------------------------


def test_whole_rounds_a_share_up_to_one_gpu() -> None:
    share = trace_pod("p", 1000, 1024, 1, 300, "")
    rewritten = parse_strategy("whole").transform(share)
    assert (rewritten.request.kind, rewritten.request.whole_gpus, rewritten.shape.threads) == (
        "whole",
        1,
        100,
    )
    assert parse_strategy("default").transform(share) is share


@pytest.mark.parametrize(
    ("units", "milli", "threads"),
    [(4, 300, 50), (4, 250, 25), (4, 260, 50), (4, 800, 100), (3, 300, 33), (10, 1, 10)],
)
def test_equal_takes_the_fewest_units_covering_the_share(
    units: int, milli: int, threads: int
) -> None:
    rewritten = parse_strategy(f"equal:{units}").transform(trace_pod("p", 1000, 1024, 1, milli, ""))
    assert rewritten.shape.threads == threads
    # k = N is a whole GPU; fewer units a share whose memory follows its threads.
    assert rewritten.request.kind == ("whole" if threads == 100 else "share")


def test_strategy_specs() -> None:
    names = [s.name for s in parse_strategies("whole, equal:4,default,whole@bestfit,fgd,default")]
    assert names == ["whole", "equal:4", "default", "whole@bestfit", "fgd"]
    for bad in ("equal:0", "equal:x", "bogus", "fgd@bestfit", "whole@nope", ""):
        with pytest.raises(StrategyError):
            parse_strategies(bad)


# -- the replay in time ------------------------------------------------------------------------


def test_departures_free_capacity_that_a_waiting_pod_then_takes(config: Config) -> None:
    gpu = [node(config, "G2:1:64000:262144")]
    pods = [
        pod("a", 600, 0, 100),  # holds 60 % until t=100
        pod("b", 600, 10, 50),  # does not fit beside a: waits 90 s, then runs on a's room
        pod("c", 300, 20, 10),  # fits beside a at once: b, waiting, does not hold it back
        pod("d", 600, 15, 10),  # younger than b: when a leaves, b goes first; d waits for b
    ]
    out = run(config, gpu, with_load(pods, 1.0), "default")
    assert out.hosted and out.placed == 4  # type: ignore[attr-defined]
    # arrival order a(0) b(10) d(15) c(20); b placed at 100, d at 150 (b's end).
    assert out.waits == [0.0, 90.0, 135.0, 0.0]  # type: ignore[attr-defined]
    assert out.peak_waiting == 2  # type: ignore[attr-defined]


def test_waits_equal_the_hand_count_per_strategy(config: Config) -> None:
    # One GPU; two 30 % pods for 100 s, then a 50 % pod at t=10 for 10 s. mpsched: 110 % is
    # too much, the 50 % pod waits until both leave at t=100: 90 s. equal:4: 2 + 2 units fill
    # the GPU, the third's 2 units wait the same 90 s. whole: the second pod waits for the
    # first (100 s); at t=100 it goes first (older), so the third waits for it: until t=200.
    gpu = [node(config, "G2:1:64000:262144")]
    pods = with_load([pod("a", 300, 0, 100), pod("b", 300, 0, 100), pod("c", 500, 10, 10)], 1.0)
    waits = {s: run(config, gpu, pods, s).waits for s in ("default", "equal:4", "whole")}  # type: ignore[attr-defined]
    assert waits == {
        "default": [0.0, 0.0, 90.0],
        "equal:4": [0.0, 0.0, 90.0],
        "whole": [0.0, 100.0, 190.0],
    }


def test_the_replay_stops_at_the_first_pod_waiting_past_the_bound(config: Config) -> None:
    gpu = [node(config, "G2:1:64000:262144")]
    pods = with_load([pod("a", 1000, 0, 100), pod("b", 1000, 5, 10), pod("c", 0, 500, 1)], 1.0)
    out = run(config, gpu, pods, "default", max_wait=30.0)
    assert (out.hosted, out.stopped_early, out.placed) == (False, True, 1)  # type: ignore[attr-defined]
    assert run(config, gpu, pods, "default", max_wait=95.0).hosted  # type: ignore[attr-defined]


def test_load_divides_arrivals_and_keeps_lifetimes() -> None:
    pods = with_load([pod("a", 500, 100, 7), pod("b", 500, 40, 9)], 4.0)
    assert [(t.pod.name, t.arrival, t.lifetime) for t in pods] == [("b", 10, 9), ("a", 25, 7)]


def test_drawn_times_depend_on_the_seed_only() -> None:
    base = [pod(f"p{i}", 300, 0, 0).pod for i in range(50)]
    synthetic = Synthetic(rate=0.5, mean_lifetime=60.0)
    one, again, other = (draw_times(base, synthetic, s) for s in (1, 1, 2))
    assert one == again and one != other
    assert one[0].arrival == 0 and all(a.arrival < b.arrival for a, b in itertools.pairwise(one))
    fixed = draw_times(base, Synthetic(0.5, 60.0, "fixed"), 1)
    assert {t.lifetime for t in fixed} == {60.0}


def test_equal_split_wastes_exactly_one_gpu_per_node(config: Config) -> None:
    # Nodes of 2 GPUs and CPU for 3 pods; 30 % pods: mpsched puts a node's 3 on one GPU (90 %),
    # equal:4 gives each 2 units (half a GPU), so a node's 3 need both GPUs.
    nodes = copies(node(config, "G2:2:3000:262144"), 3)
    pods = with_load([pod(f"p{i}", 300, i, 1000) for i in range(9)], 1.0)
    ours = run(config, nodes, pods, "bestfit")
    equal = run(config, nodes, pods, "equal:4@bestfit")
    assert ours.hosted and equal.hosted  # type: ignore[attr-defined]
    assert ours.peak_busy_gpus == 3  # type: ignore[attr-defined]
    assert equal.peak_busy_gpus == ours.peak_busy_gpus + len(nodes)  # type: ignore[attr-defined]
    # Demand placed counts the share asked (9 × 30 %), whatever equal:4 rounded it to.
    assert ours.peak_demand_gpus == equal.peak_demand_gpus == 2.7  # type: ignore[attr-defined]
    assert equal.peak_booked_gpus == 4.5  # type: ignore[attr-defined]


# -- the answer --------------------------------------------------------------------------------


def test_gpus_needed_per_strategy_equal_the_hand_count(config: Config) -> None:
    # Four pods alive together: 30+30+30+10 % = one GPU with mpsched; equal:4 takes 2+2+2+1
    # units = 7 of 4 per GPU: 2 GPUs; whole: 4 GPUs. Nodes of one GPU, counted.
    pods = with_load([pod(f"p{i}", m, 0, 100) for i, m in enumerate((300, 300, 300, 100))], 1.0)
    bound = lower_bound(pods)
    assert bound.gpus == 1 and bound.peak_demand_gpus == 1.0
    template = node(config, "G2:1:64000:262144")
    needed = {
        spec: answer_seed(
            settings(config, template, bound.gpus), parse_strategy(spec), pods, 7
        ).gpus
        for spec in ("default", "equal:4", "whole")
    }
    assert needed == {"default": 1, "equal:4": 2, "whole": 4}


def test_a_positive_wait_bound_lets_a_smaller_cluster_host(config: Config) -> None:
    # Two whole-GPU pods of 100 s arriving together: 2 GPUs with no wait, 1 when one may
    # wait 100 s (below the no-wait bound, which the search then looks under).
    pods = with_load([pod("a", 1000, 0, 100), pod("b", 1000, 0, 100)], 1.0)
    template = node(config, "G2:1:64000:262144")
    strategy = parse_strategy("default")
    assert answer_seed(settings(config, template, 2), strategy, pods, 1).gpus == 2
    relaxed = answer_seed(settings(config, template, 2, max_wait=100.0), strategy, pods, 1)
    assert relaxed.gpus == 1 and relaxed.at_answer is not None
    assert relaxed.at_answer.wait_max == 100.0 and relaxed.at_answer.waited == 1


def test_the_lower_bound_rounds_up_per_pinned_model(config: Config) -> None:
    # 0.5 GPU pinned to G3 and 0.5 pinned (by its CPU: only G3 nodes have 100 cores) to G3 as
    # well, plus 0.6 that runs anywhere: peak 1.6 → 2, per model G3 1; a pod pinned to G2 of
    # 0.2 makes G2 1 more: 2 = max(2, 1 + 1).
    pool = [node(config, "G2:8:96000:393216"), node(config, "G3:8:128000:786432")]
    pods = [
        TimedPod(trace_pod("g3", 1000, 1024, 1, 500, "G3"), 0, 10),
        pod("big", 500, 0, 10, cpu=100_000),
        pod("any", 600, 0, 10),
        TimedPod(trace_pod("g2", 1000, 1024, 1, 200, "G2"), 0, 10),
    ]
    bound = lower_bound(pods, pool)
    assert bound.per_model == {"G2": 1, "G3": 1}
    assert bound.gpus == 2 and bound.peak_demand_gpus == pytest.approx(1.8)
    # In a pool of one model, no pod pins it beyond what its gpu_spec says.
    assert lower_bound(pods, pool[1:]).per_model == {"G2": 1, "G3": 1}
    assert lower_bound(pods[1:3], pool[1:]).per_model == {}
    # A pod of no lifetime still needs its GPU for an instant.
    assert lower_bound([pod("flash", 1000, 5, 0)]).gpus == 1


def test_the_scaled_pool_keeps_its_mix(config: Config) -> None:
    big = copies(node(config, "G2:8:96000:393216"), 4, prefix="big")
    small = copies(node(config, "G3:2:32000:131072"), 2, prefix="small")
    pool = [*big, *small]
    first = scaled_order(pool, 3)
    assert [n.name for n in first] == ["big-1", "small-1", "big-2"]
    assert sorted(n.name for n in scaled_order(pool, 6)) == sorted(n.name for n in pool)
    grown = scaled_order(pool, 12)
    assert len({n.name for n in grown}) == 12 and "big-1~2" in {n.name for n in grown}
    assert sum(n.model == "G3" for n in grown) == 4
    # The search starts where both the GPUs and the GPUs of each pinned model are reached.
    sizing = Sizing(tuple(pool), 12)
    assert (sizing.size_for(8), sizing.size_for(8, {"G3": 2}), sizing.size_for(17)) == (1, 2, 3)
    assert sizing.size_for(10_000) == 12
    by_type = Sizing((small[0],), 50, by_type=True)
    assert (
        by_type.size_for(5),
        by_type.size_for(1, {"G3": 6}),
        by_type.size_for(1, {"G2": 1}),
    ) == (3, 3, 50)


def test_the_search_finds_the_smallest_size() -> None:
    calls: list[int] = []

    def hosts(size: int) -> bool:
        calls.append(size)
        return size >= 37

    assert smallest(hosts, start=5, limit=100, below=False).size == 37
    assert len(calls) <= 12  # galloping to 68, then bisection
    assert smallest(lambda s: s >= 3, start=20, limit=100, below=True).size == 3
    assert smallest(lambda s: s >= 20, start=20, limit=100, below=False).size == 20
    assert smallest(lambda s: False, start=1, limit=9, below=False).size is None


def test_node_types_are_read_or_refused(config: Config) -> None:
    template = node(config, "G2:4:48000:196608")
    assert (template.model, len(template.inventory.gpus), template.cpu_milli) == ("G2", 4, 48000)
    pool = copies(template, 3) + copies(node(config, "G2:4:8000:1024"), 1)
    assert (
        parse_node_type("G2:4", pool, config.gpu_models, budgets=config.budgets).cpu_milli == 48000
    )
    assert parse_node_type(pool[0].name, pool, config.gpu_models, budgets=config.budgets) is pool[0]
    for bad in ("G9:1", "G2", "G2:x", "G2:0", "T4:8"):
        with pytest.raises(PoolError, match=bad):
            parse_node_type(bad, pool, config.gpu_models, budgets=config.budgets)


def test_percentiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile([], 50)) == (50, 95, 0)


def test_run_once_builds_the_cluster_of_the_size(config: Config) -> None:
    pods = with_load([pod("a", 300, 0, 10)], 1.0)
    plan = settings(config, node(config, "G2:2:64000:262144"), 1)
    out = run_once(plan, parse_strategy("default"), pods, 3, 4, max_wait=0.0)
    assert (out.nodes, out.gpus, out.placed) == (4, 8, 1)
