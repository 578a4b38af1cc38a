"""What `kubectl mpsched` asks the API server, over one connection with a kubeconfig's
credentials: a pod, the agents' pods by label, and GETs relayed by the API server's proxy
subresources to the extender's Service (`services/{name}:{port}/proxy/{path}`) and to an
agent pod's port (`pods/{name}:{port}/proxy/{path}`), so that the plugin works from a laptop
with no route to the pod network.

Owns telling the API server's own refusals (a `v1.Status`: the typed `ClusterError`s) from
what the proxied server answered (returned as it came, whatever its code), as
`extender.kube.proxy` does for `mpsched status`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, kube_config

from extender.cluster import JsonObject, NoAnswer, error_from_status
from extender.kube.api import KubeCluster
from extender.kube.proxy import ProxiedAnswer, status_of


class PluginApi:
    """The calls the plugin makes, each bounded by `timeout_s`."""

    def __init__(self, cluster: KubeCluster, *, timeout_s: float) -> None:
        self._cluster = cluster
        # The proxied path goes as kubectl sends it, its slashes and the port's colon as they
        # are: the generated client would send `status%2Fwhy%2F...`, which the API server may
        # hand on to the proxied server encoded. Names and namespaces have neither.
        cluster.api_client.configuration.safe_chars_for_path_param = "/:"
        self._core = client.CoreV1Api(cluster.api_client)
        self.timeout_s = timeout_s

    @property
    def description(self) -> str:
        return self._cluster.description

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        return await self._cluster.get_pod(namespace, name)

    async def list_pods(self, namespace: str, selector: str) -> list[Mapping[str, Any]]:
        body = await self._cluster.call(
            f"list pods {selector} in {namespace}",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            timeout_s=self.timeout_s,
        )
        items = body.get("items") if isinstance(body, Mapping) else None
        return [i for i in items or () if isinstance(i, Mapping)]

    async def service_get(
        self, namespace: str, service: str, port: str, path: str
    ) -> ProxiedAnswer:
        method = self._core.connect_get_namespaced_service_proxy_with_path
        return await self._proxied(method, "service", namespace, f"{service}:{port}", path)

    async def pod_get(self, namespace: str, pod: str, port: str, path: str) -> ProxiedAnswer:
        method = self._core.connect_get_namespaced_pod_proxy_with_path
        return await self._proxied(method, "pod", namespace, f"{pod}:{port}", path)

    async def _proxied(
        self, method: Any, kind: str, namespace: str, target: str, path: str
    ) -> ProxiedAnswer:
        where = f"{kind} {namespace}/{target} through {self.description}"
        what = f"GET {path} on {where}"
        try:
            async with asyncio.timeout(self.timeout_s):
                response: Any = await method(
                    target,
                    namespace,
                    path.lstrip("/"),
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                )
                try:
                    code, raw = response.status, await response.read()
                finally:
                    response.release()
        except TimeoutError as exc:
            raise NoAnswer(f"no answer within {self.timeout_s:g} s", what=what) from exc
        except ApiException as exc:
            status = status_of(exc.body or b"")
            raise error_from_status(exc.status or 0, status, what=what) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise NoAnswer(f"{type(exc).__name__}: {exc}", what=what) from exc
        status = status_of(raw)
        if status is not None and not 200 <= code <= 299:
            raise error_from_status(code, status, what=what)
        return ProxiedAnswer(code=code, body=raw, where=where)


def context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    """The namespace the kubeconfig's context names (kubectl's default for `-n`), if any.
    Reads the file: call it off the event loop."""
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError, TypeError, ValueError):
        return None
    chosen = next((c for c in contexts or () if c.get("name") == context), None)
    chosen = chosen if context else active
    if not isinstance(chosen, Mapping):
        return None
    namespace = (chosen.get("context") or {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None


@contextlib.asynccontextmanager
async def connected(
    *, kubeconfig: str | None, context: str | None, timeout_s: float
) -> AsyncIterator[PluginApi]:
    """A `PluginApi` over the kubeconfig's (or the pod's) credentials. Raises `ClusterError`
    (`Unavailable` for credentials that cannot be loaded)."""
    cluster = await KubeCluster.connect(
        kubeconfig=kubeconfig, context=context, request_timeout_s=timeout_s
    )
    try:
        yield PluginApi(cluster, timeout_s=timeout_s)
    finally:
        await cluster.close()
