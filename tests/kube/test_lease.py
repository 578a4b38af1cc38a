"""Leader election: one holder at a time, takeover only a lease duration after the candidate
last saw the record change (by its own clock: a holder an hour behind or ahead changes
nothing), 409 on a race, prompt hand-over on release, stepping down when the Lease cannot be
renewed in time (also while a call hangs), and a release that is bounded when the API server
does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
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


async def test_one_holder_and_takeover_only_a_lease_duration_after_the_last_seen_change(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    clock = Clock()
    a = LeaderElector(cluster, SLOW, identity="a", clock=clock)
    b = LeaderElector(cluster, SLOW, identity="b", clock=clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b sees a's record first now
    clock.now += 10
    assert await a.try_acquire_or_renew()  # renewed in time
    clock.now += 4
    assert not await b.try_acquire_or_renew()  # b sees the renewal now, 14 s in
    clock.now += 12
    # a's renewTime is 16 s old, but b has seen it for 12 s only: the lease is still a's.
    assert not await b.try_acquire_or_renew()
    clock.now += 2.9
    assert not await b.try_acquire_or_renew()  # 14.9 s since b saw the change
    clock.now += 0.1
    assert await b.try_acquire_or_renew()  # 15 s: expired, b takes over
    lease = fake.leases[("mpsched", "mpsched")]
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_acquire_or_renew()


async def test_a_replica_that_starts_waits_a_lease_duration_from_its_first_read(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    _, cluster = env
    clock = Clock()
    a = LeaderElector(cluster, SLOW, identity="a", clock=clock)
    assert await a.try_acquire_or_renew()
    clock.now += 60  # a died long ago, but b has never seen the Lease
    b = LeaderElector(cluster, SLOW, identity="b", clock=clock)
    assert not await b.try_acquire_or_renew()
    clock.now += 15
    assert await b.try_acquire_or_renew()


async def test_a_race_for_an_expired_lease_has_one_winner(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    clock = Clock()
    electors = [LeaderElector(cluster, SLOW, identity=f"r{i}", clock=clock) for i in range(4)]
    assert await electors[0].try_acquire_or_renew()
    for e in electors[1:]:
        assert not await e.try_acquire_or_renew()
    clock.now += 60
    fake.delay_s = 0.05  # let every contender read the same version before anyone writes
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors[1:]))
    assert sum(won) == 1
    holder = fake.leases[("mpsched", "mpsched")]["spec"]["holderIdentity"]
    assert holder == f"r{1 + won.index(True)}"


HOUR = 3600.0


def renew_time(fake: FakeApiServer) -> float:
    text = fake.leases[("mpsched", "mpsched")]["spec"]["renewTime"]
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize("skew_s", [-HOUR, HOUR], ids=["holder-1h-behind", "holder-1h-ahead"])
async def test_a_skewed_holder_keeps_the_lease_while_it_renews_and_loses_it_after(
    env: tuple[FakeApiServer, KubeCluster], skew_s: float
) -> None:
    """Expiry is judged by the candidate's clock since it saw the record change: the holder's
    renewTime, an hour off either way, decides nothing."""
    fake, cluster = env
    clock = Clock()  # both measure intervals alike (monotonic clocks agree on a second)
    a = LeaderElector(
        cluster, SLOW, identity="a", clock=clock, wall_clock=lambda: time.time() + skew_s
    )
    b = LeaderElector(cluster, SLOW, identity="b", clock=clock)
    assert await a.try_acquire_or_renew()
    assert abs(renew_time(fake) - (time.time() + skew_s)) < 60  # the Lease shows the skew
    for _ in range(3 * 15 // 2):  # three lease durations of renewals every retry period
        assert not await b.try_acquire_or_renew()
        assert not b.is_leader()
        clock.now += 2
        assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b saw a's last renewal now
    seen = b.observed_at
    assert seen == clock.now
    clock.now += 14.9  # a has stopped renewing
    assert not await b.try_acquire_or_renew()
    clock.now += 0.1
    assert await b.try_acquire_or_renew()  # a lease duration after the last change it saw
    assert b.is_leader()
    assert fake.leases[("mpsched", "mpsched")]["spec"]["holderIdentity"] == "b"


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


def start(elector: LeaderElector) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(elector.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


#: Short enough to watch a takeover happen: the Lease says 1 s (whole seconds in the API).
BRIEF = LeaderElectionSettings(
    namespace="mpsched",
    lease_duration_seconds=1,
    renew_deadline_seconds=0.3,
    retry_period_seconds=0.05,
)


@pytest.mark.parametrize("skew_s", [-HOUR, HOUR], ids=["holder-1h-behind", "holder-1h-ahead"])
async def test_a_holder_that_stops_renewing_is_taken_over_within_duration_plus_retry(
    env: tuple[FakeApiServer, KubeCluster], skew_s: float
) -> None:
    """Both campaigns run: the candidate never leads while the (skewed) holder renews, and
    leads no sooner than a lease duration and no later than a lease duration plus a retry
    period after the last change it saw, once the holder stops (killed: no release)."""
    fake, cluster = env
    a = LeaderElector(cluster, BRIEF, identity="a", wall_clock=lambda: time.time() + skew_s)
    b = LeaderElector(cluster, BRIEF, identity="b")
    task_a = start(a)
    await until(a.is_leader, True)
    task_b = start(b)
    watched_until = time.monotonic() + 1.5 * BRIEF.lease_duration_seconds
    while time.monotonic() < watched_until:
        assert a.is_leader() and not b.is_leader()
        await asyncio.sleep(0.01)
    await stop(task_a)
    last_seen = b.observed_at
    give_up = time.monotonic() + 5.0
    while not b.is_leader():
        assert time.monotonic() < give_up, "b never took over"
        last_seen = b.observed_at
        await asyncio.sleep(0.005)
    led_at = time.monotonic()
    await stop(task_b)
    assert last_seen is not None
    taken_after = led_at - last_seen
    # Slack for the takeover round's two calls and this loop's polling.
    d, retry = BRIEF.lease_duration_seconds, BRIEF.retry_period_seconds
    assert d <= taken_after <= d + retry + 0.2, taken_after
    assert fake.leases[("mpsched", "mpsched")]["spec"]["holderIdentity"] == "b"


async def test_release_on_shutdown_hands_over_at_once(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    a: Leadership = leader_elector(cluster, FAST, identity="a")
    b = LeaderElector(cluster, FAST, identity="b")
    task_a = asyncio.get_running_loop().create_task(a.run())
    await until(a.is_leader, True)
    task_b = start(b)
    await asyncio.sleep(0.2)  # b has read a's lease a few times: it waits for its expiry
    assert not b.is_leader()
    await stop(task_a)
    await a.release()
    assert not a.is_leader()
    released = time.monotonic()
    await until(b.is_leader, True)  # within a retry period or so, not the lease's 30 s
    assert time.monotonic() - released < 1.0
    await stop(task_b)
    spec = fake.leases[("mpsched", "mpsched")]["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 30


async def test_a_lease_the_api_will_not_renew_is_given_up_at_the_renew_deadline(
    env: tuple[FakeApiServer, KubeCluster],
) -> None:
    fake, cluster = env
    a = LeaderElector(cluster, FAST, identity="a")
    task = start(a)
    await until(a.is_leader, True)
    fake.fail_next = [503] * 1000  # the API server goes away
    failing_since = time.monotonic()
    await until(a.is_leader, False)  # stepped down after the renew deadline
    assert time.monotonic() - failing_since < FAST.renew_deadline_seconds + 0.2
    fake.fail_next = []
    await until(a.is_leader, True)  # nobody took it meanwhile: a renews its own lease
    await stop(task)


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
    assert not await b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    clock.now += 16  # a expired without renewing: b takes over, a no longer leads
    assert await b.try_acquire_or_renew()
    assert not a.is_leader()
    assert not await a.try_acquire_or_renew()
    assert b.is_leader()
