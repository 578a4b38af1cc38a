"""What the node agent needs from the cluster (`NodeAgentCluster`), the same from the Kubernetes
adapter against the fake API server and from the embedded cluster: a Node's JSON merge patch
(annotations and labels added, changed and removed in one write, the new Node returned, watchers
told, a stale resourceVersion refused), the pods on one node, Events about the Node; and, against
the API, every call bounded in time and typed when the server is down or hangs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extender.cluster import (
    ClusterError,
    ClusterEvent,
    Conflict,
    EventStream,
    Invalid,
    NoAnswer,
    NodeAgentCluster,
    NotFound,
    Synced,
    Unavailable,
)
from extender.cluster.embedded import EmbeddedCluster, merge_patch
from extender.kube.api import KubeCluster
from tests.kube.fake_apiserver import TOKEN, FakeApiServer, Served, serving


@dataclass
class Backend:
    """One implementation under test, with the edge's own view of what it holds."""

    name: str
    cluster: NodeAgentCluster
    follow: Callable[[], EventStream]
    add_node: Callable[..., None]
    add_pod: Callable[[str, str, str | None], None]
    stored_node: Callable[[str], dict[str, Any]]
    node_events: Callable[[str], list[dict[str, Any]]]


def _node(name: str, **meta: Any) -> dict[str, Any]:
    return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, **meta}}


def _pod(namespace: str, name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": spec,
    }


async def connect(served: Served, *, request_timeout_s: float = 4.0) -> KubeCluster:
    return await KubeCluster.connect(
        kubeconfig=served.kubeconfig,
        context=None,
        request_timeout_s=request_timeout_s,
        retry_delay_s=0.05,
    )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(FakeApiServer(), tmp_path) as served:
        yield served


@pytest.fixture(params=["kube", "embedded"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        embedded = EmbeddedCluster()

        def add_node(name: str, **meta: Any) -> None:
            embedded.apply(_node(name, **meta))

        def add_pod(namespace: str, name: str, node: str | None) -> None:
            embedded.apply(_pod(namespace, name, node))

        yield Backend(
            name="embedded",
            cluster=embedded,
            follow=embedded.follow,
            add_node=add_node,
            add_pod=add_pod,
            stored_node=lambda name: embedded.node(name) or {},
            node_events=lambda name: [
                e
                for e in embedded.recorded_events
                if e["involvedObject"] == {"kind": "Node", "name": name, "uid": name}
            ],
        )
        await embedded.close()
        return
    async with serving(FakeApiServer(), tmp_path) as served:
        fake = served.fake
        kube = await connect(served)
        yield Backend(
            name="kube",
            cluster=kube,
            follow=kube.follow,
            add_node=lambda name, **meta: fake.put(_node(name, **meta)),
            add_pod=lambda ns, name, node: fake.put(_pod(ns, name, node)),
            stored_node=lambda name: fake.nodes[name],
            node_events=fake.node_events,
        )
        await kube.close()


async def until_synced(stream: EventStream) -> None:
    async with asyncio.timeout(5):
        async for item in stream:
            if isinstance(item, Synced):
                return
    raise AssertionError("stream ended before Synced")


# -- both implementations ----------------------------------------------------------------------


async def test_a_merge_patch_adds_changes_and_removes_in_one_write(backend: Backend) -> None:
    backend.add_node(
        "gpu-1",
        annotations={"mpsched.io/gpus": "[]", "other.io/keep": "k", "mpsched.io/stale": "s"},
        labels={"mpsched.io/mps-ready": "false", "kubernetes.io/hostname": "gpu-1"},
    )
    before = backend.stored_node("gpu-1")["metadata"]["resourceVersion"]
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": {
                "mpsched.io/gpus": '[{"index":0}]',  # changed
                "mpsched.io/agent": '{"mps":"ready"}',  # added
                "mpsched.io/stale": None,  # removed
            },
            "labels": {"mpsched.io/mps-ready": "true"},
        }
    }
    node = await backend.cluster.patch_node_metadata("gpu-1", patch)
    meta = node["metadata"]
    assert meta["annotations"] == {
        "mpsched.io/gpus": '[{"index":0}]',
        "mpsched.io/agent": '{"mps":"ready"}',
        "other.io/keep": "k",  # what the patch does not name is left alone
    }
    assert meta["labels"] == {"mpsched.io/mps-ready": "true", "kubernetes.io/hostname": "gpu-1"}
    assert int(meta["resourceVersion"]) > int(before)
    # What came back is what is stored, and what a read sees.
    assert backend.stored_node("gpu-1")["metadata"] == meta
    read = await backend.cluster.get_node("gpu-1")
    assert read is not None and read["metadata"] == meta
    assert patch["metadata"]["annotations"]["mpsched.io/stale"] is None  # the caller's, unchanged


