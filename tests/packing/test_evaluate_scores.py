"""The evaluator's shared scores: a policy is a pure function of (node state, pod shape,
candidate GPUs), so signatures that differ in what it does not see share one score per node
state, and every answer is still the one fit and score give directly."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, fit_node
from extender.packing.policies import NodeState, PodShape, Policy
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.results import Demand, make_demand
from extender.packing.view import pod_shape, share_gpu
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod

NAMES = [f"n{i:02d}" for i in range(40)]


@dataclass
class CountingPolicy:
    """The service's policy, counting the scores asked of it."""

    inner: Policy
    calls: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def score(
        self, node: NodeState, pod: PodShape, candidates: Sequence[int]
    ) -> tuple[float, int | None]:
        self.calls += 1
        return self.inner.score(node, pod, candidates)


@pytest.fixture
async def service() -> AsyncIterator[ExtenderService]:
    # Nodes in a few states: empty, and shares of 20-80 % on some GPUs.
    objects = [gpu_node(n, gpus=4, cpu="32") for n in NAMES]
    objects += [
        pod(f"run-{i}", threads=20 * (1 + i % 4), node=n, phase="Running")
        for i, n in enumerate(NAMES)
        if i % 3
    ]
    svc = ExtenderService(cluster=EmbeddedCluster.from_objects(objects), config=Config.default())
    await svc.start()
    yield svc
    await svc.close()


def _evaluator(svc: ExtenderService) -> tuple[Evaluator, CountingPolicy]:
    policy = CountingPolicy(svc.state.evaluator.policy)
    ev = Evaluator(svc.state.ledger, Config.default().budgets, policy, cpu_free=svc.state.cpu_free)
    for name in NAMES:
        ev.touch(name)
    ev.refresh()
    return ev, policy


def _share(i: int, *, threads: int, user: int, containers: int = 1, cpu: int = 1000) -> Demand:
    asks = tuple(ContainerAsk(f"c{k}", threads=threads if k == 0 else 0) for k in range(containers))
    request = ShareRequest("ns", f"p{i}", f"uid-{i}", "share", asks, run_as_user=user)
    return make_demand(request, cpu)


async def test_signatures_a_policy_cannot_tell_apart_are_scored_once_per_state(
    service: ExtenderService,
) -> None:
    ev, policy = _evaluator(service)
    first = ev.sweep(_share(1, threads=30, user=1000), NAMES)
    asked = policy.calls
    assert 0 < asked <= len({ev.state_ids()[n] for n in NAMES})
    # Another container layout: a new signature, the same shape and candidates everywhere.
    again = ev.sweep(_share(2, threads=30, user=1000, containers=2), NAMES)
    assert (again.passed, again.scores) == (first.passed, first.scores)
    assert policy.calls == asked
    # Another UID: the same candidates on the empty nodes (the others run UID 1000's shares).
    empty = NAMES[::3]
    other = ev.sweep(_share(3, threads=30, user=1001), empty)
    assert other.passed == empty
    assert policy.calls == asked
    # Another CPU size is another shape: scored anew.
    ev.sweep(_share(4, threads=30, user=1000, cpu=2000), NAMES)
    assert policy.calls > asked


async def test_shared_scores_are_what_fit_and_score_give_directly(
    service: ExtenderService,
) -> None:
    ev, _ = _evaluator(service)
    rng = random.Random(7)
    budgets = Config.default().budgets
    inner = service.state.evaluator.policy
    for i in range(60):
        if rng.random() < 0.2:
            gpus = rng.choice((1, 2))
            request = ShareRequest("ns", f"w{i}", f"uid-w{i}", "whole", whole_gpus=gpus)
            demand = make_demand(request, rng.choice((1000, 2000)))
        else:
            demand = _share(
                i,
                threads=rng.choice((10, 20, 30, 40, 100)),
                user=rng.choice((1000, 1001, 1002)),
                containers=rng.choice((1, 2)),
                cpu=rng.choice((1000, 2000)),
            )
        for name in rng.sample(NAMES, 10):
            got = ev.entry(demand, name)
            assert got is not None
            fit = fit_node(service.state.ledger.node(name), demand.request, budgets)
            # Fit results are shared by nodes in one state: compare all but the node's name.
            assert dataclasses.replace(got[0], node=name) == fit
            if not isinstance(fit, Fit):
                continue
            threads = fit.demands[0].threads if fit.demands else 0
            shape = pod_shape(demand.request, demand.cpu_milli, threads=threads)
            state = ev.node_state(name)
            assert state is not None
            score, gpu = inner.score(state, shape, fit.gpus)
            if demand.request.kind == "share":
                gpu = share_gpu(state, fit.gpus, gpu)
            assert got[1:] == (float(score), gpu), (i, name)


async def test_a_full_share_and_a_whole_gpu_of_one_shape_keep_their_own_answers(
    service: ExtenderService,
) -> None:
    """A 100 % share and one whole GPU are the same PodShape, and on an empty node the same
    candidates: the share still names its GPU, the whole GPU none."""
    ev, _ = _evaluator(service)
    empty = NAMES[0]
    whole = make_demand(ShareRequest("ns", "w", "uid-w", "whole", whole_gpus=1), 1000)
    full = _share(1, threads=100, user=1000)
    for first, second in ((whole, full), (full, whole)):
        ev, _ = _evaluator(service)
        a, b = ev.entry(first, empty), ev.entry(second, empty)
        assert a is not None and b is not None
        answers = {first.request.kind: a, second.request.kind: b}
        assert answers["whole"][2] is None
        assert answers["share"][2] is not None
