"""A small in-process Kubernetes API server for the adapter's tests: the edge is faked, but it
behaves like the real one where the adapter depends on it — a global resourceVersion, paged
lists with continue tokens, watches from a resourceVersion that can break or expire (410 Gone),
and the Binding subresource's 201 / 404 / 409 answers."""

from __future__ import annotations

import asyncio
import bisect
import copy
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class FakeApiServer:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    #: (resourceVersion, kind, type, object) for every write, for watches to replay.
    log: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    rv: int = 100
    #: Watches from a resourceVersion below this answer 410 Gone (etcd compaction).
    oldest_rv: int = 0
    #: Seconds every request waits before it is answered.
    delay_s: float = 0.0
    #: HTTP statuses to answer the next requests with, whatever they ask.
    fail_next: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    #: Apply the next bind, then cut the connection before answering (a lost answer).
    lose_next_bind_answer: bool = False
    _changed: asyncio.Condition | None = None
    _watching: asyncio.Condition | None = None
    _streams: list[web.Request] = field(default_factory=list)

    # -- state changes, as the real server would record them ------------------------------------

    def _write(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, kind, type_, copy.deepcopy(obj)))
        if self._changed is not None:
            cond = self._changed

            async def notify() -> None:
                async with cond:
                    cond.notify_all()

            asyncio.get_running_loop().create_task(notify())

    def put(self, obj: dict[str, Any]) -> None:
        """Create a whole Node or Pod object as given (the API server fills resourceVersion)."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        if obj.get("kind") == "Node":
            self.nodes[meta["name"]] = obj
            self._write("Node", "ADDED", obj)
        else:
            meta.setdefault("namespace", "default")
            meta.setdefault("annotations", {})
            self.pods[(meta["namespace"], meta["name"])] = obj
            self._write("Pod", "ADDED", obj)

    def add_node(self, name: str, **meta: Any) -> None:
        obj = {"metadata": {"name": name, **meta}, "status": {"allocatable": {"cpu": "64"}}}
        self.nodes[name] = obj
        self._write("Node", "ADDED", obj)

    def add_pod(self, namespace: str, name: str, uid: str, **spec: Any) -> None:
        obj = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": {}},
            "spec": {"containers": [{"name": "c"}], **spec},
            "status": {"phase": "Pending"},
        }
        self.pods[(namespace, name)] = obj
        self._write("Pod", "ADDED", obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        obj = self.pods.pop((namespace, name))
        self._write("Pod", "DELETED", obj)

    def compact(self) -> None:
        self.oldest_rv = self.rv + 1
        self.log.clear()

    async def cut_watches_once_open(self, count: int) -> None:
        """Wait until `count` watches are open, then cut them all."""
        assert self._watching is not None
        async with self._watching:
            await self._watching.wait_for(lambda: len(self._streams) >= count)
        self.break_watches()

    def break_watches(self) -> int:
        """Cut every open watch connection abruptly, as a load balancer or restart would."""
        cut = 0
        for request in list(self._streams):
            if request.transport is not None:
                request.transport.close()
                cut += 1
        return cut

    # -- HTTP ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self._list_or_watch)
        app.router.add_get("/api/v1/pods", self._list_or_watch)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self._bind)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        leases = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        app.router.add_get(leases + "/{name}", self._get_lease)
        app.router.add_post(leases, self._create_lease)
        app.router.add_put(leases + "/{name}", self._replace_lease)
        app.on_startup.append(self._startup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self._changed = asyncio.Condition()
        self._watching = asyncio.Condition()

    async def _gate(self, request: web.Request) -> web.Response | None:
        self.requests.append(f"{request.method} {request.path_qs}")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next:
            status = self.fail_next.pop(0)
            return _status(status, "Failure", f"injected failure {status}")
        return None

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        kind = "Node" if request.path.endswith("/nodes") else "Pod"
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request, kind)
        objects = list(self.nodes.values() if kind == "Node" else self.pods.values())
        limit = int(request.query.get("limit", "0") or 0)
        start, list_rv = 0, self.rv
        token = request.query.get("continue")
        if token:
            start_text, rv_text = token.split(":")
            start, list_rv = int(start_text), int(rv_text)
        end = start + limit if limit else len(objects)
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if end < len(objects):
            meta["continue"] = f"{end}:{list_rv}"
        body = {
            "kind": f"{kind}List",
            "apiVersion": "v1",
            "metadata": meta,
            "items": objects[start:end],
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _watch(self, request: web.Request, kind: str) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion", "0") or 0)
        if since < self.oldest_rv:
            return _status(410, "Expired", f"too old resource version: {since}")
        stream = web.StreamResponse(status=200)
        stream.content_type = "application/json"
        await stream.prepare(request)
        self._streams.append(request)
        assert self._watching is not None
        async with self._watching:
            self._watching.notify_all()
        timeout = float(request.query.get("timeoutSeconds", "30"))
        assert self._changed is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if since < self.oldest_rv:
                        gone = {
                            "type": "ERROR",
                            "object": {"kind": "Status", "code": 410, "message": "too old"},
                        }
                        await stream.write(orjson.dumps(gone) + b"\n")
                        break
                    start = bisect.bisect_right([e[0] for e in self.log], since)
                    for rv, k, type_, obj in self.log[start:]:
                        if k == kind:
                            await stream.write(orjson.dumps({"type": type_, "object": obj}) + b"\n")
                        since = rv
                    async with self._changed:
                        if not self.log or self.log[-1][0] <= since:
                            await self._changed.wait()
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self._streams.remove(request)
        return stream

    async def _get_pod(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        pod = self.pods.get((request.match_info["ns"], request.match_info["name"]))
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        return web.Response(body=orjson.dumps(pod), content_type="application/json")

    async def _bind(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = await request.json()
        if body.get("kind") != "Binding":
            return _status(400, "BadRequest", "not a Binding")
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            return _status(400, "BadRequest", "name in URL does not match name in Binding object")
        pod = self.pods.get((ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            return _status(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: "
                f"{meta['uid']}, UID in object meta: "
                f"{pod['metadata']['uid']}",
            )
        if pod["spec"].get("nodeName"):
            return _status(
                409,
                "Conflict",
                f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        pod["spec"]["nodeName"] = body["target"]["name"]
        pod["metadata"]["annotations"].update(meta.get("annotations") or {})
        self._write("Pod", "MODIFIED", pod)
        if self.lose_next_bind_answer and request.transport is not None:
            self.lose_next_bind_answer = False
            request.transport.close()
        return _status(201, "Success", "")

    async def _get_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        lease = self.leases.get((request.match_info["ns"], request.match_info["name"]))
        if lease is None:
            return _status(404, "NotFound", "lease not found")
        return web.Response(body=orjson.dumps(lease), content_type="application/json")

    async def _create_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        body = await request.json()
        key = (request.match_info["ns"], body["metadata"]["name"])
        if key in self.leases:
            return _status(409, "AlreadyExists", "lease already exists")
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = body
        return web.Response(status=201, body=orjson.dumps(body), content_type="application/json")

    async def _replace_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        body = await request.json()
        key = (request.match_info["ns"], request.match_info["name"])
        current = self.leases.get(key)
        if current is None:
            return _status(404, "NotFound", "lease not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                "the object has been modified; please apply your "
                "changes to the latest version and try again",
            )
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = body
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _event(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        self.events.append(await request.json())
        return web.Response(status=201, body=b"{}", content_type="application/json")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")