async def test_a_merge_patch_creates_missing_maps_and_null_removes_a_whole_map(
    backend: Backend,
) -> None:
    backend.add_node("bare")  # no annotations, no labels at all
    node = await backend.cluster.patch_node_metadata(
        "bare", {"metadata": {"annotations": {"a.io/x": "1"}, "labels": {"a.io/y": "2"}}}
    )
    assert node["metadata"]["annotations"] == {"a.io/x": "1"}
    assert node["metadata"]["labels"] == {"a.io/y": "2"}
    node = await backend.cluster.patch_node_metadata("bare", {"metadata": {"labels": None}})
    assert "labels" not in node["metadata"]
    assert node["metadata"]["annotations"] == {"a.io/x": "1"}
    # A removal of what is not there is no error (RFC 7386).
    node = await backend.cluster.patch_node_metadata(
        "bare", {"metadata": {"annotations": {"a.io/never": None}}}
    )
    assert node["metadata"]["annotations"] == {"a.io/x": "1"}


async def test_an_unknown_node_is_not_found(backend: Backend) -> None:
    with pytest.raises(NotFound) as missing:
        await backend.cluster.patch_node_metadata("nope", {"metadata": {"labels": {"a": "b"}}})
    assert (missing.value.code, missing.value.details.kind, missing.value.details.name) == (
        404,
        "nodes",
        "nope",
    )
    assert await backend.cluster.get_node("nope") is None


async def test_a_resource_version_in_the_patch_is_a_precondition(backend: Backend) -> None:
    backend.add_node("gpu-1")
    current = backend.stored_node("gpu-1")["metadata"]["resourceVersion"]
    stale = str(int(current) - 1)
    with pytest.raises(Conflict) as lost:
        await backend.cluster.patch_node_metadata(
            "gpu-1", {"metadata": {"resourceVersion": stale, "labels": {"a": "1"}}}
        )
    assert lost.value.code == 409 and lost.value.details.kind == "nodes"
    assert "labels" not in backend.stored_node("gpu-1")["metadata"]  # refused, not applied
    node = await backend.cluster.patch_node_metadata(
        "gpu-1", {"metadata": {"resourceVersion": current, "labels": {"a": "1"}}}
    )
    assert node["metadata"]["labels"] == {"a": "1"}
    assert node["metadata"]["resourceVersion"] != current


async def test_watchers_see_the_patch_as_one_modified_node(backend: Backend) -> None:
    backend.add_node("gpu-1", labels={"x": "1"})
    stream = backend.follow()
    await until_synced(stream)
    written = await backend.cluster.patch_node_metadata(
        "gpu-1", {"metadata": {"annotations": {"mpsched.io/gpus": "[]"}}}
    )
    async with asyncio.timeout(5):
        item = await anext(aiter(stream))
    assert isinstance(item, ClusterEvent)
    assert (item.type, item.kind, item.obj["metadata"]["name"]) == ("MODIFIED", "Node", "gpu-1")
    assert item.obj["metadata"] == written["metadata"]
    stream.close()


async def test_list_node_pods_returns_that_nodes_pods_in_every_namespace(
    backend: Backend,
) -> None:
    for node in ("gpu-1", "gpu-2"):
        backend.add_node(node)
    backend.add_pod("ns-a", "on-1", "gpu-1")
    backend.add_pod("ns-b", "also-on-1", "gpu-1")
    backend.add_pod("ns-a", "on-2", "gpu-2")
    backend.add_pod("ns-a", "pending", None)
    pods = await backend.cluster.list_node_pods("gpu-1")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods) == [
        ("ns-a", "on-1"),
        ("ns-b", "also-on-1"),
    ]
    assert await backend.cluster.list_node_pods("gpu-9") == []


