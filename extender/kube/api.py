"""The Kubernetes API implementation of `extender.cluster.Cluster` (and of the node agent's
`NodeAgentCluster`), over kubernetes-asyncio.

Owns the adapter's promises: every call is bounded in time (an answer not in by its timeout is
`NoAnswer`, a write then *in doubt*), every failure is the typed error `error_from_status`
builds from the API server's own v1.Status, and closing is bounded too.

Every request is counted in `KubeCluster.api_requests` by verb, resource and HTTP code (as the
API server's own `apiserver_request_total` names them; code "none" when no answer came), for the
extender's `mpsched_api_requests_total`: an RBAC gap shows as 403s on one verb, an overloaded
server as 429s and "none".

Objects are read as raw JSON (`_preload_content=False`): the generated model classes cost far
more than the extender's own decisions at 60,000 pods, and the service reads the API's own
field names anyway. Lists are paged; following is `extender.kube.watch.FollowStream` (list, then
watches that resume, relisting on 410 Gone).

Writes (Bindings, Events, node patches) skip the generated client: `_write` sends the body,
encoded once with orjson, on `extender.kube.session`'s write client (which says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Final

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from extender.cluster import (
    ClusterError,
    JsonObject,
    NoAnswer,
    NotFound,
    ObjectKind,
    Unavailable,
    error_from_status,
)
from extender.kube.http11 import Http11Client
from extender.kube.requests import (
    NO_CODE,
    event_body,
    failure,
    parse_answer,
    plain,
    quote_segment,
    request_kind,
)
from extender.kube.session import env_proxy, look_up_environment_once, write_client
from extender.kube.watch import FollowStream, ListResult

log = logging.getLogger(__name__)

#: Objects per list page: the API server's own default page for kubectl is 500.
PAGE_SIZE: Final = 500
#: How long one watch request may stay open before the server ends it and we resume.
WATCH_TIMEOUT_S: Final = 290
#: Seconds for one call: inside kube-scheduler's extender `httpTimeout` (default 5 s), so that
#: `/bind` can still answer Error, and say so, before the scheduler gives up on it.
REQUEST_TIMEOUT_S: Final = 4.0
#: Seconds for one list page (500 pods, a few MB, from a busy API server).
PAGE_TIMEOUT_S: Final = 30.0
#: Seconds `close()` may take; connections still open then are dropped.
CLOSE_TIMEOUT_S: Final = 1.0


#: The Content-Type of an RFC 7386 JSON merge patch.
MERGE_PATCH: Final = "application/merge-patch+json"
#: Where Events about cluster-scoped objects (Nodes) are recorded.
NODE_EVENT_NAMESPACE: Final = "default"
#: The generated client's authentication setting for every core call: the kubeconfig's token
#: (or an exec plugin's, refreshed when it expires) as `Authorization: Bearer`; client
#: certificates are on the session's TLS context.
_AUTH: Final = ["BearerToken"]


class KubeCluster:
    """A `Cluster` and a `NodeAgentCluster` over the Kubernetes API. Safe for concurrent use
    from one event loop."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        description: str,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        page_timeout_s: float = PAGE_TIMEOUT_S,
        page_size: int = PAGE_SIZE,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        retry_delay_s: float = 1.0,
        writes: Http11Client | None = None,
    ) -> None:
        """`request_timeout_s` bounds every get, bind, patch, event and lease call, and each
        page of a node's pod list (keep it inside kube-scheduler's extender `httpTimeout`, 5 s
        by default, so that `/bind` answers before the scheduler gives up); `page_timeout_s`
        each page of a cluster-wide list; a watch request is bounded by `watch_timeout_s` (the
        server ends it then) plus a margin."""
        self.description = description
        self._api = api
        #: The authenticated client, for the other API groups (the leader Lease).
        self.api_client = api
        self._core = client.CoreV1Api(api)
        self.request_timeout_s = request_timeout_s
        #: aiohttp's own bound on a write, which also makes it drop the connection.
        self._client_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        #: Where writes go unless a proxy is configured (`write_client`; `connect` builds it
        #: off the event loop, as it reads the CA and key files).
        self._writes = writes if writes is not None else write_client(api)
        self._page_timeout_s = page_timeout_s
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._retry_delay_s = retry_delay_s
        self._streams: weakref.WeakSet[FollowStream] = weakref.WeakSet()
        #: Requests made, by (verb, resource, HTTP code or "none"): see the module docstring.
        self.api_requests: Counter[tuple[str, str, str]] = Counter()
        #: The last Event timestamp written, with its second: one bind per pod makes hundreds
        #: of Events a second, and formatting the time was a tenth of an Event's CPU.
        self._stamp: tuple[int, str] = (-1, "")

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: str | None,
        context: str | None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        page_timeout_s: float = PAGE_TIMEOUT_S,
        retry_delay_s: float = 1.0,
    ) -> KubeCluster:
        """Credentials from `kubeconfig` (or KUBECONFIG / ~/.kube/config), else in-cluster.
        The timeouts are `__init__`'s."""
        options: dict[str, Any] = {
            "request_timeout_s": request_timeout_s,
            "page_timeout_s": page_timeout_s,
            "retry_delay_s": retry_delay_s,
        }
        api: client.ApiClient | None = None
        where = f"kubeconfig {kubeconfig or '(default)'}"
        if context:
            where += f", context {context}"
        try:
            if kubeconfig is None and context is None:
                try:
                    config.load_incluster_config()  # type: ignore[no-untyped-call]
                    api, where = client.ApiClient(), "in-cluster API server"
                except config.ConfigException:
                    pass
            if api is None:
                api = await config.new_client_from_config(config_file=kubeconfig, context=context)
        except (config.ConfigException, OSError) as exc:
            raise Unavailable(f"cannot load Kubernetes credentials: {exc}", what="connect") from exc
        proxy = await asyncio.to_thread(env_proxy, str(api.configuration.host))
        look_up_environment_once(api, proxy)
        writes = await asyncio.to_thread(write_client, api)
        return cls(api, description=where, writes=writes, **options)

    # -- reading ----------------------------------------------------------------------------

    async def call(
        self, what: str, method: Any, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> Any:
        """Call a generated API method for raw JSON within `timeout_s` (default: the request
        timeout); failures are the typed errors of `extender.cluster`."""
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        verb, resource = request_kind(method)
        # asyncio's timeout bounds the call and the body's read together; aiohttp's own
        # (`_request_timeout`) makes it drop the connection as well.
        with self._unanswered(what, verb, resource, limit):
            async with asyncio.timeout(limit):
                response = await method(
                    *args, _preload_content=False, _request_timeout=limit, **kwargs
                )
                try:
                    code, headers = response.status, response.headers
                    raw = await response.read()
                finally:
                    response.release()
        return self._answer(what, verb, resource, code, headers, raw)

    @contextlib.contextmanager
    def _unanswered(self, what: str, verb: str, resource: str, limit: float) -> Iterator[None]:
        """A request that got no answer in `limit` seconds, or lost its connection: counted,
        and raised as NoAnswer; one the generated client refused to build, as its typed error."""
        try:
            yield
        except ApiException as exc:  # raised before sending: the request could not be built
            self._count(verb, resource, exc.status)
            raise error_from_status(
                exc.status or 0, parse_answer(exc.body or b""), what=what
            ) from exc
        except TimeoutError as exc:
            self._count(verb, resource, None)
            raise NoAnswer(f"no answer within {limit:g} s", what=what) from exc
        except (aiohttp.ClientError, OSError) as exc:
            self._count(verb, resource, None)
            raise NoAnswer(f"{type(exc).__name__}: {exc}", what=what) from exc

    def _answer(
        self, what: str, verb: str, resource: str, code: int, headers: Any, raw: bytes
    ) -> Any:
        """An HTTP answer, counted: its JSON body, or the typed error it says."""
        self._count(verb, resource, code)
        body = parse_answer(raw)
        if not 200 <= code <= 299:
            raise failure(code, body, headers, what)
        if body is None and raw:
            raise NoAnswer("unreadable answer", what=what, code=code)
        return body if body is not None else {}

    async def _write(
        self,
        what: str,
        method: str,
        path: str,
        body: Mapping[str, Any],
        *,
        verb: str,
        resource: str,
        content_type: str = "application/json",
    ) -> Any:
        """Send `body` to `path` (quoted already) and read the answer as `call` does, within the
        request timeout; `extender.kube.session` says why writes skip the generated client."""
        api = self._api
        rest = api.rest_client
        headers = {**api.default_headers, "Accept": "application/json"}
        headers["Content-Type"] = content_type
        limit = self.request_timeout_s
        with self._unanswered(what, verb, resource, limit):
            async with asyncio.timeout(limit):
                await api.update_params_for_auth(headers, [], _AUTH)
                if not rest.proxy:
                    sent = await self._writes.request(
                        method, path, headers=headers, body=orjson.dumps(body)
                    )
                    return self._answer(what, verb, resource, sent.status, sent.headers, sent.body)
                options: dict[str, Any] = {}
                if rest.server_hostname:
                    options["server_hostname"] = rest.server_hostname
                async with rest.pool_manager.request(
                    method,
                    f"{api.configuration.host}{path}",
                    data=orjson.dumps(body),
                    headers=headers,
                    proxy=rest.proxy,
                    proxy_headers=rest.proxy_headers,
                    timeout=self._client_timeout,
                    **options,
                ) as response:
                    code, answer, raw = response.status, response.headers, await response.read()
        return self._answer(what, verb, resource, code, answer, raw)

    def _count(self, verb: str, resource: str, code: int | None) -> None:
        self.api_requests[(verb, resource, str(code) if code else NO_CODE)] += 1

    def _lister(self, kind: ObjectKind) -> Any:
        """The generated list call for `kind` (with watch=True it is also the watch call)."""
        return self._core.list_node if kind == "Node" else self._core.list_pod_for_all_namespaces

    async def list_kind(self, kind: ObjectKind) -> ListResult:
        """Every object of `kind`, paged (each page within the page timeout), with the list's
        resourceVersion to watch from."""
        return await self._paged(f"list {kind}s", self._lister(kind), self._page_timeout_s)

    async def _paged(self, what: str, method: Any, timeout_s: float, **query: Any) -> ListResult:
        """Every item of a list call, page by page, each page within `timeout_s`."""
        items: list[JsonObject] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, **query}
            if token:
                kwargs["_continue"] = token
            body = await self.call(what, method, timeout_s=timeout_s, **kwargs)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return ListResult(items, str(meta.get("resourceVersion", "")))

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        try:
            body = await self.call(
                f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
            )
        except NotFound:
            return None
        return body if isinstance(body, Mapping) else None

    async def get_node(self, name: str) -> JsonObject | None:
        try:
            body = await self.call(f"get node {name}", self._core.read_node, name)
        except NotFound:
            return None
        return body if isinstance(body, Mapping) else None

    async def list_node_pods(self, node: str) -> list[JsonObject]:
        # A field selector the API server evaluates (spec.nodeName is indexed for the kubelet's
        # own watch), so one node's pods cost one small list, not the cluster's: a node holds
        # at most a few hundred pods (kubelet maxPods, 110 by default), one page, so each page
        # has the request timeout, not the cluster-wide list's.
        listed = await self._paged(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            self.request_timeout_s,
            field_selector=f"spec.nodeName={node}",
        )
        return listed.items

    async def open_watch(self, kind: ObjectKind, resource_version: str) -> Any:
        """One watch request from `resource_version`: the raw streaming response, answered 200.
        The server ends it after `watch_timeout_s`; the client gives it a margin more."""
        what = f"watch {kind}s"
        resource = f"{kind.lower()}s"
        limit = self._watch_timeout_s + 30
        # The server sends a watch's headers at once; its events may then take minutes.
        with self._unanswered(what, "watch", resource, self.request_timeout_s):
            async with asyncio.timeout(self.request_timeout_s):
                response = await self._lister(kind)(
                    watch=True,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_timeout_s,
                    _preload_content=False,
                    _request_timeout=limit,
                )
        self._count("watch", resource, response.status)
        if response.status != 200:
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    raw = await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError):
                raw = b""
            finally:
                response.release()
            raise failure(response.status, parse_answer(raw), response.headers, what)
        return response

    def follow(self) -> FollowStream:
        stream = FollowStream(self, retry_delay_s=self._retry_delay_s)
        self._streams.add(stream)
        return stream

    # -- writing ----------------------------------------------------------------------------

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,  # precondition: a recreated pod of the same name is not bound
                "annotations": dict(annotations),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        # The API answers a v1.Status, not a Binding (the OpenAPI spec is wrong about it).
        await self._write(
            f"bind {namespace}/{name} to {node}",
            "POST",
            f"/api/v1/namespaces/{quote_segment(namespace)}/pods/{quote_segment(name)}/binding",
            body,
            verb="create",
            resource="pods/binding",
        )

    async def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> JsonObject:
        # The generated client sends a dict as a *strategic* merge patch unless told otherwise;
        # the agent's patch is a plain RFC 7386 merge patch, which means the same on every
        # server and in the embedded cluster.
        body = await self._write(
            f"patch node {name}",
            "PATCH",
            f"/api/v1/nodes/{quote_segment(name)}",
            plain(patch),
            verb="patch",
            resource="nodes",
            content_type=MERGE_PATCH,
        )
        if not isinstance(body, Mapping) or not body.get("metadata"):
            raise NoAnswer("the patch was answered without the node", what=f"patch node {name}")
        return body

    def _timestamp(self) -> str:
        """Now, as an Event's firstTimestamp (RFC 3339 in UTC, whole seconds)."""
        second = int(time.time())
        if second != self._stamp[0]:
            self._stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
        return self._stamp[1]

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
        involved = {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        body = event_body(
            namespace,
            involved,
            {"component": "mpsched"},
            self._timestamp(),
            reason=reason,
            message=message,
            warning=warning,
        )
        await self._create_event(f"{namespace}/{name}", namespace, body)

    async def record_node_event(
        self,
        *,
        node: str,
        reason: str,
        message: str,
        warning: bool = False,
        component: str = "mpsched-agent",
    ) -> None:
        # uid = the node's name, as the kubelet writes it: `kubectl describe node` searches
        # node events by that uid (kubectl's describe.go), so they show there beside the
        # kubelet's. A Node has no namespace; its events live in "default", as the kubelet's do.
        body = event_body(
            NODE_EVENT_NAMESPACE,
            {"kind": "Node", "name": node, "uid": node},
            {"component": component, "host": node},
            self._timestamp(),
            reason=reason,
            message=message,
            warning=warning,
        )
        await self._create_event(f"node {node}", NODE_EVENT_NAMESPACE, body)

    async def _create_event(self, about: str, namespace: str, body: Mapping[str, Any]) -> None:
        try:
            await self._write(
                f"event for {about}",
                "POST",
                f"/api/v1/namespaces/{quote_segment(namespace)}/events",
                body,
                verb="create",
                resource="events",
            )
        except ClusterError as exc:  # an event is best effort by contract
            log.warning("event %s for %s lost: %s", body["reason"], about, exc)

    async def close(self) -> None:
        streams = list(self._streams)
        for stream in streams:
            stream.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                for stream in streams:
                    await stream.wait_closed()
                await self._writes.close()
                await self._api.close()
        except TimeoutError:
            log.warning("closing the API client took over %.1f s; dropped", CLOSE_TIMEOUT_S)
