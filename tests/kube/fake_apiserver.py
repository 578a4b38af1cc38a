"""A small in-process Kubernetes API server for the adapter's tests and for tests of the whole
service (`mpsched serve --kubeconfig ...` as a subprocess, this fake in the test process; see
`serving`). The edge is faked, but it behaves like the real one where the service depends on it:
a global resourceVersion, paged lists with continue tokens, watches from a resourceVersion that
can break or expire (an ERROR event with a 410 Expired Status, as the watch cache sends), the
Binding subresource's 201 / 404 / 409 answers, Leases with resourceVersion preconditions, and
failures answered with the very v1.Status bodies the real server writes (apimachinery's
`errors.New*`: reason, details {name, group, kind}, code).

Fault injection, each knob a plain attribute or method:

- `delay_s`: every request waits this long before it is handled.
- `fail_next`: HTTP codes the next requests are answered with, whatever they ask (each with the
  Status the real server would send for that code: 429 with `retryAfterSeconds` and a
  Retry-After header, 503 ServiceUnavailable, ...).
- `outage(True, refuse=False)`: every request is answered 503 ServiceUnavailable (with
  `refuse=True`: its connection is closed without an answer) and every open watch is cut at
  once, until `outage(False)`. `outage(True, reads_only=True)`: only reads (get, list, watch)
  fail so; writes are served as ever (a watch cache or a read path down while etcd takes
  writes, or a load balancer routing reads to a broken replica).
- `hang_binds`: bind requests wait, unanswered and open, while it is set; cleared, they are
  applied and answered (late: the client may have given up, as with a slow etcd).
- `bind_delay_s`: each bind waits this long, then is applied and answered.
- `lose_next_bind_answer`: apply the next bind, then cut the connection instead of answering.
- `outage_after_next_bind`: apply the next bind, cut its answer, and start an outage in the same
  instant (an answer lost while lists and watches fail too).
- `reads_outage_after_next_bind`: apply the next bind, cut its answer, and start a reads-only
  outage in the same instant: a Binding sent again is answered by the real rules (409, pod
  already assigned), while the pod cannot be read back.
- `compact()`, `break_watches()`, `cut_watches_once_open(n)`: etcd compaction, a cut connection.

- `hang_patches`: node patches wait, unanswered and open, while it is set; cleared, they are
  applied and answered (late, like `hang_binds`).

The node agent's calls: PATCH /api/v1/nodes/{name} as a JSON merge patch (RFC 7386; the real
server also takes strategic-merge and JSON patches, this fake answers them 415 so that a client
sending the generated client's default, strategic merge, is caught), a `metadata.resourceVersion`
in the patch as a precondition (409 Conflict), 422 for a patch that is not an object; pod lists
with `fieldSelector` (spec.nodeName, metadata.name, metadata.namespace, status.phase; another
field is 400 as on the real server); Events about Nodes, kept in `events` like pod events.

Authentication: every request must carry `Authorization: Bearer <token>` (`token`, the one
`kubeconfig` writes); anything else is answered 401 Unauthorized, as the real server answers an
unauthenticated client. An Event is stored as the server stores it (a name from its
`generateName`, a uid, a resourceVersion) and answered with the stored object.

Other kinds, read-only: `objects.put(obj)` (Namespaces, DaemonSets, webhook configurations,
EndpointSlices, Secrets, ...; `GET /version` answers `objects.version`).

What was asked: `requests` (each "METHOD /path?query"), `requests_of(method, resource)`.

Direct writes, each a real write (resourceVersion bump, watch event): `put`, `add_node`,
`add_pod`, `update_node`, `update_pod`, `delete_node`, `delete_pod`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from extender.cluster import status_body
from tests.kube.fake_objects import ObjectStore

#: The bearer token of the fake's kubeconfig, and the one the fake accepts by default.
TOKEN = "t"
#: How often a held request looks whether it may go on (hang_binds, hang_patches, outage).
_POLL_S = 0.01
#: The one patch type the fake takes.
MERGE_PATCH = "application/merge-patch+json"
#: Fields a fieldSelector may name, per kind (the real server's field label conversions).
_SELECTABLE: dict[str, dict[str, Callable[[dict[str, Any]], str]]] = {
    "Pod": {
        "spec.nodeName": lambda o: str((o.get("spec") or {}).get("nodeName") or ""),
        "metadata.name": lambda o: str(o["metadata"].get("name", "")),
        "metadata.namespace": lambda o: str(o["metadata"].get("namespace", "")),
        "status.phase": lambda o: str((o.get("status") or {}).get("phase") or ""),
    },
    "Node": {"metadata.name": lambda o: str(o["metadata"].get("name", ""))},
}


@dataclass
class FakeApiServer:
    #: The bearer token every request must carry.
    token: str = TOKEN
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    #: (resourceVersion, kind, type, the watch event encoded) for every write, for watches to
    #: replay.
    log: list[tuple[int, str, str, bytes]] = field(default_factory=list)
    rv: int = 100
    #: Watches from a resourceVersion below this get 410 Expired (etcd compaction).
    oldest_rv: int = 0
    #: Seconds every request waits before it is answered.
    delay_s: float = 0.0
    #: HTTP statuses to answer the next requests with, whatever they ask.
    fail_next: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    #: Apply the next bind, then cut the connection before answering (a lost answer).
    lose_next_bind_answer: bool = False
    #: Apply the next bind, cut its answer, and start an outage at once.
    outage_after_next_bind: bool = False
    #: Apply the next bind, cut its answer, and start a reads-only outage at once.
    reads_outage_after_next_bind: bool = False
    #: Bind requests stay open and unanswered while this is set.
    hang_binds: bool = False
    #: Seconds each bind waits before it is applied and answered.
    bind_delay_s: float = 0.0
    #: Binds applied (successful writes), in order: (namespace, name, node).
    binds: list[tuple[str, str, str]] = field(default_factory=list)
    #: Node patches stay open and unanswered while this is set.
    hang_patches: bool = False
    #: Node patches applied, in order: (node name, the patch as sent).
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: Every other kind, read-only, and GET /version (tests/kube/fake_objects.py).
    objects: ObjectStore = field(default_factory=ObjectStore)
    _events_made: int = 0
    _outage: bool = False
    _reads_only: bool = False
    _refuse: bool = False
    _stopping: bool = False
    _changed: asyncio.Condition | None = None
    _watching: asyncio.Condition | None = None
    _streams: list[web.Request] = field(default_factory=list)

    # -- state changes, as the real server would record them ------------------------------------

    def _write(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        # The watch event as it will be sent, encoded once: a snapshot of the object now (it is
        # changed in place later) for every watcher, at a fraction of a deep copy's cost.
        event = b'{"type":"%s","object":%s}\n' % (type_.encode(), orjson.dumps(obj))
        self.log.append((self.rv, kind, type_, event))
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
        obj = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, **meta},
            "status": {"allocatable": {"cpu": "64"}},
        }
        self.nodes[name] = obj
        self._write("Node", "ADDED", obj)

    def add_pod(self, namespace: str, name: str, uid: str, **spec: Any) -> None:
        obj = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": {}},
            "spec": {"containers": [{"name": "c"}], **spec},
            "status": {"phase": "Pending"},
        }
        self.pods[(namespace, name)] = obj
        self._write("Pod", "ADDED", obj)

    def update_node(
        self,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        """Merge `annotations` and `labels` into the node (a None value removes the key)."""
        obj = self.nodes[name]
        _merge(obj["metadata"], "annotations", annotations)
        _merge(obj["metadata"], "labels", labels)
        self._write("Node", "MODIFIED", obj)

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        phase: str | None = None,
    ) -> None:
        """Merge `annotations` into the pod (a None value removes the key); set `status.phase`."""
        obj = self.pods[(namespace, name)]
        _merge(obj["metadata"], "annotations", annotations)
        if phase is not None:
            obj.setdefault("status", {})["phase"] = phase
        self._write("Pod", "MODIFIED", obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        obj = self.pods.pop((namespace, name))
        self._write("Pod", "DELETED", obj)

    def delete_node(self, name: str) -> None:
        obj = self.nodes.pop(name)
        self._write("Node", "DELETED", obj)

    def compact(self) -> None:
        self.oldest_rv = self.rv + 1
        self.log.clear()

    def outage(self, on: bool, *, refuse: bool = False, reads_only: bool = False) -> None:
        """While on, every request fails (with `reads_only`, every GET: get, list, watch): 503
        ServiceUnavailable, or (refuse) its connection is closed unanswered; every open watch
        is cut now."""
        self._outage, self._refuse, self._reads_only = on, refuse, reads_only
        if on:
            self.break_watches()

    async def cut_watches_once_open(self, count: int) -> None:
        """Wait until `count` watches are open, then cut them all."""
        assert self._watching is not None
        async with self._watching:
            await self._watching.wait_for(lambda: len(self._streams) >= count)
        self.break_watches()

    async def watches_open(self, count: int) -> None:
        """Wait until `count` watches are open."""
        assert self._watching is not None
        async with self._watching:
            await self._watching.wait_for(lambda: len(self._streams) >= count)

    def break_watches(self) -> int:
        """Cut every open watch connection abruptly, as a load balancer or restart would."""
        cut = 0
        for request in list(self._streams):
            if request.transport is not None:
                request.transport.close()
                cut += 1
        return cut

    def stop(self) -> None:
        """Release every held request and cut every watch, so that the server closes at once."""
        self._stopping = True
        self.hang_binds = False
        self.hang_patches = False
        self.break_watches()

    # -- what was asked -------------------------------------------------------------------------

    def requests_of(self, method: str, resource: str) -> int:
        """How many requests of `method` were made on `resource` ("nodes", "pods",
        "pods/binding", "events", "leases": the API's resource[/subresource] names, whatever the
        namespace or object name), answered or not."""
        count = 0
        for line in self.requests:
            verb, _, target = line.partition(" ")
            if verb == method.upper() and _resource_of(target) == resource:
                count += 1
        return count

    def node_events(self, node: str) -> list[dict[str, Any]]:
        """The Events recorded about the Node `node`, in order."""
        return [
            e
            for e in self.events
            if (e.get("involvedObject") or {}).get("kind") == "Node"
            and e["involvedObject"].get("name") == node
        ]

    # -- HTTP ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self._list_or_watch)
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_get("/api/v1/pods", self._list_or_watch)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self._bind)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        leases = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        app.router.add_get(leases + "/{name}", self._get_lease)
        app.router.add_post(leases, self._create_lease)
        app.router.add_put(leases + "/{name}", self._replace_lease)
        self.objects.routes(app, self._gate)  # last: its routes take any path not routed above
        app.on_startup.append(self._startup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self._changed = asyncio.Condition()
        self._watching = asyncio.Condition()

    async def _gate(self, request: web.Request) -> web.Response | None:
        self.requests.append(f"{request.method} {request.path_qs}")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self._outage and (request.method == "GET" or not self._reads_only):
            return self._unavailable(request)
        if self.fail_next:
            return _injected(self.fail_next.pop(0))
        return None

    def _unavailable(self, request: web.Request) -> web.Response:
        if self._refuse and request.transport is not None:
            request.transport.close()
        # The apiserver's answer when etcd is gone (or, behind a load balancer, its 503).
        return _status(
            503, "ServiceUnavailable", "the server is currently unable to handle the request"
        )

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        kind = "Node" if request.path.endswith("/nodes") else "Pod"
        selector = _field_selector(kind, request.query.get("fieldSelector", ""))
        if isinstance(selector, web.Response):
            return selector
        if request.query.get("watch") in ("true", "1", "True"):
            if request.query.get("fieldSelector"):
                # A real filtered watch also sends DELETED when an object stops matching; this
                # fake does not model that, so it refuses rather than answer differently.
                return _status(400, "BadRequest", "fake: fieldSelector on a watch is not modelled")
            return await self._watch(request, kind)
        objects = [
            o
            for o in (self.nodes.values() if kind == "Node" else self.pods.values())
            if selector(o)
        ]
        limit = int(request.query.get("limit", "0") or 0)
        start, list_rv = 0, self.rv
        token = request.query.get("continue")
        if token:
            start_text, rv_text = token.split(":")
            start, list_rv = int(start_text), int(rv_text)
            if list_rv < self.oldest_rv:
                return _status(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter.",
                )
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
                while not self._stopping:
                    if since < self.oldest_rv:
                        # The watch cache answers 200, then one ERROR event
                        # (errors.NewResourceExpired).
                        gone = {
                            "type": "ERROR",
                            "object": status_body(
                                410,
                                "Expired",
                                f"too old resource version: {since} ({self.oldest_rv})",
                            ),
                        }
                        await stream.write(orjson.dumps(gone) + b"\n")
                        break
                    start = bisect.bisect_right(self.log, since, key=_rv_of)
                    for rv, k, _, event in self.log[start:]:
                        if k == kind:
                            await stream.write(event)
                        since = rv
                    async with self._changed:
                        if not self.log or self.log[-1][0] <= since:
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(0.5):  # look at _stopping now and then
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
        name = request.match_info["name"]
        pod = self.pods.get((request.match_info["ns"], name))
        if pod is None:
            return _not_found("pods", name)
        return web.Response(body=orjson.dumps(pod), content_type="application/json")

    async def _get_node(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        name = request.match_info["name"]
        node = self.nodes.get(name)
        if node is None:
            return _not_found("nodes", name)
        return web.Response(body=orjson.dumps(node), content_type="application/json")

    async def _patch_node(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        name = request.match_info["name"]
        if request.content_type != MERGE_PATCH:
            # negotiation.NewUnsupportedMediaTypeError, answered before the body is read.
            return _status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {MERGE_PATCH}",
            )
        raw = await request.read()  # received in full before the server stalls
        while self.hang_patches and not self._stopping:  # noqa: ASYNC110
            await asyncio.sleep(_POLL_S)
        if (self._outage and not self._reads_only) or self._stopping:  # began while it waited
            return self._unavailable(request)
        try:
            patch = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _status(400, "BadRequest", f"error decoding patch: {exc}")
        node = self.nodes.get(name)
        if node is None:
            return _not_found("nodes", name)
        if not isinstance(patch, dict):
            return _status(
                422,
                "Invalid",
                f'Node "{name}" is invalid: a merge patch must be a JSON object',
                name=name,
                kind="Node",
            )
        wanted = patch.get("metadata")
        rv = wanted.get("resourceVersion") if isinstance(wanted, dict) else None
        if rv is not None and rv != node["metadata"].get("resourceVersion"):
            return _conflict(
                "nodes",
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        patched = _merge_patch(node, patch)
        meta = patched.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != name:
            return _status(
                400,
                "BadRequest",
                f"the name of the object ({(meta or {}).get('name', '')}) does not match the "
                f"name on the URL ({name})",
            )
        self.nodes[name] = patched
        self._write("Node", "MODIFIED", patched)
        self.patches.append((name, patch))
        return web.Response(body=orjson.dumps(patched), content_type="application/json")

    async def _bind(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        body = await _json(request)  # received in full before the server stalls
        # Polled: the knob is a plain attribute a test sets and clears.
        while self.hang_binds and not self._stopping:  # noqa: ASYNC110
            await asyncio.sleep(_POLL_S)
        if self.bind_delay_s:
            await asyncio.sleep(self.bind_delay_s)
        if (self._outage and not self._reads_only) or self._stopping:
            return self._unavailable(request)  # began while this bind waited: not applied
        ns, name = request.match_info["ns"], request.match_info["name"]
        if body.get("kind") != "Binding":
            return _status(400, "BadRequest", "not a Binding")
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            return _status(400, "BadRequest", "name in URL does not match name in Binding object")
        pod = self.pods.get((ns, name))
        if pod is None:
            return _not_found("pods", name)
        # The storage layer's UID precondition, mapped by InterpretUpdateError on "pods".
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            return _conflict(
                "pods",
                name,
                "StorageError: invalid object, Code: 4, "
                f"Key: /registry/pods/{ns}/{name}, ResourceVersion: 0, "
                f"AdditionalErrorMsg: Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {pod['metadata']['uid']}",
            )
        # Everything else assignPod refuses becomes a Conflict on "pods/binding".
        if pod["metadata"].get("deletionTimestamp"):
            return _conflict(
                "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if pod["spec"].get("nodeName"):
            return _conflict(
                "pods/binding",
                name,
                f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        if pod["spec"].get("schedulingGates"):
            return _conflict(
                "pods/binding", name, f"pod {name} has non-empty .spec.schedulingGates"
            )
        pod["spec"]["nodeName"] = body["target"]["name"]
        pod["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        self._write("Pod", "MODIFIED", pod)
        self.binds.append((ns, name, body["target"]["name"]))
        if self.outage_after_next_bind:
            self.outage_after_next_bind = False
            self.lose_next_bind_answer = True
            self.outage(True)
        if self.reads_outage_after_next_bind:
            self.reads_outage_after_next_bind = False
            self.lose_next_bind_answer = True
            self.outage(True, reads_only=True)
        if self.lose_next_bind_answer and request.transport is not None:
            self.lose_next_bind_answer = False
            request.transport.close()
        return web.Response(
            status=201,
            body=orjson.dumps(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                }
            ),
            content_type="application/json",
        )

    async def _get_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        name = request.match_info["name"]
        lease = self.leases.get((request.match_info["ns"], name))
        if lease is None:
            return _not_found("leases", name, group="coordination.k8s.io")
        return web.Response(body=orjson.dumps(lease), content_type="application/json")

    async def _create_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        body = await _json(request)
        name = body["metadata"]["name"]
        key = (request.match_info["ns"], name)
        if key in self.leases:
            return _status(
                409,
                "AlreadyExists",
                f'leases.coordination.k8s.io "{name}" already exists',
                name=name,
                group="coordination.k8s.io",
                kind="leases",
            )
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = body
        return web.Response(status=201, body=orjson.dumps(body), content_type="application/json")

    async def _replace_lease(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        body = await _json(request)
        name = request.match_info["name"]
        key = (request.match_info["ns"], name)
        current = self.leases.get(key)
        if current is None:
            return _not_found("leases", name, group="coordination.k8s.io")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _conflict(
                "leases.coordination.k8s.io",
                name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
                group="coordination.k8s.io",
                kind="leases",
            )
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = body
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _event(self, request: web.Request) -> web.Response:
        failed = await self._gate(request)
        if failed is not None:
            return failed
        event = await _json(request)
        meta = event.setdefault("metadata", {})
        if not meta.get("name"):
            self._events_made += 1
            meta["name"] = f"{meta.get('generateName', '')}{self._events_made:x}"
        meta["namespace"] = request.match_info["ns"]
        meta["uid"] = f"event-{self._events_made}"
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.events.append(event)
        return web.Response(status=201, body=orjson.dumps(event), content_type="application/json")


async def _json(request: web.Request) -> Any:
    """The request's JSON body (orjson: aiohttp's own reader is the stdlib's, several times
    slower, and the bench runs this server beside the servers it measures)."""
    return orjson.loads(await request.read())


def _rv_of(entry: tuple[int, str, str, bytes]) -> int:
    return entry[0]


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (written here apart from the embedded cluster's, so each checks the other): an
    object patch merges key by key into an object (anything else counts as {}), null deletes
    its key, any other value (arrays included) replaces what was there. Returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _field_selector(kind: str, text: str) -> Callable[[dict[str, Any]], bool] | web.Response:
    """A fieldSelector ("a=b,c!=d"; "==" is "=") as a predicate, or the real server's 400 for
    a field it cannot select on."""
    terms: list[tuple[Callable[[dict[str, Any]], str], str, bool]] = []
    for term in filter(None, text.split(",")):
        if "!=" in term:
            key, value, equal = *term.split("!=", 1), False
        elif "==" in term:
            key, value, equal = *term.split("==", 1), True
        elif "=" in term:
            key, value, equal = *term.split("=", 1), True
        else:
            return _status(400, "BadRequest", f"invalid field selector: {term!r}")
        getter = _SELECTABLE[kind].get(key)
        if getter is None:
            return _status(400, "BadRequest", f"field label not supported: {key}")
        terms.append((getter, value, equal))
    return lambda obj: all((get(obj) == value) == equal for get, value, equal in terms)


def _resource_of(target: str) -> str:
    """The resource[/subresource] a request path names: /api/v1/nodes/x → "nodes",
    /api/v1/namespaces/ns/pods/p/binding → "pods/binding", /apis/g/v1/... likewise."""
    parts = [p for p in target.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if len(parts) >= 3 and parts[0] == "namespaces":
        parts = parts[2:]
    if not parts:
        return ""
    return f"{parts[0]}/{parts[2]}" if len(parts) >= 3 else parts[0]


def _merge(meta: dict[str, Any], key: str, changes: Mapping[str, str | None] | None) -> None:
    if changes is None:
        return
    merged = dict(meta.get(key) or {})
    for k, v in changes.items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    meta[key] = merged


def _status(
    code: int,
    reason: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    **details: Any,
) -> web.Response:
    return web.Response(
        status=code,
        body=orjson.dumps(status_body(code, reason, message, **details)),
        content_type="application/json",
        headers=headers,
    )


def _not_found(resource: str, name: str, *, group: str = "") -> web.Response:
    # errors.NewNotFound: "<resource>[.<group>] "<name>" not found"
    qualified = f"{resource}.{group}" if group else resource
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return _status(404, "NotFound", f'{qualified} "{name}" not found', **details)


def _conflict(resource: str, name: str, why: str, **details: Any) -> web.Response:
    # errors.NewConflict
    return _status(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        **{"name": name, "kind": resource, **details},
    )


def _injected(code: int) -> web.Response:
    """The real server's answer for `code` (apimachinery errors.New* for each)."""
    if code == 429:
        return _status(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
            headers={"Retry-After": "1"},
            retryAfterSeconds=1,
        )
    if code == 500:
        return _status(
            500,
            "InternalError",
            "Internal error occurred: injected failure",
            causes=[{"message": "injected failure"}],
        )
    if code == 503:
        return _status(
            503, "ServiceUnavailable", "the server is currently unable to handle the request"
        )
    if code == 504:
        return _status(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - "
            "context deadline exceeded",
        )
    if code == 422:
        return _status(
            422,
            "Invalid",
            'Pod "p" is invalid: metadata.annotations: Invalid value: "x": injected',
            name="p",
            kind="Pod",
            causes=[
                {
                    "reason": "FieldValueInvalid",
                    "message": 'Invalid value: "x": injected',
                    "field": "metadata.annotations",
                }
            ],
        )
    reasons = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
    }
    return _status(code, reasons.get(code, ""), f"injected failure {code}")


# -- running it for a test ---------------------------------------------------------------------


def kubeconfig(directory: Path, url: str, *, token: str = TOKEN) -> str:
    """Write a kubeconfig for the server at `url` (token auth, plain HTTP); returns its path."""
    path = directory / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    return str(path)


@dataclass(frozen=True)
class Served:
    """A running fake: its URL and a kubeconfig for it (`mpsched serve --kubeconfig PATH`)."""

    fake: FakeApiServer
    url: str
    kubeconfig: str


@contextlib.asynccontextmanager
async def serving(fake: FakeApiServer, directory: Path) -> AsyncIterator[Served]:
    """Serve `fake` on 127.0.0.1 on a free port, in this event loop, with a kubeconfig for it in
    `directory`; a subprocess started meanwhile (`asyncio.create_subprocess_exec`) can reach it.
    On exit every held request is released and every watch cut, so it stops at once."""
    runner = web.AppRunner(fake.app(), shutdown_timeout=1.0, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield Served(fake, url, kubeconfig(directory, url, token=fake.token))
    finally:
        fake.stop()
        await runner.cleanup()
