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
encoded once with orjson, with the client's own credentials (`update_params_for_auth`, which
refreshes expiring tokens) and TLS settings, on `extender.kube.http11`'s keep-alive connections
(through a proxy, on the client's own aiohttp session and its proxy settings). Per Binding the
generated layers cost as much again as the HTTP exchange itself: a deep copy of the body
(`sanitize_for_serialization`), the standard library's JSON encoder, header sanitising, a
regular expression on the Content-Type and two timeout objects; aiohttp's session costs four
times what the exchange does on its own connections.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import time
import urllib.parse
import urllib.request
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
from extender.kube.http11 import MAX_CONNECTIONS, Http11Client
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
#: Bytes of the HTTP session's read buffer (kubernetes-asyncio's: etcd takes objects of up to
#: 1.5 MiB, and one watch event carries a whole object).
READ_BUFSIZE: Final = 2**21


#: The Content-Type of an RFC 7386 JSON merge patch.
MERGE_PATCH: Final = "application/merge-patch+json"
#: Where Events about cluster-scoped objects (Nodes) are recorded.
NODE_EVENT_NAMESPACE: Final = "default"
#: The generated client's authentication setting for every core call: the kubeconfig's token
#: (or an exec plugin's, refreshed when it expires) as `Authorization: Bearer`; client
#: certificates are on the session's TLS context.
_AUTH: Final = ["BearerToken"]


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


def _plain(value: Any) -> Any:
    """`value` with every Mapping a dict and every list/tuple a list: what the client's JSON
    encoder takes (a read-only mapping from the caller is not a dict)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _quote(segment: str) -> str:
    """A name as one URL path segment, every reserved character escaped (the generated client's
    own quoting of path parameters)."""
    return urllib.parse.quote(segment, safe="")


def _parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None  # a proxy's HTML error page, say: no Status


def _failure(code: int, body: Any, headers: Mapping[str, str], what: str) -> ClusterError:
    """The typed error for a non-2xx answer. The API server's overload filters answer 429 in
    plain text with a Retry-After header rather than a Status: read the header then."""
    if not (isinstance(body, Mapping) and body.get("kind") == "Status"):
        body = {"message": f"HTTP {code}"}
        # Header names match in any case (the write client's are lower-cased).
        retry = next((v for k, v in headers.items() if k.lower() == "retry-after"), "")
        if retry.isdigit():
            body["details"] = {"retryAfterSeconds": int(retry)}
    return error_from_status(code, body, what=what)


def env_proxy(url: str) -> tuple[str, str | None] | None:
    """The proxy the environment names for `url` (HTTP_PROXY / HTTPS_PROXY by the URL's
    scheme, NO_PROXY exempting hosts, as urllib and aiohttp read them), without its user info,
    with the Proxy-Authorization value that user info makes; or None. HTTPS proxies are left
    out, as aiohttp's own lookup leaves them. Run it off the event loop: it reads the
    environment (tens of thousands of service variables in a big cluster)."""
    target = urllib.parse.urlsplit(url)
    host = target.hostname
    if not host or urllib.request.proxy_bypass(host):
        return None
    named = urllib.request.getproxies().get(target.scheme)
    if not named:
        return None
    proxy = urllib.parse.urlsplit(named)
    if proxy.scheme != "http" or not proxy.hostname:
        return None
    where = proxy.hostname + (f":{proxy.port}" if proxy.port else "")
    plain = urllib.parse.urlunsplit(("http", where, proxy.path, "", ""))
    if proxy.username is None:
        return plain, None
    user = urllib.parse.unquote(proxy.username)
    password = urllib.parse.unquote(proxy.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return plain, f"Basic {token}"


def look_up_environment_once(api: client.ApiClient, proxy: tuple[str, str | None] | None) -> None:
    """Make `api`'s HTTP session stop reading the environment on every request.

    kubernetes-asyncio opens its session with `trust_env=True`, and aiohttp then looks up
    ~/.netrc in an executor thread and the proxy variables in another, for every request: two
    thread round trips and a file read per Binding (measured against the fake API server in
    the same process: 1.7 ms a bind with them, 0.37 ms without). The API server's address does
    not change, so its proxy (`env_proxy`, looked up once at connect) is set on the client,
    which passes it on every request, and the session is replaced by one over the same
    connector that does not look again. A proxy named in the kubeconfig (`proxy-url`) wins;
    netrc never held Kubernetes credentials."""
    rest = api.rest_client
    old = rest.pool_manager
    if not old.trust_env:
        return
    if proxy is not None and not rest.proxy:
        rest.proxy, authorization = proxy
        if authorization is not None:
            rest.proxy_headers = {
                **(rest.proxy_headers or {}),
                "Proxy-Authorization": authorization,
            }
    # The same read buffer as kubernetes-asyncio's: watch events of large objects exceed
    # aiohttp's default.
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )
    old.detach()  # closed, its connector now the new session's


def write_client(api: client.ApiClient) -> Http11Client:
    """The client for the adapter's writes to `api`'s server, with the TLS settings the
    generated client's session has: its CA, client certificate, verification switches and
    server name, applied as kubernetes-asyncio's `RESTClientObject` applies them."""
    conf = api.configuration
    host = str(conf.host)
    context: ssl.SSLContext | None = None
    if urllib.parse.urlsplit(host).scheme == "https":
        context = ssl.create_default_context(cafile=conf.ssl_ca_cert)
        if conf.cert_file:
            context.load_cert_chain(conf.cert_file, keyfile=conf.key_file)
        if not conf.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if getattr(conf, "disable_strict_ssl_verification", False):
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return Http11Client(
        host,
        ssl_context=context,
        server_hostname=api.rest_client.server_hostname,
        max_connections=conf.connection_pool_maxsize or MAX_CONNECTIONS,
    )


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
        try:
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
        except ApiException as exc:  # raised before sending: the request could not be built
            self._count(verb, resource, exc.status)
            raise error_from_status(exc.status or 0, _parse(exc.body or b""), what=what) from exc
        return self._answer(what, verb, resource, code, headers, raw)

    @contextlib.contextmanager
    def _unanswered(self, what: str, verb: str, resource: str, limit: float) -> Iterator[None]:
        """A request that got no answer in `limit` seconds, or lost its connection: counted,
        and raised as NoAnswer."""
        try:
            yield
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
        body = _parse(raw)
        if not 200 <= code <= 299:
            raise _failure(code, body, headers, what)
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
        request timeout; see the module docstring for why writes skip the generated client."""
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
        try:
            # The server sends a watch's headers at once; its events may then take minutes.
            async with asyncio.timeout(self.request_timeout_s):
                response = await self._lister(kind)(
                    watch=True,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_timeout_s,
                    _preload_content=False,
                    _request_timeout=limit,
                )
        except ApiException as exc:
            self._count("watch", resource, exc.status)
            raise error_from_status(exc.status or 0, _parse(exc.body or b""), what=what) from exc
        except TimeoutError as exc:
            self._count("watch", resource, None)
            raise NoAnswer(f"no answer within {self.request_timeout_s:g} s", what=what) from exc
        except (aiohttp.ClientError, OSError) as exc:
            self._count("watch", resource, None)
            raise NoAnswer(f"{type(exc).__name__}: {exc}", what=what) from exc
        self._count("watch", resource, response.status)
        if response.status != 200:
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    raw = await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError):
                raw = b""
            finally:
                response.release()
            raise _failure(response.status, _parse(raw), response.headers, what)
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
            f"/api/v1/namespaces/{_quote(namespace)}/pods/{_quote(name)}/binding",
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
            f"/api/v1/nodes/{_quote(name)}",
            _plain(patch),
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
        now = self._timestamp()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "mpsched"},
            "reportingComponent": "mpsched",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._write(
                f"event for {namespace}/{name}",
                "POST",
                f"/api/v1/namespaces/{_quote(namespace)}/events",
                body,
                verb="create",
                resource="events",
            )
        except ClusterError as exc:  # an event is best effort by contract
            log.warning("event %s for %s/%s lost: %s", reason, namespace, name, exc)

    async def record_node_event(
        self,
        *,
        node: str,
        reason: str,
        message: str,
        warning: bool = False,
        component: str = "mpsched-agent",
    ) -> None:
        now = self._timestamp()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            # A Node has no namespace; its events live in "default", as the kubelet's do.
            "metadata": {"generateName": f"{node}.", "namespace": NODE_EVENT_NAMESPACE},
            # uid = the node's name, as the kubelet writes it: `kubectl describe node` searches
            # node events by that uid (kubectl's describe.go), so they show there beside the
            # kubelet's.
            "involvedObject": {"kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": component, "host": node},
            "reportingComponent": component,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._write(
                f"event for node {node}",
                "POST",
                f"/api/v1/namespaces/{NODE_EVENT_NAMESPACE}/events",
                body,
                verb="create",
                resource="events",
            )
        except ClusterError as exc:  # an event is best effort by contract
            log.warning("event %s for node %s lost: %s", reason, node, exc)

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
