"""The fake API server's read-only objects beyond Nodes and Pods (`FakeApiServer.objects`):
Namespaces, DaemonSets, Deployments, webhook configurations, EndpointSlices, Secrets,
RuntimeClasses, and `GET /version`, for `mpsched preflight`'s tests.

Served as the real server serves them: `GET` of one object by its path (404 NotFound with the
real Status otherwise), lists of a namespace's or the whole cluster's objects of a resource,
narrowed by a `labelSelector` of equality terms (`a=b,c==d`; a set-based term is 400, as a term
the real parser refuses is); a resource in `forbidden` is answered 403, as RBAC answers. A test
puts objects with `put(obj)`; the path comes from the object's apiVersion, kind, namespace and
name, as the API server's own REST mapping makes it.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from extender.cluster import status_body

#: kind → its resource (the plural the REST paths use), for the kinds preflight reads.
RESOURCES = {
    "Namespace": "namespaces",
    "DaemonSet": "daemonsets",
    "Deployment": "deployments",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "EndpointSlice": "endpointslices",
    "Secret": "secrets",
    "Service": "services",
    "RuntimeClass": "runtimeclasses",
}
Gate = Callable[[web.Request], Awaitable[web.Response | None]]


def _prefix(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@dataclass
class ObjectStore:
    #: (API prefix, namespace or "", resource, name) → the object.
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    #: What `GET /version` answers.
    version: dict[str, str] = field(
        default_factory=lambda: {"major": "1", "minor": "33", "gitVersion": "v1.33.4"}
    )
    rv: int = 1
    #: Resources every request for is answered 403 Forbidden, as RBAC answers a user without
    #: the verb (the real Status: `<resource> is forbidden: User ... cannot <verb> ...`).
    forbidden: set[str] = field(default_factory=set)

    def put(self, obj: dict[str, Any]) -> None:
        """Store (or replace) a whole object, as created."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        key = (
            _prefix(obj["apiVersion"]),
            meta.get("namespace", ""),
            RESOURCES[obj["kind"]],
            meta["name"],
        )
        self.objects[key] = obj

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        for key in [k for k in self.objects if k[1:] == (namespace, RESOURCES[kind], name)]:
            del self.objects[key]

    def routes(self, app: web.Application, gate: Gate) -> None:
        """GET /version and GET of every path under /api/v1 and /apis not routed before."""

        async def version(request: web.Request) -> web.Response:
            return await gate(request) or _json(self.version)

        async def get(request: web.Request) -> web.Response:
            return await gate(request) or self._get(request)

        app.router.add_get("/version", version)
        app.router.add_get("/version/", version)  # the generated client's path
        app.router.add_get("/api/v1/{tail:.*}", get)
        app.router.add_get("/apis/{tail:.*}", get)

    def _get(self, request: web.Request) -> web.Response:
        parts = [p for p in request.path.split("/") if p]
        split = 2 if parts[0] == "api" else 3
        prefix, rest = "/" + "/".join(parts[:split]), parts[split:]
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 2:
            return _json(
                status_body(404, "NotFound", "the server could not find the resource"), 404
            )
        resource = rest[0]
        if resource in self.forbidden:
            verb = "get" if len(rest) == 2 else "list"
            message = (
                f'{resource} is forbidden: User "u" cannot {verb} resource "{resource}" in API '
                f'group "{prefix.split("/")[2] if prefix.startswith("/apis") else ""}"'
            )
            return _json(status_body(403, "Forbidden", message, kind=resource), 403)
        if len(rest) == 2:
            obj = self.objects.get((prefix, namespace, resource, rest[1]))
            if obj is None:
                body = status_body(
                    404,
                    "NotFound",
                    f'{resource} "{rest[1]}" not found',
                    name=rest[1],
                    kind=resource,
                )
                return _json(body, 404)
            return _json(obj)
        terms = []
        for term in filter(None, request.query.get("labelSelector", "").split(",")):
            key, eq, value = term.replace("==", "=").partition("=")
            if not eq or "!" in key:
                return _json(
                    status_body(400, "BadRequest", f"unable to parse requirement: {term}"), 400
                )
            terms.append((key, value))
        items = [
            obj
            for (p, ns, r, _), obj in sorted(self.objects.items())
            if p == prefix
            and r == resource
            and (not namespace or ns == namespace)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in terms)
        ]
        return _json(
            {
                "kind": "List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )
