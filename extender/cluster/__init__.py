"""The service's one door to the cluster (DESIGN §9): read nodes and pods, watch their changes,
bind a pod with annotations, record an event.

Owns the `Cluster` protocol, the event type and the typed errors every implementation raises;
the decision code cannot tell the implementations apart. Two exist: the embedded in-memory
cluster (`extender.cluster.embedded`, for the demo, benchmarks, tests and snapshot replays) and
the Kubernetes API adapter (`extender.kube`, the only importer of kubernetes_asyncio).

Objects cross this interface as plain JSON-shaped mappings in the Kubernetes API's own form
(`metadata.name`, `spec.nodeName`, ...), exactly what `kubectl get -o json` shows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ObjectKind = Literal["Node", "Pod"]
JsonObject = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One change seen by a watch: the object as it is after the change (before, for DELETED)."""

    type: EventType
    kind: ObjectKind
    obj: JsonObject


class ClusterError(Exception):
    """An API call failed. `status` is the HTTP code the API server answered (0: no answer) and
    `reason` its machine-readable reason ("NotFound", "Conflict", ...)."""

    status: int = 0
    reason: str = "InternalError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ClusterError):
    """404: the object does not exist (a pod deleted before its bind)."""

    status = 404
    reason = "NotFound"


class Conflict(ClusterError):
    """409: the write lost against the object's current state. `assigned_node` is set when the
    pod is already bound (the one case a binder may treat as success, if it is the same node)."""

    status = 409
    reason = "Conflict"

    def __init__(self, message: str, *, assigned_node: str | None = None) -> None:
        super().__init__(message)
        self.assigned_node = assigned_node


class Unavailable(ClusterError):
    """No answer: connection refused, timeout, TLS failure. Retrying later may succeed."""

    status = 0
    reason = "Unavailable"


class EventStream(Protocol):
    """The changes after the moment `Cluster.watch()` was called, in order."""

    def __aiter__(self) -> AsyncIterator[ClusterEvent]: ...

    def close(self) -> None: ...


class Cluster(Protocol):
    """What the service needs from a cluster. Implementations must be safe to call concurrently
    from one event loop; `bind` in particular is called for many pods at once."""

    #: One line naming where the objects come from (a file path, a kubeconfig context).
    description: str

    def watch(self) -> EventStream:
        """Start delivering changes. Events for every write that completes after this call are
        delivered, so a caller that watches first and lists second misses nothing."""
        ...

    def list_nodes(self) -> AsyncIterator[JsonObject]:
        """Every Node, one at a time (implementations page through large clusters)."""
        ...

    def list_pods(self) -> AsyncIterator[JsonObject]:
        """Every Pod in every namespace, one at a time."""
        ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        """The pod as the API server has it now, or None if it does not exist."""
        ...

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Create the pod's Binding with `annotations` in its metadata, with a UID precondition:
        the API server sets `spec.nodeName` and merges the annotations in one write. Raises
        NotFound, Conflict (already assigned, UID mismatch, being deleted, gated) or another
        ClusterError."""
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

    async def close(self) -> None:
        """Release connections; the watch streams end."""
        ...


__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterEvent",
    "Conflict",
    "EventStream",
    "EventType",
    "JsonObject",
    "NotFound",
    "ObjectKind",
    "Unavailable",
]
