"""The typed errors every cluster implementation raises, and the one function that builds them.

Owns `ClusterError` and its subclasses (one per answer the callers act on: NotFound, Conflict,
Unavailable, ...), the `v1.Status` details they carry, and `error_from_status`, which reads the
API server's own Status answer (its `reason` first, else the HTTP code) into the typed error, so
no caller ever matches an error by its message. `status_body` writes such an answer, for the
embedded cluster and the fakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final


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
