"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: one
replica holds the Lease and renews it every retry period; the others take it over only once it
has gone unchanged for a whole lease duration. Every write carries the resourceVersion it read,
so two replicas racing for the Lease cannot both win (the loser gets 409).

Owns `LeaderElector`, the `extender.cluster.Leadership` of a real cluster. Leadership is a fact
about time: `is_leader()` turns False once the last successful renewal is older than the renew
deadline, whatever the campaign loop is doing (a call stuck for its whole timeout included), so
this replica stops serving before any other may take the Lease over (renew deadline < lease
duration).

Expiry is judged on this replica's own clock, never against the holder's: a candidate notes
the local (monotonic) time at which it last saw the Lease's record change (holder, duration,
acquire or renew time, transitions) and holds the Lease expired once leaseDurationSeconds have
passed since then without another change. The holder's renewTime is only ever compared with
the previous renewTime, so a holder whose clock runs an hour behind (its renewTime looks
ancient) keeps the Lease while it renews, and one an hour ahead (renewTime in the future) loses
it a lease duration after it stops. The cost, as in client-go: a replica that starts while a
dead holder's Lease is still there waits one lease duration from its first read; `release()`
on shutdown makes the usual hand-over immediate. The times written into the Lease come from the
wall clock, for people and tools reading it.

