"""One GET to a Service's HTTP port through the API server's service proxy
(`/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/{path}`), with a kubeconfig's (or a
pod's) credentials: how `mpsched status --kubeconfig` reaches the extender's `/status` from
outside the cluster, with no port-forward and no route to the pod network.

Owns telling the two kinds of answer apart. A `v1.Status` with an error code is the API server
speaking for itself (no such Service, no ready endpoint, RBAC says no): that is the typed
`extender.cluster.ClusterError` that `error_from_status` builds. Any other answer is the
Service's own and is returned as it came, whatever its code, for the caller to judge. The whole
exchange (credentials, request, body) is bounded by one timeout; no answer in time is `NoAnswer`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from extender.cluster import NoAnswer, error_from_status
from extender.kube.api import KubeCluster
from extender.kube.requests import parse_answer


@dataclass(frozen=True, slots=True)
class ProxiedAnswer:
    """What the Service answered, relayed by the API server: its HTTP status and body."""

    code: int
    body: bytes
    #: Where the answer came from, in words ("service mpsched-system/mpsched:metrics through
    #: kubeconfig ~/.kube/config"), for the caller's messages.
    where: str


def status_of(raw: bytes) -> dict[str, Any] | None:
    """The API server's own v1.Status in `raw`, or None when the body is something else."""
    body = parse_answer(raw)
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


async def get_through_service_proxy(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    service: str,
    port: str,
    path: str,
    timeout_s: float,
) -> ProxiedAnswer:
    """GET `path` on `port` (a port's name or number) of Service `namespace/service` through the
    API server. Raises `ClusterError`: `Unavailable` when the credentials cannot be loaded,
    `NoAnswer` when nothing came back within `timeout_s`, the Status's own type when the API
    server refused (`NotFound`, `Forbidden`, `Unavailable` for a Service with no ready pod)."""
    target = f"{service}:{port}"
    what = f"GET {path} on service {namespace}/{target}"
    try:
        async with asyncio.timeout(timeout_s):
            cluster = await KubeCluster.connect(
                kubeconfig=kubeconfig, context=context, request_timeout_s=timeout_s
            )
            try:
                where = f"service {namespace}/{target} through {cluster.description}"
                code, raw = await _get(cluster, namespace, target, path, timeout_s, what)
            finally:
                await cluster.close()
    except TimeoutError as exc:
        raise NoAnswer(f"no answer within {timeout_s:g} s", what=what) from exc
    status = status_of(raw)
    if status is not None and not 200 <= code <= 299:
        raise error_from_status(code, status, what=what)
    return ProxiedAnswer(code=code, body=raw, where=where)


async def _get(
    cluster: KubeCluster, namespace: str, target: str, path: str, timeout_s: float, what: str
) -> tuple[int, bytes]:
    core = client.CoreV1Api(cluster.api_client)
    try:
        response: Any = await core.connect_get_namespaced_service_proxy_with_path(
            target, namespace, path.lstrip("/"), _preload_content=False, _request_timeout=timeout_s
        )
        try:
            return response.status, await response.read()
        finally:
            response.release()
    except ApiException as exc:  # raised before sending: the request could not be built
        raise error_from_status(exc.status or 0, status_of(exc.body or b""), what=what) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise NoAnswer(f"{type(exc).__name__}: {exc}", what=what) from exc