async def test_node_events_are_recorded_about_the_node(backend: Backend) -> None:
    await backend.cluster.record_node_event(
        node="gpu-1", reason="MpsDaemonDown", message="control pipe silent", warning=True
    )
    await backend.cluster.record_node_event(node="gpu-1", reason="MpsDaemonReady", message="ok")
    events = backend.node_events("gpu-1")
    assert [(e["reason"], e["type"]) for e in events] == [
        ("MpsDaemonDown", "Warning"),
        ("MpsDaemonReady", "Normal"),
    ]
    assert events[0]["message"] == "control pipe silent"
    # Where `kubectl describe node` finds them: namespace default, uid = the node's name.
    assert {e["metadata"]["namespace"] for e in events} == {"default"}
    assert events[0]["involvedObject"] == {"kind": "Node", "name": "gpu-1", "uid": "gpu-1"}


# -- the Kubernetes adapter only: what goes over the wire, and time bounds ----------------------


def test_both_implementations_are_node_agent_clusters() -> None:
    # Checked by mypy: each assignment is a structural conformance check.
    kube: type[NodeAgentCluster] = KubeCluster
    embedded: type[NodeAgentCluster] = EmbeddedCluster
    assert kube is not embedded


async def test_the_patch_goes_as_a_merge_patch_in_one_request(api: Served) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    cluster = await connect(api)
    await cluster.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    # One request; the fake refuses every other patch type with 415, so arriving is the proof.
    assert fake.requests_of("PATCH", "nodes") == 1
    assert fake.patches == [("gpu-1", {"metadata": {"labels": {"a": "1"}}})]
    assert fake.requests_of("GET", "nodes") == 0  # no read first
    await cluster.close()


async def test_pods_of_a_node_are_selected_by_the_server_and_paged(api: Served) -> None:
    fake = api.fake
    for i in range(5):
        fake.put(_pod("ns", f"p{i}", "gpu-1"))
    for i in range(20):
        fake.put(_pod("ns", f"elsewhere{i}", "gpu-2"))
    cluster = await connect(api)
    cluster._page_size = 2
    pods = await cluster.list_node_pods("gpu-1")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"p{i}" for i in range(5)]
    asked = [r for r in fake.requests if r.startswith("GET /api/v1/pods?")]
    assert len(asked) == 3  # 2 + 2 + 1, never the other node's 20
    assert all("fieldSelector=spec.nodeName%3Dgpu-1" in r for r in asked)
    await cluster.close()


async def test_an_outage_is_unavailable_and_a_refusal_no_answer(api: Served) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    cluster = await connect(api, request_timeout_s=0.5)
    fake.outage(True)
    with pytest.raises(Unavailable) as down:
        await cluster.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert (type(down.value), down.value.code) == (Unavailable, 503)
    with pytest.raises(Unavailable):
        await cluster.list_node_pods("gpu-1")
    fake.outage(True, refuse=True)
    started = time.monotonic()
    with pytest.raises(NoAnswer):
        await cluster.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert time.monotonic() - started < 1.0
    fake.outage(False)
    assert fake.patches == []  # none was applied
    node = await cluster.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert node["metadata"]["labels"] == {"a": "1"}
    await cluster.close()


async def test_a_hung_patch_is_no_answer_within_the_timeout_and_in_doubt(api: Served) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    cluster = await connect(api, request_timeout_s=0.3)
    fake.hang_patches = True
    started = time.monotonic()
    with pytest.raises(NoAnswer) as lost:
        await cluster.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert 0.25 < time.monotonic() - started < 1.0
    assert "0.3 s" in str(lost.value)
    # Released, the server applies it after all: an unanswered write is in doubt.
    fake.hang_patches = False
    for _ in range(200):
        if fake.patches:
            break
        await asyncio.sleep(0.01)
    assert len(fake.patches) == 1
    node = await cluster.get_node("gpu-1")
    assert node is not None and node["metadata"]["labels"] == {"a": "1"}
    # A slow server beyond the timeout is the same for the pod list.
    fake.delay_s = 1.0
    with pytest.raises(NoAnswer):
        await cluster.list_node_pods("gpu-1")
    fake.delay_s = 0
    await cluster.close()


