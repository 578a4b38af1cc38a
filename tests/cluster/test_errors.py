"""`error_from_status`: the class follows the Status's reason, falling back to the HTTP code for
a reason it does not know; code, reason, message and details are kept as data; a body that is
not a Status (a proxy's page, a plain-text 429) still gives the right class."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cluster import (
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
from extender.kube.requests import failure as _failure


def status(code: int, reason: str, message: str = "m", **details: Any) -> dict[str, Any]:
    return status_body(code, reason, message, **details)


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "Conflict", Conflict),
        (409, "AlreadyExists", AlreadyExists),
        (410, "Expired", Gone),
        (410, "Gone", Gone),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", Unavailable),
        (503, "ServiceUnavailable", Unavailable),
        (504, "Timeout", Unavailable),
        (504, "ServerTimeout", Unavailable),
        # A reason we do not know: the code decides.
        (404, "SomethingNew", NotFound),
        (409, "", Conflict),
        (502, "", Unavailable),
        (418, "", ClusterError),
    ],
)
def test_the_class_follows_the_reason_then_the_code(
    code: int, reason: str, cls: type[ClusterError]
) -> None:
    err = error_from_status(code, status(code, reason), what="call")
    assert type(err) is cls
    assert (err.code, err.reason, err.message, err.what) == (code, reason, "m", "call")
    assert str(err) == "call: m"


def test_the_reason_wins_over_the_code() -> None:
    # A storage conflict the server wraps in a 500 still says Conflict; client-go reads it so.
    assert type(error_from_status(500, status(500, "Conflict"), what="x")) is Conflict


def test_details_are_kept_as_data() -> None:
    body = status(
        422,
        "Invalid",
        'Pod "p" is invalid',
        name="p",
        kind="Pod",
        causes=[{"reason": "FieldValueInvalid", "message": "bad", "field": "spec.x"}, "junk"],
    )
    err = error_from_status(422, body, what="update")
    assert (err.details.name, err.details.kind) == ("p", "Pod")
    assert err.details.causes == (StatusCause("FieldValueInvalid", "bad", "spec.x"),)


def test_too_many_requests_says_when_to_come_back() -> None:
    err = error_from_status(429, status(429, "TooManyRequests", retryAfterSeconds=3), what="x")
    assert isinstance(err, TooManyRequests) and isinstance(err, Unavailable)
    assert err.retry_after_s == 3.0
    # The overload filters answer in plain text with a Retry-After header: read that.
    plain = _failure(429, None, {"Retry-After": "2"}, "list Pods")
    assert isinstance(plain, TooManyRequests) and plain.retry_after_s == 2.0
    # The write client hands its header names over lower-cased.
    lowered = _failure(429, None, {"retry-after": "4"}, "bind p")
    assert isinstance(lowered, TooManyRequests) and lowered.retry_after_s == 4.0


def test_no_status_body_and_no_answer() -> None:
    err = error_from_status(502, None, what="get")
    assert type(err) is Unavailable and err.message == "HTTP 502"
    html = _failure(503, "<html>", {}, "get")
    assert type(html) is Unavailable and html.code == 503
    none = error_from_status(0, None, what="bind")
    assert type(none) is NoAnswer and isinstance(none, Unavailable)
    assert none.message == "no answer"
