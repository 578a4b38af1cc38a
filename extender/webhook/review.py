"""AdmissionReview `admission.k8s.io/v1`: the request envelope in, the response envelope out.

Owns the envelope and nothing about pods. `parse_review` turns a decoded body into an
`AdmissionRequest` or raises `ReviewError` naming the field at fault (the handler answers it
with 400: with no trustworthy uid there is nothing a response could be matched to).
`review_response` builds the answer the API server expects: `uid` echoed, `allowed`, a denial's
`status`, an allowed request's `warnings`, and a JSONPatch as base64 of its JSON text.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
#: HTTP-style codes a denial carries in `status.code` (kubectl prints them with the message).
FORBIDDEN: Final = 403
BAD_REQUEST: Final = 400


class ReviewError(Exception):
    """The body is not an AdmissionReview v1 request this webhook can answer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """The parts of `request` the decisions read. `namespace` is the request's: on CREATE the
    object itself often carries none (and a generated name, no `name`, yet)."""

    uid: str
    operation: str
    #: The object's kind (`request.kind.kind`), "" when absent, and its subresource ("" for none).
    kind: str = ""
    sub_resource: str = ""
    namespace: str = ""
    #: `request.userInfo.username`: who sends the request (a controller, a user, mpsched).
    username: str = ""
    #: `request.object` and `request.oldObject` (UPDATE), as decoded.
    obj: object = None
    old_obj: object = None
    dry_run: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What to answer: allowed or not, why (a denial's message, or warnings), and a patch."""

    allowed: bool
    message: str = ""
    code: int = FORBIDDEN
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = field(default_factory=tuple)


def allow(*, patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()) -> Decision:
    return Decision(allowed=True, patch=tuple(patch), warnings=tuple(warnings))


def deny(message: str, *, code: int = FORBIDDEN) -> Decision:
    return Decision(allowed=False, message=message, code=code)


def _text(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        shown = "nothing" if value is None else type(value).__name__
        raise ReviewError(f"{where}.{key} must be a non-empty string, got {shown}")
    return value


def parse_review(doc: object) -> AdmissionRequest:
    """The request of an AdmissionReview v1 document. Raises ReviewError."""
    if not isinstance(doc, dict):
        raise ReviewError(f"the body must be a JSON object (an {KIND}), got {_kind(doc)}")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise ReviewError(
            f"expected apiVersion {API_VERSION!r} and kind {KIND!r}, got "
            f"{_shown(doc.get('apiVersion'))} and {_shown(doc.get('kind'))} "
            "(configure admissionReviewVersions: [v1])"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ReviewError(f"request must be an object, got {_kind(request)}")
    uid = _text(request, "uid", "request", required=True)
    operation = _text(request, "operation", "request", required=True)
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(sorted(OPERATIONS))}")
    kind = request.get("kind")
    if kind is not None and not isinstance(kind, dict):
        raise ReviewError(f"request.kind must be an object, got {_kind(kind)}")
    user = request.get("userInfo")
    if user is not None and not isinstance(user, dict):
        raise ReviewError(f"request.userInfo must be an object, got {_kind(user)}")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool | None):
        raise ReviewError(f"request.dryRun must be true or false, got {_kind(dry_run)}")
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        kind=_text(kind or {}, "kind", "request.kind"),
        sub_resource=_text(request, "subResource", "request"),
        namespace=_text(request, "namespace", "request"),
        username=_text(user or {}, "username", "request.userInfo"),
        obj=request.get("object"),
        old_obj=request.get("oldObject"),
        dry_run=bool(dry_run),
    )


def review_response(uid: str, decision: Decision, *, patch_json: bytes | None) -> dict[str, Any]:
    """The AdmissionReview answering request `uid`. `patch_json`: the decision's patch encoded
    as JSON text by the caller (None or an empty list: no patch is sent)."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message}
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.allowed and decision.patch and patch_json is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch_json).decode("ascii")
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: object) -> str:
    return repr(value[:60]) if isinstance(value, str) else _kind(value)
