"""The Kubernetes API adapter against a fake API server that behaves like the real one: paging,
watches that break or expire, 404 / 409 on bind, slow answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp.test_utils import TestServer

from extender.cluster import ClusterEvent, Conflict, EventStream, NotFound, Unavailable
from extender.kube.api import KubeCluster
from tests.kube.fake_apiserver import FakeApiServer


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, TestServer]]:
    fake = FakeApiServer()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield fake, server
    fake.break_watches()  # the server would otherwise wait out each open watch on close
    await server.close()


def kubeconfig(tmp_path: Path, url: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    return str(path)


async def connect(tmp_path: Path, server: TestServer, **kw: object) -> KubeCluster:
    cluster = await KubeCluster.connect(
        kubeconfig=kubeconfig(tmp_path, str(server.make_url("")).rstrip("/")), context=None
    )
    for name, value in kw.items():
        setattr(cluster, f"_{name}", value)
    return cluster


async def watch_then_list(
    cluster: KubeCluster,
) -> tuple[EventStream, AsyncIterator[ClusterEvent]]:
    """What the service does at start: watch first, then list both kinds (which starts the
    watches from the lists' resourceVersions)."""
    stream = cluster.watch()
    _ = [n async for n in cluster.list_nodes()]
    _ = [p async for p in cluster.list_pods()]
    return stream, aiter(stream)


async def next_events(stream: AsyncIterator[ClusterEvent], n: int) -> list[ClusterEvent]:
    got: list[ClusterEvent] = []
    async with asyncio.timeout(10):
        while len(got) < n:
            got.append(await anext(stream))
    return got


async def test_lists_page_through_and_watch_follows(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    fake.add_node("gpu-1")
    for i in range(1203):
        fake.add_pod("ns", f"p{i}", f"uid-{i}")
    cluster = await connect(tmp_path, server, page_size=500)
    stream = cluster.watch()
    events = aiter(stream)
    nodes = [n async for n in cluster.list_nodes()]
    pods = [p async for p in cluster.list_pods()]
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-1"]
    assert len(pods) == 1203
    assert sum("/api/v1/pods?" in r and "limit=500" in r for r in fake.requests) == 3
    fake.add_pod("ns", "late", "uid-late")
    (event,) = await next_events(events, 1)
    assert (event.type, event.kind, event.obj["metadata"]["uid"]) == ("ADDED", "Pod", "uid-late")
    stream.close()
    await cluster.close()


async def test_a_broken_watch_resumes_without_losing_or_repeating(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    cluster = await connect(tmp_path, server, retry_delay_s=0.05)
    stream, events = await watch_then_list(cluster)
    fake.add_pod("ns", "a", "uid-a")
    assert [e.obj["metadata"]["name"] for e in await next_events(events, 1)] == ["a"]
    async with asyncio.timeout(5):
        await fake.cut_watches_once_open(2)
    fake.add_pod("ns", "b", "uid-b")
    fake.delete_pod("ns", "a")
    got = await next_events(events, 2)
    assert [(e.type, e.obj["metadata"]["name"]) for e in got] == [("ADDED", "b"), ("DELETED", "a")]
    # The resumed watch asked from the last resourceVersion it had seen, not from scratch.
    resumes = [r for r in fake.requests if "watch=true" in r.lower() and "/pods" in r]
    assert len(resumes) >= 2
    rv_of_a = next(rv for rv, _, t, o in fake.log if o["metadata"]["name"] == "a" and t == "ADDED")
    assert f"resourceVersion={rv_of_a}" in resumes[1]
    stream.close()
    await cluster.close()


async def test_expired_resource_version_relists_and_reconciles(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    fake.add_pod("ns", "stays", "uid-stays")
    fake.add_pod("ns", "goes", "uid-goes")
    cluster = await connect(tmp_path, server, retry_delay_s=0.05)
    stream, events = await watch_then_list(cluster)
    # While the watch is down, a pod goes, one comes, and etcd compacts past our version.
    async with asyncio.timeout(5):
        await fake.cut_watches_once_open(2)
    fake.delete_pod("ns", "goes")
    fake.add_pod("ns", "new", "uid-new")
    fake.compact()
    got = await next_events(events, 3)
    seen = {(e.type, e.obj["metadata"]["name"]) for e in got}
    assert ("DELETED", "goes") in seen
    assert ("MODIFIED", "new") in seen
    assert ("MODIFIED", "stays") in seen
    stream.close()
    await cluster.close()


async def test_bind_sets_node_and_annotations_in_one_write(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(tmp_path, server)
    await cluster.bind(
        namespace="ns",
        name="p",
        uid="uid-p",
        node="gpu-1",
        annotations={"mpsched.io/allocation": "{}"},
    )
    pod = await cluster.get_pod("ns", "p")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "gpu-1"
    assert pod["metadata"]["annotations"] == {"mpsched.io/allocation": "{}"}
    with pytest.raises(Conflict) as assigned:
        await cluster.bind(namespace="ns", name="p", uid="uid-p", node="gpu-2", annotations={})
    assert assigned.value.assigned_node == "gpu-1"
    fake.add_pod("ns", "q", "uid-q")
    with pytest.raises(Conflict) as recreated:
        await cluster.bind(namespace="ns", name="q", uid="uid-old", node="gpu-1", annotations={})
    assert recreated.value.assigned_node is None
    with pytest.raises(NotFound):
        await cluster.bind(namespace="ns", name="gone", uid="x", node="gpu-1", annotations={})
    assert await cluster.get_pod("ns", "gone") is None
    await cluster.close()


async def test_events_are_recorded_and_never_raise(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    cluster = await connect(tmp_path, server)
    await cluster.record_event(namespace="ns", name="p", uid="u", reason="Placed", message="m")
    assert fake.events[0]["involvedObject"]["uid"] == "u"
    assert fake.events[0]["type"] == "Normal"
    fake.fail_next = [500]
    await cluster.record_event(
        namespace="ns", name="p", uid="u", reason="R", message="m", warning=True
    )
    assert len(fake.events) == 1
    await cluster.close()


async def test_slow_and_failing_answers(
    api: tuple[FakeApiServer, TestServer], tmp_path: Path
) -> None:
    fake, server = api
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(tmp_path, server)
    fake.delay_s = 0.2
    assert await cluster.get_pod("ns", "p") is not None
    fake.delay_s = 0
    fake.fail_next = [503]
    with pytest.raises(Unavailable):
        await cluster.get_pod("ns", "p")
    await cluster.close()


async def test_unreachable_server_is_unavailable(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "http://127.0.0.1:9")  # discard port: nothing listens
    cluster = await KubeCluster.connect(kubeconfig=path, context=None)
    with pytest.raises(Unavailable):
        _ = [n async for n in cluster.list_nodes()]
    await cluster.close()


async def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="credentials"):
        await KubeCluster.connect(kubeconfig=str(tmp_path / "nope"), context=None)
