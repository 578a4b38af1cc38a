"""The capacity plan: for every strategy and seed, the smallest cluster that hosts a timed
workload with no pod waiting longer than the bound (a search over cluster sizes, each size one
replay in time), and then every strategy replayed on one common cluster for the curves.

A seed orders the nodes for ties (as the FGD paper's simulator does) and, for a workload
without times, draws its arrivals and lifetimes. Jobs (one strategy and seed each) run in up to
`jobs` forked processes (`workers`); every replay builds its policy for the cluster it runs on,
as `serve` would for that cluster.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.packing.policies import PolicySettings, all_shapes, make_policy, typical_workload
from extender.packing.policies.frag import Fragmentation
from extender.packing.settings import BudgetSettings
from extender.simulate.pool import copies, gpu_count, scaled_order, smallest
from extender.simulate.replay import cluster_node_types, tie_order
from extender.simulate.strategy import Strategy
from extender.simulate.timed import TimedPod
from extender.simulate.timeline import Outcome, Summary, replay
from extender.simulate.types import SimNode
from extender.simulate.workers import run_jobs


@dataclass(frozen=True, slots=True)
class Sizing:
    """How clusters grow: `nodes` is either the pool (scaled keeping its mix) or one node type
    (counted); sizes go up to `limit` nodes."""

    nodes: tuple[SimNode, ...]
    limit: int
    by_type: bool = False

    def cluster(self, size: int) -> list[SimNode]:
        return copies(self.nodes[0], size) if self.by_type else scaled_order(self.nodes, size)

    def size_for(self, gpus: int, per_model: Mapping[str, int] | None = None) -> int:
        """The smallest size with at least `gpus` GPUs, and at least `per_model[m]` GPUs of
        each model m (the limit where none has)."""
        need = dict(per_model or {})
        if self.by_type:
            template = self.nodes[0]
            per_node = len(template.inventory.gpus)
            if not per_node or set(need) - {template.model}:
                return self.limit
            most = max(gpus, need.get(template.model, 0))
            return max(1, min(self.limit, -(-most // per_node)))
        total = 0
        have: dict[str, int] = {}
        for n, node in enumerate(self.cluster(self.limit), 1):
            total += len(node.inventory.gpus)
            have[node.model] = have.get(node.model, 0) + len(node.inventory.gpus)
            if total >= gpus and all(have.get(m, 0) >= k for m, k in need.items()):
                return n
        return self.limit


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a job needs besides its strategy and seed (pickled to a worker)."""

    sizing: Sizing
    max_wait: float
    budgets: BudgetSettings
    policy: PolicySettings
    #: Where the search starts: the smallest size that meets the lower bound (`size_for`).
    start: int


