"""The Kubernetes API adapter (docs/design.md, Architecture): the only package that may import
kubernetes_asyncio.

`connect` returns a `Cluster` (see `extender.cluster`) over a kubeconfig or in-cluster
credentials (`extender.kube.api.KubeCluster`: every call bounded in time, typed errors from the
API's Status, following by list-then-watch, the Binding subresource with a UID precondition and
the allocation annotations, Events); `leader_elector` its `Leadership` on a Lease. The adapter is
imported on first use, so commands that never talk to a cluster do not pay for
kubernetes_asyncio.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from extender.cluster import Cluster

if TYPE_CHECKING:
    from extender.kube.lease import LeaderElector, LeaseSettings


def credentials_available(kubeconfig: str | None) -> bool:
    """Whether any way to reach a real cluster is configured: an explicit kubeconfig, the
    KUBECONFIG variable, ~/.kube/config, or a pod's in-cluster service account."""
    if kubeconfig or os.environ.get("KUBECONFIG"):
        return True
    if (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    ):
        return True
    return (Path.home() / ".kube" / "config").exists()


async def connect(
    *, kubeconfig: str | None, context: str | None, request_timeout_s: float = 4.0
) -> Cluster:
    """A Cluster over the Kubernetes API, every call bounded by `request_timeout_s` (keep it
    inside kube-scheduler's extender `httpTimeout`, 5 s by default, so that `/bind` can answer
    Error before the scheduler gives up). Raises `extender.cluster.Unavailable` when the
    credentials cannot be loaded."""
    # Imported here, not at the top: commands that never reach a cluster do not load
    # kubernetes_asyncio.
    from extender.kube.api import KubeCluster

    return await KubeCluster.connect(
        kubeconfig=kubeconfig, context=context, request_timeout_s=request_timeout_s
    )


def leader_elector(cluster: Cluster, settings: LeaseSettings, *, identity: str) -> LeaderElector:
    """The Lease campaign (an `extender.cluster.Leadership`) for a cluster from `connect`."""
    from extender.kube.api import KubeCluster
    from extender.kube.lease import LeaderElector

    if not isinstance(cluster, KubeCluster):
        raise TypeError("leader election needs a cluster from extender.kube.connect")
    return LeaderElector(cluster, settings, identity=identity)
