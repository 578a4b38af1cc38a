"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: one
replica holds the Lease and renews it every retry period; the others take it over only once it
has gone unrenewed for a whole lease duration. Every write carries the resourceVersion it read,
so two replicas racing for the Lease cannot both win (the loser gets 409)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes_asyncio import client

from extender.cluster import ClusterError, Conflict, NotFound

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

    async def call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any: ...


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


class LeaderElector:
    """Campaigns for the Lease and keeps it; `is_leader` says whether this replica may serve."""

    def __init__(
        self,
        api: ApiCaller,
        settings: LeaseSettings,
        *,
        identity: str,
        on_change: Callable[[bool], None] = lambda leading: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._leases = client.CoordinationV1Api(api.api_client)
        self.settings = settings
        self.identity = identity
        self._on_change = on_change
        self._clock = clock
        self.is_leader = False
        self._last_renew = 0.0

    def _set_leader(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info(
                "%s %s the lease %s/%s",
                self.identity,
                "acquired" if leading else "lost",
                self.settings.namespace,
                self.settings.lease_name,
            )
            self._on_change(leading)

    async def run(self) -> None:
        """Campaign, then renew, forever (cancel to stop; call `release` after)."""
        s = self.settings
        while True:
            try:
                held = await self.try_acquire_or_renew()
            except ClusterError as exc:
                log.warning("lease %s/%s: %s", s.namespace, s.lease_name, exc)
                held = False
            now = self._clock()
            if held:
                self._last_renew = now
                self._set_leader(True)
            elif self.is_leader and now - self._last_renew > s.renew_deadline_seconds:
                # Could not renew in time: step down before anyone else may take over, so two
                # replicas never serve at once (renew deadline < lease duration).
                self._set_leader(False)
            await asyncio.sleep(s.retry_period_seconds)

    async def try_acquire_or_renew(self) -> bool:
        """One round: True if this replica holds the Lease afterwards."""
        s = self.settings
        now = self._clock()
        what = f"lease {s.namespace}/{s.lease_name}"
        try:
            lease = await self._api.call(
                what, self._leases.read_namespaced_lease, s.lease_name, s.namespace
            )
        except NotFound:
            body = self._lease_body(None, now, transitions=0, acquired=now)
            try:
                await self._api.call(what, self._leases.create_namespaced_lease, s.namespace, body)
            except Conflict:
                return False  # another replica created it first
            return True
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse_time(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_seconds)
        if holder and holder != self.identity and now < renewed + duration:
            return False  # someone else holds a live lease
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
        """Give the Lease up on shutdown so that another replica takes over at once."""
        if not self.is_leader:
            return
        s = self.settings
        what = f"lease {s.namespace}/{s.lease_name}"
        try:
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
        except ClusterError as exc:
            log.warning("could not release %s: %s", what, exc)
        self._set_leader(False)
