"""The service's one door to the cluster (docs/design.md, Architecture): follow the nodes and pods
(list, then every change), read a pod or node, bind a pod with annotations, record an event; beside
it, who may serve (`Leadership`); and what the node agent needs (`NodeAgentCluster`: its own Node,
one merge patch of it, the pods on it, events about it).

Owns the `Cluster`, `NodeAgentCluster` and `Leadership` protocols, the follow stream's item
types, and the typed errors every implementation raises, built from the API server's own
`v1.Status` answer by one function (`error_from_status`); the decision code cannot tell the
implementations apart. Two exist: the embedded in-memory cluster (`extender.cluster.embedded`,
for the demo, benchmarks, tests and snapshot replays) and the Kubernetes API adapter
(`extender.kube`, the only importer of kubernetes_asyncio).

Objects cross this interface as plain JSON-shaped mappings in the Kubernetes API's own form
(`metadata.name`, `spec.nodeName`, ...), exactly what `kubectl get -o json` shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, Protocol

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


# -- errors ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusCause:
    """One entry of a Status's `details.causes` (a field error of a 422, say)."""

    reason: str = ""
    message: str = ""
    field: str = ""


@dataclass(frozen=True, slots=True)
class StatusDetails:
    """A Status's `details`: which object the answer is about, and why in parts."""

    name: str = ""
    kind: str = ""
    group: str = ""
    causes: tuple[StatusCause, ...] = ()
    #: `details.retryAfterSeconds` (429, and some 5xx): when the server asks to be tried again.
    retry_after_s: float | None = None


NO_DETAILS: Final = StatusDetails()


class ClusterError(Exception):
    """An API call failed. `code` is the HTTP status the API server answered (0: no answer),
    `reason` its machine-readable reason ("NotFound", "Conflict", ...; "" where it gave none),
    `message` its human-readable message and `details` the object and causes it named. Build one
    from an answer with `error_from_status`; subclasses say what a caller may conclude."""

    default_code: ClassVar[int] = 0
    default_reason: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        what: str = "",
        code: int | None = None,
        reason: str | None = None,
        details: StatusDetails = NO_DETAILS,
    ) -> None:
        super().__init__(f"{what}: {message}" if what else message)
        self.message = message
        #: The call that failed, in words ("bind ns/p to gpu-1").
        self.what = what
        self.code = self.default_code if code is None else code
        self.reason = self.default_reason if reason is None else reason
        self.details = details


class BadRequest(ClusterError):
    """400: the request itself is malformed (a bug on our side, not a state of the cluster)."""

    default_code, default_reason = 400, "BadRequest"


class Unauthorized(ClusterError):
    """401: the credentials are not accepted (expired token, wrong certificate)."""

    default_code, default_reason = 401, "Unauthorized"


class Forbidden(ClusterError):
    """403: authenticated, but RBAC does not allow this verb on this resource."""

    default_code, default_reason = 403, "Forbidden"


class NotFound(ClusterError):
    """404: the object does not exist (a pod deleted before its bind)."""

    default_code, default_reason = 404, "NotFound"


class Conflict(ClusterError):
    """409: the write lost against the object's current state (a bind of a pod already assigned,
    being deleted, gated, or recreated under another UID; a stale resourceVersion). What state
    won is not in the answer's text but in the object: read it back to find out."""

    default_code, default_reason = 409, "Conflict"


class AlreadyExists(Conflict):
    """409 AlreadyExists: a create lost because the object exists already."""

    default_reason = "AlreadyExists"


class Gone(ClusterError):
    """410 (Expired / Gone): the resourceVersion asked for is older than the server keeps;
    relist."""

    default_code, default_reason = 410, "Expired"


class Invalid(ClusterError):
    """422: the object fails validation; `details.causes` names the fields."""

    default_code, default_reason = 422, "Invalid"


class Unavailable(ClusterError):
    """The server did not decide: no answer (connection refused or cut, timeout), overloaded
    (429) or failing (5xx). Retrying later may succeed. For a write the outcome is *in doubt*:
    it may have been applied; read the object back once the server answers again."""

    default_code, default_reason = 0, "ServiceUnavailable"


class NoAnswer(Unavailable):
    """No HTTP answer at all: refused, cut, or not answered within the call's timeout."""

    default_code, default_reason = 0, ""


