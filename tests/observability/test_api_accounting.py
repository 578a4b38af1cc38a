"""KubeCluster counts every request by verb, resource and code: answered, refused, injected
failures, watches; the names are the API server's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.cluster import Forbidden, NoAnswer
from extender.kube.api import KubeCluster
from extender.kube.requests import request_kind
from tests.http.kube_objects import gpu_node
from tests.kube.fake_apiserver import FakeApiServer, serving


class _Api:
    def read_namespaced_pod(self) -> None: ...
    def list_pod_for_all_namespaces(self) -> None: ...
    def create_namespaced_pod_binding(self) -> None: ...
    def replace_namespaced_lease(self) -> None: ...
    def patch_node(self) -> None: ...
    def connect_get_namespaced_pod_exec(self) -> None: ...


def test_request_kinds_are_the_api_servers_verbs_and_resources() -> None:
    api = _Api()
    assert request_kind(api.read_namespaced_pod) == ("get", "pods")
    assert request_kind(api.list_pod_for_all_namespaces) == ("list", "pods")
    assert request_kind(api.create_namespaced_pod_binding) == ("create", "pods/binding")
    assert request_kind(api.replace_namespaced_lease) == ("update", "leases")
    assert request_kind(api.patch_node) == ("patch", "nodes")
    assert request_kind(api.connect_get_namespaced_pod_exec) == ("other", "other")


async def test_requests_are_counted_by_verb_resource_and_code(tmp_path: Path) -> None:
    fake = FakeApiServer()
    fake.put(gpu_node("gpu-a", gpus=1))
    async with serving(fake, tmp_path) as served:
        cluster = await KubeCluster.connect(
            kubeconfig=served.kubeconfig, context=None, request_timeout_s=2.0
        )
        try:
            assert await cluster.get_node("gpu-a") is not None
            assert await cluster.get_node("nope") is None
            fake.fail_next = [403]
            with pytest.raises(Forbidden):
                await cluster.get_node("gpu-a")
            listed = await cluster.list_kind("Pod")
            response = await cluster.open_watch("Pod", listed.resource_version)
            response.release()
            fake.outage(True, refuse=True)
            with pytest.raises(NoAnswer):
                await cluster.get_pod("default", "p")
        finally:
            await cluster.close()
    assert dict(cluster.api_requests) == {
        ("get", "nodes", "200"): 1,
        ("get", "nodes", "404"): 1,
        ("get", "nodes", "403"): 1,
        ("list", "pods", "200"): 1,
        ("watch", "pods", "200"): 1,
        ("get", "pods", "none"): 1,
    }
