"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: one
replica holds the Lease and renews it every retry period; the others take it over only once it
has gone unrenewed for a whole lease duration. Every write carries the resourceVersion it read,
so two replicas racing for the Lease cannot both win (the loser gets 409).

Owns `LeaderElector`, the `extender.cluster.Leadership` of a real cluster. Leadership is a fact
about time: `is_leader()` turns False once the last successful renewal is older than the renew
deadline, whatever the campaign loop is doing (a call stuck for its whole timeout included), so
this replica stops serving before any other may take the Lease over (renew deadline < lease
duration)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
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


def _parse_time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


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
        clock: Callable[[], float] = time.time,
        release_timeout_s: float = RELEASE_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._leases = client.CoordinationV1Api(api.api_client)
        self.settings = settings
        self.identity = identity
        self._clock = clock
        self._release_timeout_s = release_timeout_s
        #: When the Lease was last written by us (the clock's time); None: not held.
        self._renewed_at: float | None = None
        self._reported = False

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
        """One round: True if this replica holds the Lease afterwards, renewed at `now` (default:
        the clock's time)."""
        s = self.settings
        now = self._clock() if now is None else now
        what = f"lease {s.namespace}/{s.lease_name}"
        try:
            lease = await self._api.call(
                what, self._leases.read_namespaced_lease, s.lease_name, s.namespace
            )
        except NotFound:
            body = self._lease_body(None, now, transitions=0, acquired=now)
            try:
                await self._api.call(what, self._leases.create_namespaced_lease, s.namespace, body)
            except AlreadyExists:
                return False  # another replica created it first
            self._renewed_at = now
            return True
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse_time(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_seconds)
        if holder and holder != self.identity and now < renewed + duration:
            self._renewed_at = None  # someone else holds a live lease: we do not lead
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquired = _parse_time(spec.get("acquireTime")) or now
        else:
            transitions += 1
            acquired = now
        body = self._lease_body(lease, now, transitions=transitions, acquired=acquired)
        try:
            await self._api.call(
                what, self._leases.replace_namespaced_lease, s.lease_name, s.namespace, body
            )
        except Conflict:
            return False  # the Lease changed since we read it: someone else wrote first
        self._renewed_at = now  # the Lease says renewTime=now
        return True

    def _lease_body(
        self, current: Mapping[str, Any] | None, now: float, *, transitions: int, acquired: float
    ) -> dict[str, Any]:
        s = self.settings
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
                "leaseDurationSeconds": round(s.lease_duration_seconds),
                "acquireTime": _micro_time(acquired),
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    async def release(self) -> None:
        """Give the Lease up on shutdown so that another replica takes over at once. Best
        effort, within `release_timeout_s` in all; never raises."""
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
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    body = dict(lease)
                    body["spec"] = {
                        **lease["spec"],
                        "holderIdentity": "",
                        "renewTime": _micro_time(0.0),
                    }
                    await self._api.call(
                        what, self._leases.replace_namespaced_lease, s.lease_name, s.namespace, body
                    )
        except (ClusterError, TimeoutError) as exc:
            log.warning("could not release %s: %s", what, exc or "timed out")