Why not kubernetes_asyncio.leaderelection (read at 36.1): its calls carry no timeout, and the
renew loop checks its deadline only between calls, so a hung call keeps the leader's work
running past the renew deadline and past the lease duration, when another replica may already
hold the Lease; it has no release on shutdown, so every rolling update waits a lease duration
for a new leader; a connection error or a timeout (anything but ApiException) escapes `run()`
and ends the campaign for good, and a failed write is logged with a traceback on every retry;
it tells NotFound apart by parsing the error body as JSON (a proxy's HTML page raises); it
writes renewTime from local time labelled UTC (wrong on a host not on UTC) and measures expiry
with time.time(), which a clock step moves; leadership is a start/stop callback rather than a
predicate each request can check; and it refuses periods under 1 s. Ours is short, uses the
adapter's bounded, typed calls (`KubeCluster.call`), and is tested against the fake API server.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes_asyncio import client

from extender.cluster import AlreadyExists, ClusterError, Conflict, NotFound

log = logging.getLogger(__name__)


class LeaseSettings(Protocol):
    """What the elector reads of `extender.config.LeaderElectionSettings`."""

    @property
    def lease_name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def lease_duration_seconds(self) -> float: ...
    @property
    def renew_deadline_seconds(self) -> float: ...
    @property
    def retry_period_seconds(self) -> float: ...


class ApiCaller(Protocol):
    api_client: Any

    async def call(
        self, what: str, method: Any, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> Any: ...


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease says about its holder, as read: the part whose change shows the holder is
    alive (client-go's LeaderElectionRecord). Times stay the text the writer put there: they
    are compared for change, never with this replica's clock."""

    holder: str
    duration_s: int | None
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> LeaseRecord:
        duration = spec.get("leaseDurationSeconds")
        acquired = spec.get("acquireTime")
        renewed = spec.get("renewTime")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=duration if isinstance(duration, int) and duration > 0 else None,
            acquire_time=acquired if isinstance(acquired, str) else None,
            renew_time=renewed if isinstance(renewed, str) else None,
            transitions=int(spec.get("leaseTransitions") or 0),
        )


#: Seconds `release()` may take in all.
RELEASE_TIMEOUT_S = 2.0


class LeaderElector:
    """Campaigns for the Lease and keeps it; `is_leader()` says whether this replica may serve."""

    def __init__(
        self,
        api: ApiCaller,
        settings: LeaseSettings,
        *,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        release_timeout_s: float = RELEASE_TIMEOUT_S,
    ) -> None:
        """`clock` measures every interval (renew deadline, expiry since the last observed
        change): monotonic, so that a step of the system clock moves neither; `wall_clock` only
        dates what is written into the Lease."""
        self._api = api
        self._leases = client.CoordinationV1Api(api.api_client)
        self.settings = settings
        self.identity = identity
        self._clock = clock
        self._wall_clock = wall_clock
        self._release_timeout_s = release_timeout_s
        #: When the Lease was last written by us (`clock` time); None: not held.
        self._renewed_at: float | None = None
        self._reported = False
        #: The record last read or written, and the `clock` time at which it was first seen
        #: as it is now: the start of the holder's lease duration, as this replica sees it.
        self._observed: LeaseRecord | None = None
        self._observed_at: float | None = None

    @property
    def observed_at(self) -> float | None:
        """The `clock` time at which this replica last saw the Lease's record change (by
        anyone's write, its own included); None before the first read."""
        return self._observed_at

    def is_leader(self) -> bool:
        renewed = self._renewed_at
        leading = (
            renewed is not None and self._clock() - renewed <= self.settings.renew_deadline_seconds
        )
        if leading != self._reported:
            self._reported = leading
            log.info(
                "%s %s the lease %s/%s",
                self.identity,
                "holds" if leading else "no longer holds",
                self.settings.namespace,
                self.settings.lease_name,
            )
        return leading

    async def run(self) -> None:
        """Campaign, then renew, forever (cancel to stop; call `release` after)."""
        s = self.settings
        while True:
            started = self._clock()
            try:
                # One round may not outlast the renew deadline: past it we no longer lead, and a
                # write that lands later would renew a Lease someone else may hold by then.
                async with asyncio.timeout(s.renew_deadline_seconds):
                    held = await self.try_acquire_or_renew(now=started)
            except (ClusterError, TimeoutError) as exc:
                log.warning("lease %s/%s: %s", s.namespace, s.lease_name, exc or "timed out")
                held = False
            if not held and self._renewed_at is not None:
                log.warning("lease %s/%s not renewed this round", s.namespace, s.lease_name)
            self.is_leader()  # logs a change
            await asyncio.sleep(s.retry_period_seconds)

    async def try_acquire_or_renew(self, *, now: float | None = None) -> bool:
        """One round: True if this replica holds the Lease afterwards, renewed as of `now` (a
        `clock` time taken before the round; default: the clock's time)."""
        s = self.settings
        now = self._clock() if now is None else now
        what = f"lease {s.namespace}/{s.lease_name}"
        try:
            lease = await self._api.call(
                what, self._leases.read_namespaced_lease, s.lease_name, s.namespace
            )
        except NotFound:
            body = self._lease_body(None, transitions=0, acquired=None)
            try:
                await self._api.call(what, self._leases.create_namespaced_lease, s.namespace, body)
            except AlreadyExists:
                return False  # another replica created it first
            self._observe(LeaseRecord.of(body["spec"]))
            self._renewed_at = now
            return True
        current = LeaseRecord.of(lease.get("spec") or {})
        # Seen after the read returned, so never before the write it shows: the holder's own
        # renew deadline, counted from before that write, ends before this lease duration does.
        changed_at = self._observe(current)
        if current.holder and current.holder != self.identity:
            duration = current.duration_s or s.lease_duration_seconds
            if now < changed_at + duration:
                self._renewed_at = None  # someone else holds a live lease: we do not lead
                return False
        if current.holder == self.identity:
            transitions, acquired = current.transitions, current.acquire_time
        else:
            transitions, acquired = current.transitions + 1, None
        body = self._lease_body(lease, transitions=transitions, acquired=acquired)
        try:
            await self._api.call(
                what, self._leases.replace_namespaced_lease, s.lease_name, s.namespace, body
            )
        except Conflict:
            return False  # the Lease changed since we read it: someone else wrote first
        self._observe(LeaseRecord.of(body["spec"]))
        self._renewed_at = now
        return True

    def _observe(self, record: LeaseRecord) -> float:
        """Note `record` as read or written; returns the `clock` time it was first seen."""
        if record == self._observed and self._observed_at is not None:
            return self._observed_at
        if self._observed is None or record.holder != self._observed.holder:
            log.info(
                "lease %s/%s: held by %s",
                self.settings.namespace,
                self.settings.lease_name,
                record.holder or "nobody",
            )
        self._observed = record
        self._observed_at = at = self._clock()
        return at

    def _lease_body(
        self, current: Mapping[str, Any] | None, *, transitions: int, acquired: str | None
    ) -> dict[str, Any]:
        s = self.settings
        stamp = _micro_time(self._wall_clock())
        meta: dict[str, Any] = {"name": s.lease_name, "namespace": s.namespace}
        if current is not None:
            rv = (current.get("metadata") or {}).get("resourceVersion")
            if rv:
                meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                # Whole seconds in the API; rounded up, so that no reader waits less than we
                # mean.
                "leaseDurationSeconds": max(1, math.ceil(s.lease_duration_seconds)),
                "acquireTime": acquired or stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions,
            },
        }

    async def release(self) -> None:
        """Give the Lease up on shutdown so that another replica takes over at once (an empty
        holder is free to take, as in client-go's ReleaseOnCancel). Best effort, within
        `release_timeout_s` in all; never raises."""
        if self._renewed_at is None:
            return
        self._renewed_at = None  # serve nothing more, whether or not the write below lands
        self.is_leader()
        s = self.settings
        what = f"lease {s.namespace}/{s.lease_name}"
        try:
            async with asyncio.timeout(self._release_timeout_s):
                lease = await self._api.call(
                    what, self._leases.read_namespaced_lease, s.lease_name, s.namespace
                )
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") == self.identity:
                    stamp = _micro_time(self._wall_clock())
                    body = dict(lease)
                    body["spec"] = {
                        **spec,
                        "holderIdentity": "",
                        # What client-go writes: a reader that still judged by renewTime
                        # would take over within a second too.
                        "leaseDurationSeconds": 1,
                        "acquireTime": stamp,
                        "renewTime": stamp,
                    }
                    await self._api.call(
                        what, self._leases.replace_namespaced_lease, s.lease_name, s.namespace, body
                    )
        except (ClusterError, TimeoutError) as exc:
            log.warning("could not release %s: %s", what, exc or "timed out")
