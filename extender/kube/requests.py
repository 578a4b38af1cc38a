"""What the Kubernetes adapter reads off each request and answer: the verb and resource a
generated API method stands for (for `mpsched_api_requests_total`), a body in the form the
client encodes, the body of an Event, a name as a URL path segment, and the typed error of a
failed answer (a v1.Status where the server wrote one, its Retry-After header where it did not).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

import orjson

from extender.cluster import ClusterError, error_from_status

#: Generated-method prefixes → the API server's verb for the request.
_VERBS: Final = {
    "read": "get",
    "list": "list",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}
#: Label value of a request that got no HTTP answer (refused, cut, timed out).
NO_CODE: Final = "none"


def request_kind(method: Any) -> tuple[str, str]:
    """(verb, resource) of a generated API method, by its name: `read_namespaced_pod` is
    ("get", "pods"), `create_namespaced_pod_binding` ("create", "pods/binding"),
    `list_pod_for_all_namespaces` ("list", "pods"). Bounded: the methods the adapter calls."""
    name = getattr(method, "__name__", "")
    prefix, _, rest = name.partition("_")
    verb = _VERBS.get(prefix)
    if verb is None or not rest:
        return ("other", "other")
    rest = rest.removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    kind, _, sub = rest.partition("_")
    return (verb, f"{kind}s/{sub}" if sub else f"{kind}s")


def plain(value: Any) -> Any:
    """`value` with every Mapping a dict and every list/tuple a list: what the client's JSON
    encoder takes (a read-only mapping from the caller is not a dict)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def event_body(
    namespace: str,
    involved: dict[str, str],
    source: dict[str, str],
    now: str,
    *,
    reason: str,
    message: str,
    warning: bool,
) -> dict[str, Any]:
    """A core/v1 Event about the object `involved` (its reference), in `namespace`, seen once
    at `now` (RFC 3339), its message cut to 1024 characters. A source with a host (a node's
    own component) is also the reporting instance."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": source,
        "reportingComponent": source["component"],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    if "host" in source:
        body["reportingInstance"] = source["host"]
    return body


def quote_segment(segment: str) -> str:
    """A name as one URL path segment, every reserved character escaped (the generated client's
    own quoting of path parameters)."""
    return urllib.parse.quote(segment, safe="")


def parse_answer(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None  # a proxy's HTML error page, say: no Status


def failure(code: int, body: Any, headers: Mapping[str, str], what: str) -> ClusterError:
    """The typed error for a non-2xx answer. The API server's overload filters answer 429 in
    plain text with a Retry-After header rather than a Status: read the header then."""
    if not (isinstance(body, Mapping) and body.get("kind") == "Status"):
        body = {"message": f"HTTP {code}"}
        # Header names match in any case (the write client's are lower-cased).
        retry = next((v for k, v in headers.items() if k.lower() == "retry-after"), "")
        if retry.isdigit():
            body["details"] = {"retryAfterSeconds": int(retry)}
    return error_from_status(code, body, what=what)
