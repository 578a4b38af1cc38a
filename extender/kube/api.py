"""The Kubernetes API implementation of `extender.cluster.Cluster`, over kubernetes-asyncio.

Objects are read as raw JSON (`_preload_content=False`): the generated model classes cost far
more than the extender's own decisions at 60,000 pods, and the service reads the API's own
field names anyway. Lists are paged; watches resume from the last resourceVersion seen, and on
410 Gone the stream relists and reconciles (see `extender.kube.watch`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from extender.cluster import (
    ClusterError,
    Conflict,
    EventStream,
    JsonObject,
    NotFound,
    ObjectKind,
    Unavailable,
)
from extender.kube.watch import KindWatch, ListResult, WatchStream

log = logging.getLogger(__name__)

#: Objects per list page: the API server's own default page for kubectl is 500.
PAGE_SIZE = 500
#: How long one watch request may stay open before the server ends it and we resume.
WATCH_TIMEOUT_S = 290


async def _body(response: Any) -> Any:
    try:
        raw = await response.read()
    finally:
        response.release()
    return orjson.loads(raw) if raw else {}


def _error(status: int, body: Any, what: str) -> ClusterError:
    message = body.get("message") if isinstance(body, Mapping) else None
    text = f"{what}: {message or f'HTTP {status}'}"
    if status == 404:
        return NotFound(text)
    if status == 409:
        return Conflict(text, assigned_node=_assigned_node(message))
    if status in (0, 429) or status >= 500:
        return Unavailable(text)
    err = ClusterError(text)
    err.status = status
    return err


def _assigned_node(message: object) -> str | None:
    # The API server says: pod X is already assigned to node "N".
    if isinstance(message, str) and "already assigned to node" in message:
        return message.rsplit("node", 1)[1].strip().strip('"') or None
    return None


class KubeCluster:
    """A `Cluster` over the Kubernetes API. Safe for concurrent use from one event loop."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        description: str,
        page_size: int = PAGE_SIZE,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        retry_delay_s: float = 1.0,
    ) -> None:
        self.description = description
        self._api = api
        #: The authenticated client, for the other API groups (the leader Lease).
        self.api_client = api
        self._core = client.CoreV1Api(api)
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._retry_delay_s = retry_delay_s
        self._watches: dict[ObjectKind, KindWatch] = {}

    @classmethod
    async def connect(cls, *, kubeconfig: str | None, context: str | None) -> KubeCluster:
        """Credentials from `kubeconfig` (or KUBECONFIG / ~/.kube/config), else in-cluster."""
        try:
            if kubeconfig is None and context is None:
                try:
                    config.load_incluster_config()  # type: ignore[no-untyped-call]
                    return cls(client.ApiClient(), description="in-cluster API server")
                except config.ConfigException:
                    pass
            api = await config.new_client_from_config(config_file=kubeconfig, context=context)
        except (config.ConfigException, OSError) as exc:
            raise Unavailable(f"cannot load Kubernetes credentials: {exc}") from exc
        where = f"kubeconfig {kubeconfig or '(default)'}"
        if context:
            where += f", context {context}"
        return cls(api, description=where)

    # -- reading ----------------------------------------------------------------------------

    async def call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Call a generated API method for raw JSON; map failures onto the ClusterError tree."""
        try:
            response = await method(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _error(exc.status or 0, {"message": exc.reason}, what) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(f"{what}: {exc}") from exc
        status = response.status
        try:
            body = await _body(response)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise Unavailable(f"{what}: unreadable answer: {exc}") from exc
        if not 200 <= status <= 299:
            raise _error(status, body, what)
        return body

    def _lister(self, kind: ObjectKind) -> Any:
        """The generated list call for `kind` (with watch=True it is also the watch call)."""
        return self._core.list_node if kind == "Node" else self._core.list_pod_for_all_namespaces

    async def list_kind(self, kind: ObjectKind) -> ListResult:
        """Every object of `kind`, paged, with the list's resourceVersion to watch from."""
        method = self._lister(kind)
        items: list[JsonObject] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            body = await self.call(f"list {kind}s", method, **kwargs)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return ListResult(items, str(meta.get("resourceVersion", "")))

    async def _list_and_remember(self, kind: ObjectKind) -> AsyncIterator[JsonObject]:
        result = await self.list_kind(kind)
        watch = self._watches.get(kind)
        if watch is not None:
            watch.listed(result)
        for item in result.items:
            yield item

    def list_nodes(self) -> AsyncIterator[JsonObject]:
        return self._list_and_remember("Node")

    def list_pods(self) -> AsyncIterator[JsonObject]:
        return self._list_and_remember("Pod")

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        try:
            body = await self.call(
                f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
            )
        except NotFound:
            return None
        return body if isinstance(body, Mapping) else None

    async def open_watch(self, kind: ObjectKind, resource_version: str) -> Any:
        """One watch request from `resource_version`: the raw streaming response."""
        method = self._lister(kind)
        try:
            return await method(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _preload_content=False,
                _request_timeout=self._watch_timeout_s + 30,
            )
        except ApiException as exc:
            raise _error(exc.status or 0, {"message": exc.reason}, f"watch {kind}s") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(f"watch {kind}s: {exc}") from exc

    def watch(self) -> EventStream:
        stream = WatchStream(self, retry_delay_s=self._retry_delay_s)
        self._watches = stream.kinds
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
        # The API answers a v1.Status, not a Binding (the OpenAPI spec is wrong about it), so
        # the raw response is read rather than the generated model.
        await self.call(
            f"bind {namespace}/{name} to {node}",
            self._core.create_namespaced_pod_binding,
            name,
            namespace,
            body,
        )

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
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
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
            await self.call(
                f"event for {namespace}/{name}",
                self._core.create_namespaced_event,
                namespace,
                body,
            )
        except ClusterError as exc:  # an event is best effort by contract
            log.warning("event %s for %s/%s lost: %s", reason, namespace, name, exc)

    async def close(self) -> None:
        for watch in self._watches.values():
            watch.stop()
        await self._api.close()