async def test_injected_failures_are_typed(api: Served) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    cluster = await connect(api)
    fake.fail_next = [403, 429, 409]
    patch = {"metadata": {"labels": {"a": "1"}}}
    with pytest.raises(ClusterError) as forbidden:
        await cluster.patch_node_metadata("gpu-1", patch)
    assert forbidden.value.reason == "Forbidden"
    with pytest.raises(Unavailable):
        await cluster.patch_node_metadata("gpu-1", patch)
    with pytest.raises(Conflict):
        await cluster.patch_node_metadata("gpu-1", patch)
    assert fake.patches == []
    await cluster.close()


async def test_node_events_never_raise(api: Served) -> None:
    fake = api.fake
    cluster = await connect(api, request_timeout_s=0.3)
    fake.fail_next = [500]
    await cluster.record_node_event(node="gpu-1", reason="R", message="m")
    fake.delay_s = 2.0
    started = time.monotonic()
    await cluster.record_node_event(node="gpu-1", reason="R", message="m")
    assert time.monotonic() - started < 1.0
    fake.delay_s = 0
    fake.outage(True, refuse=True)
    await cluster.record_node_event(node="gpu-1", reason="R", message="m")
    fake.outage(False)
    assert fake.node_events("gpu-1") == []
    await cluster.record_node_event(node="gpu-1", reason="R", message="x" * 5000)
    (event,) = fake.node_events("gpu-1")
    assert len(event["message"]) == 1024
    assert fake.requests_of("POST", "events") == 4
    assert any(r.startswith("POST /api/v1/namespaces/default/events") for r in fake.requests)
    await cluster.close()


# -- the fake itself answers as the real server does where the adapter cannot reach ------------


async def test_the_fake_refuses_other_patch_types_bodies_and_fields(api: Served) -> None:
    api.fake.add_node("gpu-1")
    url = f"{api.url}/api/v1/nodes/gpu-1"
    async with aiohttp.ClientSession() as anonymous, anonymous.get(f"{api.url}/api/v1/pods") as r:
        assert r.status == 401
        assert (await r.json())["reason"] == "Unauthorized"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        strategic = {"Content-Type": "application/strategic-merge-patch+json"}
        async with http.patch(url, data=b"{}", headers=strategic) as answer:
            assert answer.status == 415
            assert (await answer.json())["reason"] == "UnsupportedMediaType"
        merge = {"Content-Type": "application/merge-patch+json"}
        async with http.patch(url, data=b"[1]", headers=merge) as answer:
            assert answer.status == 422
            assert (await answer.json())["reason"] == "Invalid"
        async with http.patch(url, data=b"{nope", headers=merge) as answer:
            assert answer.status == 400
        async with http.patch(
            url, data=b'{"metadata": {"name": "other"}}', headers=merge
        ) as answer:
            assert answer.status == 400
        selector = {"fieldSelector": "spec.schedulerName=x"}
        async with http.get(f"{api.url}/api/v1/pods", params=selector) as answer:
            assert answer.status == 400
            assert "field label not supported" in (await answer.json())["message"]
        both = {"fieldSelector": "spec.nodeName=gpu-1,status.phase!=Succeeded"}
        async with http.get(f"{api.url}/api/v1/pods", params=both) as answer:
            assert answer.status == 200
    assert api.fake.patches == []
    assert api.fake.requests_of("PATCH", "nodes") == 4
    assert api.fake.requests_of("GET", "pods") == 3


# -- the embedded cluster only -----------------------------------------------------------------


async def test_embedded_refuses_a_patch_that_is_not_an_object() -> None:
    cluster = EmbeddedCluster.from_objects([_node("gpu-1")])
    with pytest.raises(Invalid):
        await cluster.patch_node_metadata("gpu-1", [1])  # type: ignore[arg-type]


def test_merge_patch_is_rfc_7386() -> None:
    # The RFC's own example (Appendix A cases and §3).
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},
              "tags": ["example", "sample"], "content": "This will be unchanged"}  # fmt: skip
    patch = {"title": "Hello!", "phoneNumber": "+01-123-456-7890",
             "author": {"familyName": None}, "tags": ["example"]}  # fmt: skip
    assert merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["example"],
        "content": "This will be unchanged",
        "phoneNumber": "+01-123-456-7890",
    }
    assert target["author"] == {"givenName": "John", "familyName": "Doe"}  # not changed
    assert merge_patch({"a": "b"}, {"a": {"bb": None}}) == {"a": {}}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch(["a", "b"], ["c", "d"]) == ["c", "d"]
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
