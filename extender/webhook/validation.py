"""The admission decisions for pods, validation side: what `/validate` refuses. Pure: a request
in, a `Decision` out.

Validation keeps the allocation the scheduler's alone: the request is read by the same parser
`/filter` uses (so both reject in the same words); a pod may not write `mpsched.io/`
annotations, set the injected env vars to anything but what mutation writes, or preset
`spec.nodeName` while asking for `mpsched.io/*` — unless the request comes from mpsched's own
service account. A pod that asks for nothing and carries no `mpsched.io/` annotation passes.
The ValidatingAdmissionPolicy in deploy/base enforces the same rules inside the API server; this
copy checks what CEL cannot (hashed annotation keys, the configured limits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from extender.packing.errors import InvalidRequest
from extender.packing.podspec import PREFIX
from extender.packing.request import ContainerAsk
from extender.webhook.access import access_problems
from extender.webhook.admission import (
    CONNECTIONS_ENV,
    GUARDED_ENV,
    INVALID,
    PIPE_ENV,
    UNPROCESSABLE,
    AdmissionSettings,
    connections_problem,
    container_env,
    mutate,
    not_a_pod,
    parse_asks,
)
from extender.webhook.pods import (
    Malformed,
    asking_containers,
    asks_mpsched,
    items,
    mpsched_annotations,
    spec_of,
)
from extender.webhook.review import BAD_REQUEST, AdmissionRequest, Decision, allow, deny

#: The subresource `kubectl debug` adds ephemeral containers through (an UPDATE of the pod).
EPHEMERAL: Final = "ephemeralcontainers"


def validate(request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """Allowed, or denied with every reason found, each naming the container and field."""
    refused = not_a_pod(request)
    if refused is not None:
        return refused
    ephemeral = request.sub_resource == EPHEMERAL
    if request.operation not in ("CREATE", "UPDATE") or (request.sub_resource and not ephemeral):
        return allow()
    if request.username == settings.webhook.service_account:
        return allow()
    pod = request.obj
    if not isinstance(pod, Mapping):
        return deny("request.object must be a Pod object", code=BAD_REQUEST)
    try:
        if ephemeral:  # only ephemeralContainers change here; they never ask for anything
            problems = access_problems(pod, ("ephemeralContainers",))
        else:
            problems = _annotation_problems(request, settings)
        # On UPDATE only the annotations can change: a pod's resources, env and nodeName are
        # immutable there, and re-checking the request could block a finalizer's removal.
        if request.operation == "CREATE" and not ephemeral:
            if asks_mpsched(pod):
                problems += _create_problems(pod, settings)
            problems += access_problems(pod)
    except Malformed as exc:
        return deny(f"request.object: {exc}", code=BAD_REQUEST)
    if not problems:
        return allow()
    code = UNPROCESSABLE if problems[0].startswith(INVALID) else 403
    return deny("; ".join(problems), code=code)


def _annotation_problems(request: AdmissionRequest, settings: AdmissionSettings) -> list[str]:
    who = f"only mpsched's service account ({settings.webhook.service_account}) writes them"
    new = mpsched_annotations(request.obj)
    if request.operation == "CREATE":
        if not new:
            return []
        return [f"metadata.annotations: a pod may not set {_keys(new)}: {who}, when it binds"]
    old = mpsched_annotations(request.old_obj)
    changes = [
        (verb, keys)
        for verb, keys in (
            ("add", sorted(new.keys() - old.keys())),
            ("remove", sorted(old.keys() - new.keys())),
            ("change", sorted(k for k in new.keys() & old.keys() if new[k] != old[k])),
        )
        if keys
    ]
    return [
        f"metadata.annotations: an update may not {verb} {_keys(keys)}: {who}"
        for verb, keys in changes
    ]


def _create_problems(pod: Mapping[str, Any], settings: AdmissionSettings) -> list[str]:
    problems = []
    asks: Mapping[str, ContainerAsk] | None
    try:
        asks = parse_asks(pod, settings)
    except InvalidRequest as exc:
        problems.append(f"{INVALID} {exc}")
        asks = None
    node = spec_of(pod).get("nodeName")
    if node:
        problems.append(
            f"spec.nodeName: a pod asking for {PREFIX}* resources may not preset its node "
            f"({node!r}): the scheduler places it and mpsched chooses its GPU"
        )
    if asks is not None:
        problems += _env_problems(pod, asks, settings)
    return problems


def _env_problems(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk], settings: AdmissionSettings
) -> list[str]:
    """Guarded env vars set to anything but what mutation writes for that container."""
    problems = []
    # A container that asks for nothing is `access`'s: it refuses every such source.
    for field, i, container, name, ask in asking_containers(pod, asks):
        ours = {e["name"]: e for e in container_env(ask, settings)}
        for entry in items(container.get("env"), f"spec.{field}[{i}].env"):
            var = entry.get("name") if isinstance(entry, Mapping) else None
            if var not in GUARDED_ENV or _allowed(entry, ask, ours, settings):
                continue
            limit = settings.webhook.device_max_connections
            problem = connections_problem(entry, name, limit) if var == CONNECTIONS_ENV else None
            if problem is not None:  # its own words: the limit and how to meet it
                problems.append(problem)
                continue
            problems.append(
                f"container {name!r}: env {var} is set by the pod, but mpsched sets it from "
                "the allocation the scheduler makes"
            )
    return problems


def _allowed(
    entry: Mapping[str, Any],
    ask: ContainerAsk,
    ours: Mapping[str, Mapping[str, Any]],
    settings: AdmissionSettings,
) -> bool:
    """Whether an asking container may have this entry of a guarded variable: the webhook's own
    form; a pipe directory that is an absolute path (it only selects which daemon a client
    reaches, and a pod reaches only the daemon the node mounts for it); a connection count
    within the limit in a share container, any in a whole-GPU one (no MPS client)."""
    var = entry["name"]
    if var in ours and _same_env(entry, ours[var]):
        return True
    if var == PIPE_ENV:
        value = entry.get("value")
        return "valueFrom" not in entry and isinstance(value, str) and value.startswith("/")
    if var == CONNECTIONS_ENV:
        if not ask.asks_share:
            return True
        limit = settings.webhook.device_max_connections
        return connections_problem(entry, ask.name, limit) is None
    return False


def _same_env(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Equal env entries, allowing for the API server's defaulting (`fieldRef.apiVersion: v1`)."""
    return _normal(have) == _normal(want)


def _normal(entry: Mapping[str, Any]) -> tuple[str, object]:
    value_from = entry.get("valueFrom")
    if value_from is None:
        return ("value", entry.get("value") or "")
    if "value" not in entry and isinstance(value_from, Mapping) and set(value_from) == {"fieldRef"}:
        ref = value_from["fieldRef"]
        if (
            isinstance(ref, Mapping)
            and set(ref) <= {"apiVersion", "fieldPath"}
            and ref.get("apiVersion", "v1") == "v1"
        ):
            return ("fieldRef", ref.get("fieldPath"))
    return ("other", None)


def _keys(keys: Mapping[str, object] | Sequence[str]) -> str:
    return ", ".join(sorted(keys))


def decide(endpoint: str, request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """The decision of `endpoint` ("mutate" or "validate") on `request`."""
    return mutate(request, settings) if endpoint == "mutate" else validate(request, settings)
