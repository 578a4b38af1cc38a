"""Leader election: one holder at a time, takeover only after expiry, 409 on a race, prompt
hand-over on release, stepping down when the Lease cannot be renewed in time (also while a call
hangs), and a release that is bounded when the API server does not answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from extender.cluster import Leadership
from extender.config import LeaderElectionSettings
from extender.kube import leader_elector
from extender.kube.api import KubeCluster
from extender.kube.lease import LeaderElector
from tests.kube.fake_apiserver import FakeApiServer, serving


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, KubeCluster]]:
    async with serving(FakeApiServer(), tmp_path) as served:
        cluster = await KubeCluster.connect(
            kubeconfig=served.kubeconfig, context=None, request_timeout_s=0.5
        )
        yield served.fake, cluster
        await cluster.close()


SLOW = LeaderElectionSettings(
    namespace="mpsched",
    lease_duration_seconds=15,
    renew_deadline_seconds=10,
    retry_period_seconds=2,
)


async def test_one_holder_and_takeover_only_after_expiry(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    clock = Clock()
    a = LeaderElector(cluster, SLOW, identity="a", clock=clock)
    b = LeaderElector(cluster, SLOW, identity="b", clock=clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    clock.now += 10
    assert await a.try_acquire_or_renew()  # renewed in time
    clock.now += 14
    assert not await b.try_acquire_or_renew()  # 14 s < 15 s since the renewal
    clock.now += 2
    assert await b.try_acquire_or_renew()  # expired: b takes over
    lease = fake.leases[("mpsched", "mpsched")]
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_acquire_or_renew()


async def test_a_race_for_an_expired_lease_has_one_winner(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    clock = Clock()
    electors = [LeaderElector(cluster, SLOW, identity=f"r{i}", clock=clock) for i in range(4)]
    assert await electors[0].try_acquire_or_renew()
    clock.now += 60
    fake.delay_s = 0.05  # let every contender read the same version before anyone writes
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors[1:]))
    assert sum(won) == 1
    holder = fake.leases[("mpsched", "mpsched")]["spec"]["holderIdentity"]
    assert holder == f"r{1 + won.index(True)}"


FAST = LeaderElectionSettings(
    namespace="mpsched",
    lease_duration_seconds=30,
    renew_deadline_seconds=0.3,
    retry_period_seconds=0.05,
)


async def until(condition: Callable[[], bool], want: bool) -> None:
    """Poll for the campaign task's effect, for at most 5 s."""
    for _ in range(500):
        if condition() is want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"is_leader() never became {want}")


async def test_release_hands_over_at_once_and_unrenewable_lease_steps_down(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    a: Leadership = leader_elector(cluster, FAST, identity="a")
    task = asyncio.get_running_loop().create_task(a.run())
    await until(a.is_leader, True)
    fake.fail_next = [503] * 1000  # the API server goes away
    await until(a.is_leader, False)  # stepped down after the renew deadline
    fake.fail_next = []
    await until(a.is_leader, True)
    task.cancel()
    await a.release()
    assert not a.is_leader()
    b = LeaderElector(cluster, FAST, identity="b")
    assert await b.try_acquire_or_renew()  # no need to wait 30 s for expiry
    assert b.is_leader()


async def test_leadership_ends_at_the_renew_deadline_even_while_a_call_hangs(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    a = LeaderElector(cluster, FAST, identity="a")
    task = asyncio.get_running_loop().create_task(a.run())
    await until(a.is_leader, True)
    fake.delay_s = 10.0  # every call hangs (until the client's 0.5 s timeout)
    started = time.monotonic()
    await until(a.is_leader, False)
    assert time.monotonic() - started < 0.3 + 0.2  # the deadline, not the call's timeout
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_release_is_bounded_when_the_api_hangs(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    a = LeaderElector(cluster, FAST, identity="a", release_timeout_s=0.2)
    assert await a.try_acquire_or_renew()
    fake.delay_s = 10.0
    started = time.monotonic()
    await a.release()  # never raises
    assert time.monotonic() - started < 0.5
    assert not a.is_leader()
    fake.delay_s = 0


async def test_a_live_lease_held_by_another_is_not_ours(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    _, cluster = env
    clock = Clock()
    a = LeaderElector(cluster, SLOW, identity="a", clock=clock)
    b = LeaderElector(cluster, SLOW, identity="b", clock=clock)
    assert await a.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    clock.now += 16  # a expired without renewing: b takes over, a no longer leads
    assert await b.try_acquire_or_renew()
    assert not a.is_leader()
    assert not await a.try_acquire_or_renew()
    assert b.is_leader()
