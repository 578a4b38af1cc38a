"""Leader election: one holder at a time, takeover only after expiry, 409 on a race, prompt
hand-over on release, and stepping down when the Lease cannot be renewed in time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from extender.config import LeaderElectionSettings
from extender.kube.api import KubeCluster
from extender.kube.lease import LeaderElector
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_kube_cluster import kubeconfig


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, KubeCluster]]:
    fake = FakeApiServer()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    cluster = await KubeCluster.connect(kubeconfig=kubeconfig(tmp_path, url), context=None)
    yield fake, cluster
    await cluster.close()
    await server.close()


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


async def test_release_hands_over_at_once_and_unrenewable_lease_steps_down(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    fast = LeaderElectionSettings(
        namespace="mpsched",
        lease_duration_seconds=30,
        renew_deadline_seconds=0.3,
        retry_period_seconds=0.05,
    )
    changes: asyncio.Queue[bool] = asyncio.Queue()
    a = LeaderElector(cluster, fast, identity="a", on_change=changes.put_nowait)
    task = asyncio.get_running_loop().create_task(a.run())
    async with asyncio.timeout(5):
        assert await changes.get() is True
        fake.fail_next = [503] * 1000  # the API server goes away
        assert await changes.get() is False  # stepped down after the renew deadline
        assert not a.is_leader
        fake.fail_next = []
        assert await changes.get() is True
    task.cancel()
    await a.release()
    assert not a.is_leader
    b = LeaderElector(cluster, fast, identity="b")
    assert await b.try_acquire_or_renew()  # no need to wait 30 s for expiry
