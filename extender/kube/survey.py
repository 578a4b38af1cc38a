"""What `mpsched preflight` reads from a cluster, in one pass: the API server's version, the
nodes and pods, the namespaces' labels, the agent's DaemonSet, the extender's Deployment, the
webhook configurations, the webhook Service's EndpointSlices and TLS Secret, and the RuntimeClass
`nvidia`.

Owns the reading only: every object comes back as the API's raw JSON, an object that does not
exist as None, and a read the cluster refused (RBAC, an outage) as its one-line reason in
`Survey.errors`, so that the checks (`extender.commands.preflight_checks`) decide from data and
one unreadable object costs one check, not the run. Every call is bounded by the adapter's
request timeout, lists by its page timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from extender.cluster import ClusterError, JsonObject, NotFound
from extender.kube.api import KubeCluster
from extender.kube.watch import ListResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Names:
    """Where an install of mpsched lives (the names deploy/ gives its objects)."""

    namespace: str = "mpsched-system"
    agent_namespace: str = "mpsched-node"
    agent: str = "mpsched-agent"
    extender: str = "mpsched"
    webhook_configuration: str = "mpsched"
    webhook_service: str = "mpsched-webhook"
    webhook_secret: str = "mpsched-webhook-tls"
    #: Every TLS Secret whose certificates expire: the webhook's, the extender's
    #: (cluster-scheduler), kube-scheduler's client certificate (cert-manager, cluster-scheduler).
    secrets: tuple[str, ...] = ("mpsched-webhook-tls", "mpsched-tls", "mpsched-scheduler-client")
    runtime_class: str = "nvidia"


@dataclass(frozen=True, slots=True, kw_only=True)
class Survey:
    """One read of the cluster. An object is None where it does not exist (or could not be
    read: then `errors` holds why, under the field's name)."""

    names: Names
    #: The API server's /version answer ({"major", "minor", "gitVersion", ...}).
    version: JsonObject | None
    nodes: tuple[JsonObject, ...]
    pods: tuple[JsonObject, ...]
    namespaces: tuple[JsonObject, ...]
    agent_daemonset: JsonObject | None
    extender_deployment: JsonObject | None
    mutating_webhook: JsonObject | None
    validating_webhook: JsonObject | None
    #: The webhook Service's EndpointSlices (label kubernetes.io/service-name).
    webhook_endpoint_slices: tuple[JsonObject, ...]
    #: The TLS Secrets of `Names.secrets` that exist, by name.
    secrets: dict[str, JsonObject]
    runtime_class: JsonObject | None
    errors: dict[str, str] = field(default_factory=dict)


async def survey(cluster: KubeCluster, names: Names = Names()) -> Survey:
    """Read everything the preflight checks need, the independent reads concurrently."""
    api = cluster.api_client
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    errors: dict[str, str] = {}

    async def one(key: str, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await cluster.call(what, method, *args, **kwargs)
        except NotFound:
            return None
        except ClusterError as exc:
            errors[key] = exc.message
            return None

    async def items(key: str, read: Awaitable[Any]) -> tuple[JsonObject, ...]:
        try:
            found = await read
        except ClusterError as exc:
            errors[key] = exc.message
            return ()
        listed = found.items if isinstance(found, ListResult) else found.get("items")
        return tuple(listed or ())

    slices_selector = f"kubernetes.io/service-name={names.webhook_service}"
    results = await asyncio.gather(
        one("version", "get /version", client.VersionApi(api).get_code),
        items("nodes", cluster.list_kind("Node")),
        items("pods", cluster.list_kind("Pod")),
        items("namespaces", cluster.call("list namespaces", core.list_namespace)),
        one(
            "agent_daemonset",
            f"get daemonset {names.agent_namespace}/{names.agent}",
            apps.read_namespaced_daemon_set,
            names.agent,
            names.agent_namespace,
        ),
        one(
            "extender_deployment",
            f"get deployment {names.namespace}/{names.extender}",
            apps.read_namespaced_deployment,
            names.extender,
            names.namespace,
        ),
        one(
            "mutating_webhook",
            f"get mutatingwebhookconfiguration {names.webhook_configuration}",
            admission.read_mutating_webhook_configuration,
            names.webhook_configuration,
        ),
        one(
            "validating_webhook",
            f"get validatingwebhookconfiguration {names.webhook_configuration}",
            admission.read_validating_webhook_configuration,
            names.webhook_configuration,
        ),
        items(
            "webhook_endpoint_slices",
            cluster.call(
                f"list endpointslices of {names.namespace}/{names.webhook_service}",
                client.DiscoveryV1Api(api).list_namespaced_endpoint_slice,
                names.namespace,
                label_selector=slices_selector,
            ),
        ),
        asyncio.gather(
            *(
                one(
                    f"secret {secret}",
                    f"get secret {names.namespace}/{secret}",
                    core.read_namespaced_secret,
                    secret,
                    names.namespace,
                )
                for secret in names.secrets
            )
        ),
        one(
            "runtime_class",
            f"get runtimeclass {names.runtime_class}",
            client.NodeV1Api(api).read_runtime_class,
            names.runtime_class,
        ),
    )
    (version, nodes, pods, namespaces, daemonset, deployment, mutating, validating, slices) = (
        results[:9]
    )
    secrets, runtime_class = results[9:]
    return Survey(
        names=names,
        version=version,
        nodes=nodes,
        pods=pods,
        namespaces=namespaces,
        agent_daemonset=daemonset,
        extender_deployment=deployment,
        mutating_webhook=mutating,
        validating_webhook=validating,
        webhook_endpoint_slices=slices,
        secrets={n: s for n, s in zip(names.secrets, secrets, strict=True) if s is not None},
        runtime_class=runtime_class,
        errors=errors,
    )


async def read_cluster(
    *, kubeconfig: str | None, context: str | None, request_timeout_s: float, names: Names = Names()
) -> Survey:
    """Connect (a kubeconfig, else in-cluster credentials), survey, close. Raises
    `extender.cluster.Unavailable` when the credentials cannot be loaded."""
    cluster = await KubeCluster.connect(
        kubeconfig=kubeconfig, context=context, request_timeout_s=request_timeout_s
    )
    try:
        return await survey(cluster, names)
    finally:
        await cluster.close()
