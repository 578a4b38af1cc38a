"""The service's one door to the cluster: what it follows, reads and writes, and who may serve.

Owns the `Cluster`, `NodeAgentCluster` and `Leadership` protocols and the follow stream's item
types (`ClusterEvent`, `Synced`). Objects cross this interface as plain JSON-shaped mappings in
the Kubernetes API's own form (`metadata.name`, `spec.nodeName`, ...), exactly what
`kubectl get -o json` shows; failures are the typed errors of `extender.cluster.errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectKind = Literal["Node", "Pod"]
JsonObject = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One object as seen: listed (ADDED, before `Synced`) or changed later; the object as it
    is after the change (as it last was, for DELETED)."""

    type: EventType
    kind: ObjectKind
    obj: JsonObject


@dataclass(frozen=True, slots=True)
class Synced:
    """Every object that existed when following began has been delivered (informer HasSynced)."""


FollowItem = ClusterEvent | Synced


class EventStream(Protocol):
    """What `Cluster.follow()` returns: every existing Node, then every Pod, as ADDED events;
    then one `Synced`; then every later change in order. It never raises into the consumer: an
    unreachable API is retried (with capped backoff) behind it. Iterating again continues where
    the last iteration stopped; `close()` ends it."""

    #: Times the stream had to start over (a watch reconnected after a failure, a relist, a
    #: failed list retried): its health, for metrics.
    restarts: int

    def __aiter__(self) -> AsyncIterator[FollowItem]: ...

    def close(self) -> None: ...


class _ClusterDoor(Protocol):
    """What the service and the node agent alike read and write in a cluster."""

    #: One line naming where the objects come from (a file path, a kubeconfig context).
    description: str

    async def get_node(self, name: str) -> JsonObject | None:
        """The node as the API server has it now, or None if it does not exist."""
        ...

    async def record_event(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        """Record a core/v1 Event about the pod (best effort: never raises for a lost event)."""
        ...


class Cluster(_ClusterDoor, Protocol):
    """What the service needs from a cluster. Implementations must be safe to call concurrently
    from one event loop; `bind` in particular is called for many pods at once."""

    def follow(self) -> EventStream:
        """Start following the cluster (client-go's ListAndWatch); returns at once."""
        ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        """The pod as the API server has it now, or None if it does not exist."""
        ...

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Create the pod's Binding with `annotations` in its metadata, with a UID precondition:
        the API server sets `spec.nodeName` and merges the annotations in one write. Raises
        NotFound, Conflict (already assigned, UID mismatch, being deleted, gated), Unavailable
        (in doubt: it may have been applied) or another ClusterError."""
        ...

    async def close(self) -> None:
        """Release connections (bounded in time); every follow stream ends."""
        ...


class NodeAgentCluster(_ClusterDoor, Protocol):
    """What the node agent needs from a cluster (docs/design.md, Annotations): read its own Node,
    write what it publishes there in one merge patch, list the pods on the node, and record Events.
    The Kubernetes API adapter and the embedded cluster implement it, with the same typed errors."""

    async def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> JsonObject:
        """Apply `patch`, a JSON merge patch (RFC 7386, `application/merge-patch+json`: objects
        merge key by key, a null value deletes its key), to the Node in one write; returns the
        Node as written. A `metadata.resourceVersion` in the patch is a precondition (a stale
        one is Conflict). Raises NotFound, Conflict, Unavailable / NoAnswer (in doubt: it may
        have been applied) or another ClusterError, within the request timeout."""
        ...

    async def list_node_pods(self, node: str) -> list[JsonObject]:
        """Every pod bound to `node` (`fieldSelector=spec.nodeName=<node>`), in every
        namespace, whatever its phase."""
        ...

    async def record_node_event(
        self, *, node: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record a core/v1 Event about the Node, in namespace "default" where the kubelet
        records its own node events (best effort: never raises for a lost event)."""
        ...

    async def close(self) -> None:
        """Release connections (bounded in time)."""
        ...


class Leadership(Protocol):
    """Whether this replica may serve (docs/design.md, Architecture: only the leader does)."""

    def is_leader(self) -> bool: ...

    async def run(self) -> None:
        """Campaign for leadership and keep it, until cancelled."""
        ...

    async def release(self) -> None:
        """Hand leadership over on shutdown: bounded in time, best effort, never raises."""
        ...


class AlwaysLeader:
    """The embedded cluster's leadership: one replica by construction."""

    def is_leader(self) -> bool:
        return True

    async def run(self) -> None:
        # Nothing to campaign for: wait to be cancelled, like any campaign.
        await asyncio.get_running_loop().create_future()

    async def release(self) -> None:
        return None
