"""The service's one door to the cluster (docs/design.md, Architecture): follow the nodes and pods
(list, then every change), read a pod or node, bind a pod with annotations, record an event; beside
it, who may serve (`Leadership`); and what the node agent needs (`NodeAgentCluster`: its own Node,
one merge patch of it, the pods on it, events about it).

The protocols and the follow stream's item types live in `extender.cluster.interface`; the
typed errors every implementation raises, built from the API server's own `v1.Status` answer by
one function (`error_from_status`), in `extender.cluster.errors`. This package re-exports both,
and nothing else. The decision code cannot tell the implementations apart; two exist: the
embedded in-memory cluster (`extender.cluster.embedded`, for the demo, benchmarks, tests and
snapshot replays) and the Kubernetes API adapter (`extender.kube`, the only importer of
kubernetes_asyncio).
"""

from __future__ import annotations

from extender.cluster.errors import (
    AlreadyExists,
    BadRequest,
    ClusterError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NoAnswer,
    NotFound,
    StatusCause,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    error_from_status,
    status_body,
)
from extender.cluster.interface import (
    AlwaysLeader,
    Cluster,
    ClusterEvent,
    EventStream,
    EventType,
    FollowItem,
    JsonObject,
    Leadership,
    NodeAgentCluster,
    ObjectKind,
    Synced,
)

__all__ = [
    "AlreadyExists",
    "AlwaysLeader",
    "BadRequest",
    "Cluster",
    "ClusterError",
    "ClusterEvent",
    "Conflict",
    "EventStream",
    "EventType",
    "FollowItem",
    "Forbidden",
    "Gone",
    "Invalid",
    "JsonObject",
    "Leadership",
    "NoAnswer",
    "NodeAgentCluster",
    "NotFound",
    "ObjectKind",
    "StatusCause",
    "Synced",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "error_from_status",
    "status_body",
]