@dataclass(frozen=True, slots=True)
class SeedAnswer:
    """One strategy and seed: the GPUs and nodes of the smallest cluster that hosted (None: not
    even the largest tried), the sizes tried, and the figures of the replay at that size."""

    seed: int
    gpus: int | None
    nodes: int | None
    gpus_by_model: dict[str, int]
    replays: int
    tried: dict[int, bool]
    at_answer: Summary | None
    seconds: float
    #: What kept the largest size that failed from hosting: the pod found waiting too long
    #: there ("name: what it asks"), and that size's GPUs.
    blocker: str | None = None
    blocked_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class StrategyAnswer:
    strategy: Strategy
    seeds: tuple[SeedAnswer, ...]

    @property
    def gpus(self) -> list[int | None]:
        return [s.gpus for s in self.seeds]

    @property
    def mean(self) -> float | None:
        found = [g for g in self.gpus if g is not None]
        return statistics.fmean(found) if found and len(found) == len(self.seeds) else None

    @property
    def spread(self) -> tuple[int, int] | None:
        found = [g for g in self.gpus if g is not None]
        return (min(found), max(found)) if found and len(found) == len(self.seeds) else None


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every strategy replayed on one cluster (the smallest any strategy needed, first seed),
    with curves: how the others fare on the cluster the best one needs."""

    nodes: int
    gpus: int
    seed: int
    outcomes: dict[str, Outcome] = field(default_factory=dict)


def run_once(
    settings: Settings,
    strategy: Strategy,
    timed: Sequence[TimedPod],
    seed: int,
    size: int,
    *,
    max_wait: float | None,
    fragmentation: Fragmentation | None = None,
    buckets: int = 0,
) -> Outcome:
    """One replay of `timed` on the cluster of `size`."""
    nodes = settings.sizing.cluster(size)
    shapes = [strategy.transform(t.pod).shape for t in timed]
    workload = typical_workload(shapes, coverage=settings.policy.workload_coverage)
    policy = make_policy(
        strategy.policy,
        workload=workload,
        settings=settings.policy,
        types=cluster_node_types(nodes),
        demand=all_shapes(shapes),
    )
    rank = tie_order(len(nodes), random.Random(seed))
    return replay(
        nodes,
        timed,
        strategy,
        policy,
        settings.budgets,
        rank,
        max_wait=max_wait,
        fragmentation=fragmentation,
        buckets=buckets,
    )


def answer_seed(
    settings: Settings, strategy: Strategy, timed: Sequence[TimedPod], seed: int
) -> SeedAnswer:
    """The search for one strategy and seed (module docstring)."""
    outcomes: dict[int, Outcome] = {}

    def hosts(size: int) -> bool:
        outcomes[size] = run_once(settings, strategy, timed, seed, size, max_wait=settings.max_wait)
        return outcomes[size].hosted

    sizing = settings.sizing
    found = smallest(hosts, start=settings.start, limit=sizing.limit, below=settings.max_wait > 0)
    seconds = sum(o.seconds for o in outcomes.values())
    failed = [size for size, ok in found.tried.items() if not ok]
    blocker = blocked_gpus = None
    if failed:
        worst = outcomes[max(failed)]
        blocked_gpus = worst.gpus
        if worst.blocker is not None:
            blocker = describe(timed[worst.blocker])
    size = found.size  # None: no cluster tried hosted the workload
    nodes = [] if size is None else sizing.cluster(size)
    by_model: dict[str, int] = {}
    for node in nodes:
        if node.inventory.gpus:
            by_model[node.model] = by_model.get(node.model, 0) + len(node.inventory.gpus)
    return SeedAnswer(
        seed,
        None if size is None else gpu_count(nodes),
        size,
        by_model,
        len(found.tried),
        found.tried,
        None if size is None else outcomes[size].summary(),
        seconds,
        blocker,
        blocked_gpus,
    )


def describe(timed: TimedPod) -> str:
    """A pod as a person reads it: name, CPU, memory, GPU ask."""
    pod = timed.pod
    shape = pod.shape
    gpu = (
        "no GPU"
        if shape.gpus == 0
        else (f"{shape.threads} % of a GPU" if shape.is_share else f"{shape.gpus} whole GPU(s)")
    )
    models = f" on {'|'.join(sorted(shape.models))}" if shape.models else ""
    return (
        f"{pod.name}: {gpu}{models}, {pod.cpu_milli / 1000:g} CPUs, "
        f"{pod.memory_mib / 1024:.0f} GiB, lives {timed.lifetime:.0f}s"
    )


Job = tuple[Strategy, int]


def answer_all(
    settings: Settings,
    strategies: Sequence[Strategy],
    workloads: Callable[[int], Sequence[TimedPod]],
    seeds: Sequence[int],
    *,
    jobs: int,
    done: Callable[[int, int], None] | None = None,
) -> list[StrategyAnswer]:
    """Every strategy's answer over `seeds`; `workloads(seed)` is the timed workload of a seed.
    `done(finished, total)` after each job."""
    todo: list[Job] = [(s, seed) for s in strategies for seed in seeds]

    def job(k: int) -> SeedAnswer:
        strategy, seed = todo[k]
        return answer_seed(settings, strategy, workloads(seed), seed)

    answers = run_jobs(job, len(todo), jobs=jobs, done=done)
    results = dict(zip(todo, answers, strict=True))
    return [StrategyAnswer(s, tuple(results[(s, seed)] for seed in seeds)) for s in strategies]


def compare(
    settings: Settings,
    strategies: Sequence[Strategy],
    timed: Sequence[TimedPod],
    seed: int,
    size: int,
    fragmentation: Fragmentation,
    *,
    buckets: int,
) -> Comparison:
    """Every strategy on the cluster of `size`, to the end of the workload, with curves."""
    outcomes = {
        s.name: run_once(
            settings,
            s,
            timed,
            seed,
            size,
            max_wait=None,
            fragmentation=fragmentation,
            buckets=buckets,
        )
        for s in strategies
    }
    first = next(iter(outcomes.values()))
    return Comparison(first.nodes, first.gpus, seed, outcomes)
