"""The fake API server with the proxy subresources `kubectl mpsched` uses: a Service's port
(`services/{name}:{port}/proxy/{path}`) and a pod's port (`pods/{name}:{port}/proxy/{path}`),
each relayed, query string included, to a real server on loopback as the real API server
relays to an endpoint; plus a namespace's pod list by label selector. Where the real one answers
for itself (no such Service or pod: 404), so does this one, with its `v1.Status`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from extender.cluster import status_body
from tests.kube.fake_apiserver import FakeApiServer


@dataclass
class ProxyingApiServer(FakeApiServer):
    #: (namespace, service, port name) → the URL of the ready endpoint behind it.
    services: dict[tuple[str, str, str], str] = field(default_factory=dict)
    #: (namespace, pod, port) → the URL the pod serves that port on.
    pod_ports: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = super().app()
        ns = "/api/v1/namespaces/{ns}"
        app.router.add_get(ns + "/services/{target}/proxy/{path:.*}", self._service_proxy)
        app.router.add_get(ns + "/pods/{target}/proxy/{path:.*}", self._pod_proxy)
        app.router.add_get(ns + "/pods", self._list_namespace_pods)
        return app

    async def _relay(self, request: web.Request, table: dict[Any, str], kind: str) -> web.Response:
        gated = await self._gate(request)
        if gated is not None:
            return gated
        name, _, port = request.match_info["target"].partition(":")
        upstream = table.get((request.match_info["ns"], name, port))
        if upstream is None:
            body = status_body(404, "NotFound", f'{kind} "{name}" not found', name=name, kind=kind)
            return web.json_response(body, status=404)
        url = f"{upstream}/{request.match_info['path']}"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params=request.query) as resp,
        ):
            return web.Response(
                body=await resp.read(), status=resp.status, content_type=resp.content_type
            )

    async def _service_proxy(self, request: web.Request) -> web.Response:
        return await self._relay(request, self.services, "services")

    async def _pod_proxy(self, request: web.Request) -> web.Response:
        return await self._relay(request, self.pod_ports, "pods")

    async def _list_namespace_pods(self, request: web.Request) -> web.Response:
        gated = await self._gate(request)
        if gated is not None:
            return gated
        wanted = dict(
            term.split("=", 1) for term in request.query.get("labelSelector", "").split(",") if term
        )
        items = [
            p
            for (ns, _), p in self.pods.items()
            if ns == request.match_info["ns"]
            and all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        meta = {"resourceVersion": str(self.rv)}
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
        return web.Response(body=orjson.dumps(body), content_type="application/json")