class TooManyRequests(Unavailable):
    """429: the server sheds load; `retry_after_s` says when to come back, where it said."""

    default_code, default_reason = 429, "TooManyRequests"

    @property
    def retry_after_s(self) -> float | None:
        return self.details.retry_after_s


#: Status reasons (k8s.io/apimachinery metav1.StatusReason) → the class they mean.
_BY_REASON: Final[Mapping[str, type[ClusterError]]] = {
    "BadRequest": BadRequest,
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "Conflict": Conflict,
    "AlreadyExists": AlreadyExists,
    "Gone": Gone,
    "Expired": Gone,
    "Invalid": Invalid,
    "TooManyRequests": TooManyRequests,
    "ServiceUnavailable": Unavailable,
    "ServerTimeout": Unavailable,
    "Timeout": Unavailable,
    "InternalError": Unavailable,
}

#: HTTP codes → class, where the Status gave no reason we know (client-go's fallback too).
_BY_CODE: Final[Mapping[int, type[ClusterError]]] = {
    0: NoAnswer,
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A v1.Status failure body exactly as the API server writes one (the embedded cluster and
    the tests' fake API server answer with these; `error_from_status` reads them)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def error_from_status(code: int, status: Mapping[str, Any] | None, *, what: str) -> ClusterError:
    """The typed error for an answer: HTTP `code` (0: none) and its body when it is a v1.Status
    (anything else, e.g. a proxy's HTML page, counts as no Status). The class follows the
    Status's `reason`, falling back to `code` for a reason it does not know, as client-go's
    `errors.IsNotFound` and friends do."""
    body: Mapping[str, Any] = status if isinstance(status, Mapping) else {}
    reason = body.get("reason")
    reason = reason if isinstance(reason, str) else ""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code)
    if cls is None:
        cls = Unavailable if code >= 500 else ClusterError
    message = body.get("message")
    if not isinstance(message, str) or not message:
        message = f"HTTP {code}" if code else "no answer"
    return cls(message, what=what, code=code, reason=reason, details=_details(body.get("details")))


def _details(raw: object) -> StatusDetails:
    if not isinstance(raw, Mapping):
        return NO_DETAILS

    def text(m: Mapping[str, Any], key: str) -> str:
        value = m.get(key)
        return value if isinstance(value, str) else ""

    causes = tuple(
        StatusCause(reason=text(c, "reason"), message=text(c, "message"), field=text(c, "field"))
        for c in raw.get("causes") or ()
        if isinstance(c, Mapping)
    )
    retry = raw.get("retryAfterSeconds")
    return StatusDetails(
        name=text(raw, "name"),
        kind=text(raw, "kind"),
        group=text(raw, "group"),
        causes=causes,
        retry_after_s=float(retry) if isinstance(retry, int | float) and retry > 0 else None,
    )


# -- the interfaces ----------------------------------------------------------------------------


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


class Cluster(Protocol):
    """What the service needs from a cluster. Implementations must be safe to call concurrently
    from one event loop; `bind` in particular is called for many pods at once."""

    #: One line naming where the objects come from (a file path, a kubeconfig context).
    description: str

    def follow(self) -> EventStream:
        """Start following the cluster (client-go's ListAndWatch); returns at once."""
        ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        """The pod as the API server has it now, or None if it does not exist."""
        ...

    async def get_node(self, name: str) -> JsonObject | None:
        """The node as the API server has it now, or None if it does not exist."""
        ...

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Create the pod's Binding with `annotations` in its metadata, with a UID precondition:
        the API server sets `spec.nodeName` and merges the annotations in one write. Raises
        NotFound, Conflict (already assigned, UID mismatch, being deleted, gated), Unavailable
        (in doubt: it may have been applied) or another ClusterError."""
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
        """Release connections (bounded in time); every follow stream ends."""
        ...


class NodeAgentCluster(Protocol):
    """What the node agent needs from a cluster (docs/design.md, Annotations): read its own Node,
    write what it publishes there in one merge patch, list the pods on the node, and record Events.
    The Kubernetes API adapter and the embedded cluster implement it, with the same typed errors."""

    #: One line naming where the objects come from (a file path, a kubeconfig context).
    description: str

    async def get_node(self, name: str) -> JsonObject | None:
        """The node as the API server has it now, or None if it does not exist."""
        ...

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


__all__ = [
    "NO_DETAILS",
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
    "StatusDetails",
    "Synced",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "error_from_status",
    "status_body",
]
