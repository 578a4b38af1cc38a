"""The Kubernetes API adapter (DESIGN §9): the only package that may import kubernetes_asyncio.

Not implemented yet. It will provide a `Cluster` (see `extender.cluster`) over a kubeconfig or
in-cluster credentials: paged lists and watches of Nodes and Pods, the Binding subresource with
a UID precondition and the allocation annotations, Events, and the leader Lease. Until then
`connect` says so plainly, and `mpsched serve` runs on an embedded cluster (`--cluster-file`).
"""

from __future__ import annotations

import os
from pathlib import Path

from extender.cluster import Cluster


class NotImplementedYet(RuntimeError):
    """The Kubernetes API adapter does not exist yet."""


def credentials_available(kubeconfig: str | None) -> bool:
    """Whether any way to reach a real cluster is configured: an explicit kubeconfig, the
    KUBECONFIG variable, ~/.kube/config, or a pod's in-cluster service account."""
    if kubeconfig:
        return True
    if os.environ.get("KUBECONFIG"):
        return True
    if (
        os.environ.get("KUBERNETES_SERVICE_HOST")
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    ):
        return True
    return (Path.home() / ".kube" / "config").exists()


def connect(*, kubeconfig: str | None, context: str | None) -> Cluster:
    """A Cluster over the Kubernetes API. Not implemented yet: always raises."""
    raise NotImplementedYet(
        "talking to the Kubernetes API is not implemented yet; run with --cluster-file PATH "
        "(a 'kubectl get nodes,pods -A -o json' dump) for an embedded cluster"
    )
