"""The Kubernetes API adapter against a fake API server that behaves like the real one: following
(list, Synced, watch; resume, relist on 410, retry through an outage), the Binding's answers as
typed errors, and every call bounded in time (a bind left unanswered is `NoAnswer`, in doubt)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.cluster import (
    AlreadyExists,
    BadRequest,
    ClusterError,
    ClusterEvent,
    Conflict,
    EventStream,
    FollowItem,
    Forbidden,
    Gone,
    Invalid,
    NoAnswer,
    NotFound,
    Synced,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from extender.kube.api import KubeCluster
from extender.kube.session import env_proxy
from tests.kube.fake_apiserver import FakeApiServer, Served, kubeconfig, serving


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(FakeApiServer(), tmp_path) as served:
        yield served


async def connect(
    served: Served, *, request_timeout_s: float = 4.0, page_size: int = 500
) -> KubeCluster:
    cluster = await KubeCluster.connect(
        kubeconfig=served.kubeconfig,
        context=None,
        request_timeout_s=request_timeout_s,
        retry_delay_s=0.05,
    )
    cluster._page_size = page_size
    return cluster


async def take(stream: EventStream, n: int) -> list[FollowItem]:
    got: list[FollowItem] = []
    async with asyncio.timeout(10):
        async for item in stream:
            got.append(item)
            if len(got) == n:
                break
    return got


async def until_synced(stream: EventStream) -> list[ClusterEvent]:
    listed: list[ClusterEvent] = []
    async with asyncio.timeout(10):
        async for item in stream:
            if isinstance(item, Synced):
                return listed
            listed.append(item)
    raise AssertionError("stream ended before Synced")


def names(items: list[FollowItem]) -> list[tuple[str, str]]:
    return [
        (i.type, i.obj["metadata"]["name"]) if isinstance(i, ClusterEvent) else ("SYNCED", "")
        for i in items
    ]


async def bind(cluster: KubeCluster, name: str, uid: str, node: str = "gpu-1") -> None:
    await cluster.bind(namespace="ns", name=name, uid=uid, node=node, annotations={"a.io/x": "1"})


# -- following ---------------------------------------------------------------------------------


async def test_follow_lists_nodes_then_pods_then_synced_then_changes(api: Served) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    for i in range(1203):
        fake.add_pod("ns", f"p{i}", f"uid-{i}")
    cluster = await connect(api, page_size=500)
    stream = cluster.follow()
    listed = await until_synced(stream)
    assert listed[0].kind == "Node" and listed[0].obj["metadata"]["name"] == "gpu-1"
    assert [e.kind for e in listed[1:]] == ["Pod"] * 1203
    assert {e.type for e in listed} == {"ADDED"}
    assert sum("/api/v1/pods?" in r and "limit=500" in r for r in fake.requests) == 3
    fake.add_pod("ns", "late", "uid-late")
    fake.update_node("gpu-1", labels={"x": "1"})
    got = await take(stream, 2)
    assert sorted(names(got)) == [("ADDED", "late"), ("MODIFIED", "gpu-1")]
    assert stream.restarts == 0
    stream.close()
    assert [i async for i in stream] == []  # a closed stream ends, and stays ended
    await cluster.close()


async def test_a_broken_watch_resumes_without_losing_or_repeating(api: Served) -> None:
    fake = api.fake
    cluster = await connect(api)
    stream = cluster.follow()
    await until_synced(stream)
    fake.add_pod("ns", "a", "uid-a")
    assert names(await take(stream, 1)) == [("ADDED", "a")]
    async with asyncio.timeout(5):
        await fake.cut_watches_once_open(2)
    fake.add_pod("ns", "b", "uid-b")
    fake.delete_pod("ns", "a")
    assert names(await take(stream, 2)) == [("ADDED", "b"), ("DELETED", "a")]
    # The resumed watch asked from the last resourceVersion it had seen, not from scratch.
    resumes = [r for r in fake.requests if "watch=true" in r.lower() and "/pods" in r]
    assert len(resumes) >= 2
    rv_of_a = next(
        rv
        for rv, _, t, e in fake.log
        if orjson.loads(e)["object"]["metadata"]["name"] == "a" and t == "ADDED"
    )
    assert f"resourceVersion={rv_of_a}" in resumes[1]
    assert stream.restarts >= 1
    stream.close()
    await cluster.close()


async def test_expired_resource_version_relists_and_turns_the_difference_into_events(
    api: Served,
) -> None:
    fake = api.fake
    fake.add_pod("ns", "stays", "uid-stays")
    fake.add_pod("ns", "changes", "uid-changes")
    fake.add_pod("ns", "goes", "uid-goes")
    cluster = await connect(api)
    stream = cluster.follow()
    await until_synced(stream)
    # While the watch is down, a pod goes, one comes, one changes, and etcd compacts. The
    # outage cuts the watch from the server's side: wait until the stream saw it, or the
    # changes could still reach the old watch before it notices.
    fake.outage(True)
    async with asyncio.timeout(10):
        while True:
            if stream.restarts >= 1:
                break
            await asyncio.sleep(0.01)
    fake.delete_pod("ns", "goes")
    fake.add_pod("ns", "new", "uid-new")
    fake.update_pod("ns", "changes", phase="Running")
    fake.compact()
    fake.outage(False)
    got = await take(stream, 3)
    assert sorted(names(got)) == [("ADDED", "new"), ("DELETED", "goes"), ("MODIFIED", "changes")]
    assert stream.restarts >= 2  # the cut watch, and the relist
    fake.add_pod("ns", "after", "uid-after")  # and it follows on from the relist
    assert names(await take(stream, 1)) == [("ADDED", "after")]
    stream.close()
    await cluster.close()


async def test_an_outage_before_the_first_list_is_retried_behind_the_stream(
    api: Served,
) -> None:
    fake = api.fake
    fake.add_node("gpu-1")
    fake.outage(True)
    cluster = await connect(api)
    stream = cluster.follow()
    items = aiter(stream)
    pending = asyncio.ensure_future(anext(items))
    await asyncio.sleep(0.3)
    assert not pending.done()  # nothing, and no exception, while the API is down
    assert stream.restarts >= 2
    fake.outage(False)
    first = await asyncio.wait_for(pending, 5)
    assert isinstance(first, ClusterEvent) and first.obj["metadata"]["name"] == "gpu-1"
    assert isinstance(await anext(items), Synced)
    stream.close()
    await cluster.close()


async def test_malformed_objects_are_not_handed_on(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "no-uid", "")
    fake.add_pod("ns", "good", "uid-good")
    cluster = await connect(api)
    stream = cluster.follow()
    assert [e.obj["metadata"]["name"] for e in await until_synced(stream)] == ["good"]
    fake.add_pod("ns", "late-no-uid", "")
    fake.add_pod("ns", "late", "uid-late")
    assert names(await take(stream, 1)) == [("ADDED", "late")]
    stream.close()
    await cluster.close()


async def test_direct_writes_are_real_writes(api: Served) -> None:
    fake = api.fake
    fake.add_node("n", annotations={"keep": "1", "drop": "2"})
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    stream = cluster.follow()
    await until_synced(stream)
    fake.update_node("n", annotations={"drop": None, "new": "3"}, labels={"l": "v"})
    fake.update_pod("ns", "p", annotations={"a": "b"}, phase="Succeeded")
    fake.delete_node("n")
    got = [e for e in await take(stream, 3) if isinstance(e, ClusterEvent)]
    # In order within a kind (each kind has its own watch).
    assert [(e.type, e.kind) for e in got if e.kind == "Node"] == [
        ("MODIFIED", "Node"),
        ("DELETED", "Node"),
    ]
    node = next(e.obj for e in got if e.kind == "Node")
    pod_ = next(e.obj for e in got if e.kind == "Pod")
    assert node["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert node["metadata"]["labels"] == {"l": "v"}
    assert pod_["metadata"]["annotations"] == {"a": "b"}
    assert pod_["status"]["phase"] == "Succeeded"
    versions = [int(e.obj["metadata"]["resourceVersion"]) for e in got]
    assert len(set(versions)) == 3
    assert await cluster.get_node("n") is None
    stream.close()
    await cluster.close()


# -- bind and the typed errors -----------------------------------------------------------------


async def test_bind_sets_node_and_annotations_and_refusals_are_typed(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    await bind(cluster, "p", "uid-p")
    pod = await cluster.get_pod("ns", "p")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "gpu-1"
    assert pod["metadata"]["annotations"] == {"a.io/x": "1"}
    with pytest.raises(Conflict) as assigned:
        await bind(cluster, "p", "uid-p", node="gpu-2")
    err = assigned.value
    assert (err.code, err.reason) == (409, "Conflict")
    assert (err.details.name, err.details.kind) == ("p", "pods/binding")
    assert not hasattr(err, "assigned_node")  # the binder reads the pod back instead
    fake.add_pod("ns", "q", "uid-q")
    with pytest.raises(Conflict) as recreated:
        await bind(cluster, "q", "uid-old")
    assert (recreated.value.details.kind, recreated.value.code) == ("pods", 409)
    assert "Precondition failed: UID" in recreated.value.message
    with pytest.raises(NotFound) as gone:
        await bind(cluster, "gone", "x")
    assert (gone.value.details.name, gone.value.details.kind) == ("gone", "pods")
    assert await cluster.get_pod("ns", "gone") is None
    assert fake.binds == [("ns", "p", "gpu-1")]
    await cluster.close()


@pytest.mark.parametrize(
    ("code", "cls", "reason"),
    [
        (400, BadRequest, "BadRequest"),
        (401, Unauthorized, "Unauthorized"),
        (403, Forbidden, "Forbidden"),
        (404, NotFound, "NotFound"),
        (409, Conflict, "Conflict"),
        (410, Gone, "Expired"),
        (422, Invalid, "Invalid"),
        (429, TooManyRequests, "TooManyRequests"),
        (500, Unavailable, "InternalError"),
        (503, Unavailable, "ServiceUnavailable"),
        (504, Unavailable, "Timeout"),
    ],
)
async def test_injected_failures_are_the_real_status_and_the_right_class(
    api: Served, code: int, cls: type[ClusterError], reason: str
) -> None:
    api.fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    api.fake.fail_next = [code]
    with pytest.raises(cls) as failed:
        await bind(cluster, "p", "uid-p")
    assert type(failed.value) is cls
    assert (failed.value.code, failed.value.reason) == (code, reason)
    if code == 429:
        assert isinstance(failed.value, TooManyRequests)
        assert failed.value.retry_after_s == 1.0
    if code == 422:
        assert [c.field for c in failed.value.details.causes] == ["metadata.annotations"]
    assert api.fake.binds == []  # refused before it was applied
    await cluster.close()


async def test_a_bind_never_answered_is_no_answer_within_the_timeout(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api, request_timeout_s=0.3)
    fake.hang_binds = True
    started = time.monotonic()
    with pytest.raises(NoAnswer) as lost:
        await bind(cluster, "p", "uid-p")
    assert 0.25 < time.monotonic() - started < 1.5
    assert isinstance(lost.value, Unavailable)  # in doubt
    assert fake.binds == []
    # Released, the server applies it after all: why an unanswered bind is in doubt.
    fake.hang_binds = False
    for _ in range(100):
        if fake.binds:
            break
        await asyncio.sleep(0.01)
    assert fake.binds == [("ns", "p", "gpu-1")]
    pod = await cluster.get_pod("ns", "p")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    await cluster.close()


async def test_bind_delay_is_applied_then_answered(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    fake.add_pod("ns", "q", "uid-q")
    cluster = await connect(api, request_timeout_s=0.5)
    fake.bind_delay_s = 0.2
    started = time.monotonic()
    await bind(cluster, "p", "uid-p")
    assert time.monotonic() - started >= 0.2
    fake.bind_delay_s = 1.0  # longer than the timeout: no answer, applied later
    with pytest.raises(NoAnswer):
        await bind(cluster, "q", "uid-q")
    assert fake.binds == [("ns", "p", "gpu-1")]
    await asyncio.sleep(0.7)
    assert fake.binds[-1] == ("ns", "q", "gpu-1")
    await cluster.close()


async def test_a_lost_bind_answer_is_no_answer_but_applied(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    fake.lose_next_bind_answer = True
    with pytest.raises(NoAnswer):
        await bind(cluster, "p", "uid-p")
    pod = await cluster.get_pod("ns", "p")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    await cluster.close()


async def test_outage_answers_503_or_refuses_and_cuts_watches(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    stream = cluster.follow()
    await until_synced(stream)
    await asyncio.wait_for(fake.watches_open(2), 5)
    before = stream.restarts
    fake.outage(True)
    with pytest.raises(Unavailable) as down:
        await cluster.get_pod("ns", "p")
    assert (type(down.value), down.value.code, down.value.reason) == (
        Unavailable,
        503,
        "ServiceUnavailable",
    )
    fake.outage(True, refuse=True)
    with pytest.raises(NoAnswer):
        await cluster.get_pod("ns", "p")
    await asyncio.sleep(0.3)
    assert stream.restarts > before  # the cut watches retry, and fail, behind the stream
    fake.outage(False)
    fake.update_pod("ns", "p", phase="Running")
    assert names(await take(stream, 1)) == [("MODIFIED", "p")]
    stream.close()
    await cluster.close()


async def test_outage_after_a_bind_loses_its_answer_and_the_watch_delivers_it_once(
    api: Served,
) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api)
    stream = cluster.follow()
    await until_synced(stream)
    fake.outage_after_next_bind = True
    with pytest.raises(NoAnswer):
        await bind(cluster, "p", "uid-p")
    with pytest.raises(Unavailable):  # the read back fails too, for now
        await cluster.get_pod("ns", "p")
    fake.outage(False)
    fake.add_pod("ns", "marker", "uid-marker")
    got = await take(stream, 2)
    assert names(got) == [("MODIFIED", "p"), ("ADDED", "marker")]  # once, then on
    pod = await cluster.get_pod("ns", "p")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    stream.close()
    await cluster.close()


# -- time bounds, events, credentials ----------------------------------------------------------


async def test_slow_answers_within_the_timeout_succeed_and_beyond_it_are_no_answer(
    api: Served,
) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api, request_timeout_s=0.5)
    fake.delay_s = 0.2
    assert await cluster.get_pod("ns", "p") is not None
    fake.delay_s = 2.0
    started = time.monotonic()
    with pytest.raises(NoAnswer, match=r"no answer within 0\.5 s"):
        await cluster.get_pod("ns", "p")
    assert time.monotonic() - started < 1.5
    fake.delay_s = 0
    await cluster.close()


async def test_close_is_bounded_while_a_request_hangs(api: Served) -> None:
    fake = api.fake
    fake.add_pod("ns", "p", "uid-p")
    cluster = await connect(api, request_timeout_s=60.0)
    stream = cluster.follow()
    await until_synced(stream)
    fake.hang_binds = True
    pending = asyncio.ensure_future(bind(cluster, "p", "uid-p"))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await cluster.close()
    assert time.monotonic() - started < 2.0
    with pytest.raises((NoAnswer, asyncio.CancelledError)):
        await asyncio.wait_for(pending, 2)
    assert [i async for i in stream] == []  # closing the cluster ended its stream


async def test_events_are_recorded_and_never_raise(api: Served) -> None:
    fake = api.fake
    cluster = await connect(api, request_timeout_s=0.3)
    await cluster.record_event(namespace="ns", name="p", uid="u", reason="Placed", message="m")
    assert fake.events[0]["involvedObject"]["uid"] == "u"
    assert fake.events[0]["type"] == "Normal"
    fake.fail_next = [500]
    await cluster.record_event(namespace="ns", name="p", uid="u", reason="R", message="m")
    fake.delay_s = 2.0
    await cluster.record_event(namespace="ns", name="p", uid="u", reason="R", message="m")
    fake.delay_s = 0
    assert len(fake.events) == 1
    await cluster.close()


async def test_event_timestamps_are_the_current_utc_second(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The text is made once a second and reused (hundreds of Events a second): it must still
    # follow the clock, to the second, in UTC.
    fake = api.fake
    cluster = await connect(api)
    now = [1_764_763_199.2]  # 2025-12-03T11:59:59.2Z
    monkeypatch.setattr(time, "time", lambda: now[0])
    for at in (1_764_763_199.2, 1_764_763_199.9, 1_764_763_200.0, 1_767_225_600.5):
        now[0] = at
        await cluster.record_event(namespace="ns", name="p", uid="u", reason="R", message="m")
    stamps = [(e["firstTimestamp"], e["lastTimestamp"]) for e in fake.events]
    assert [first for first, last in stamps if first == last] == [
        "2025-12-03T11:59:59Z",
        "2025-12-03T11:59:59Z",
        "2025-12-03T12:00:00Z",
        "2026-01-01T00:00:00Z",
    ]
    await cluster.close()


async def test_unreachable_server_is_no_answer(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "http://127.0.0.1:9")  # discard port: nothing listens
    cluster = await KubeCluster.connect(kubeconfig=path, context=None, retry_delay_s=0.05)
    with pytest.raises(NoAnswer):
        await cluster.get_pod("ns", "p")
    stream = cluster.follow()
    await asyncio.sleep(0.3)
    assert stream.restarts >= 2  # retried behind the stream, never raised
    await cluster.close()


async def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="credentials"):
        await KubeCluster.connect(kubeconfig=str(tmp_path / "nope"), context=None)


def test_already_exists_is_a_conflict() -> None:
    assert issubclass(AlreadyExists, Conflict)


# -- the HTTP session ----------------------------------------------------------------------------


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def test_calls_make_no_thread_round_trips(api: Served) -> None:
    """kubernetes-asyncio's session trusts the environment: aiohttp then reads ~/.netrc and the
    proxy variables in executor threads on every request (two thread hops per Binding). After
    connect, binds, reads and events go straight to the socket."""
    for i in range(5):
        api.fake.add_pod("ns", f"p{i}", f"u{i}")
    cluster = await connect(api)
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        for i in range(5):
            await bind(cluster, f"p{i}", f"u{i}")
            assert await cluster.get_pod("ns", f"p{i}") is not None
        await cluster.record_event(
            namespace="ns", name="p0", uid="u0", reason="GpuShareAllocated", message="m"
        )
    finally:
        await cluster.close()
    assert len(api.fake.binds) == 5
    assert executor.submitted == 0


async def test_the_environments_proxy_is_looked_up_once_at_connect(
    api: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY still applies (looked up at connect), NO_PROXY still exempts the server."""
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret@proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert env_proxy(api.url) == ("http://proxy.example:3128", "Basic dXNlcjpzZWNyZXQ=")
    cluster = await connect(api)
    try:
        rest = cluster.api_client.rest_client
        assert rest.proxy == "http://proxy.example:3128"
        assert rest.proxy_headers["Proxy-Authorization"] == "Basic dXNlcjpzZWNyZXQ="
        assert not rest.pool_manager.trust_env
    finally:
        await cluster.close()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert env_proxy(api.url) is None


async def test_every_call_carries_the_kubeconfigs_credentials(api: Served, tmp_path: Path) -> None:
    """Reads go through the generated client, writes (Bindings, Events, node patches) straight
    to the session: both send the kubeconfig's token, and a server that refuses it is a typed
    Unauthorized for each, an Event lost quietly."""
    api.fake.add_pod("ns", "p", "uid-p")
    api.fake.add_node("gpu-1")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    refused = await KubeCluster.connect(
        kubeconfig=kubeconfig(wrong, api.url, token="not-the-token"), context=None
    )
    try:
        with pytest.raises(Unauthorized):
            await refused.get_pod("ns", "p")
        with pytest.raises(Unauthorized):
            await bind(refused, "p", "uid-p")
        with pytest.raises(Unauthorized):
            await refused.patch_node_metadata("gpu-1", {"metadata": {"labels": {"a": "1"}}})
        await refused.record_event(namespace="ns", name="p", uid="uid-p", reason="R", message="m")
        assert refused.api_requests[("create", "pods/binding", "401")] == 1
        assert refused.api_requests[("create", "events", "401")] == 1
        assert refused.api_requests[("patch", "nodes", "401")] == 1
    finally:
        await refused.close()
    assert api.fake.binds == [] and api.fake.events == [] and api.fake.patches == []
    cluster = await connect(api)
    try:
        await bind(cluster, "p", "uid-p")
        await cluster.record_event(namespace="ns", name="p", uid="uid-p", reason="R", message="m")
    finally:
        await cluster.close()
    assert api.fake.binds == [("ns", "p", "gpu-1")]
    assert api.fake.events[0]["metadata"]["name"].startswith("p.")
    assert cluster.api_requests[("create", "pods/binding", "201")] == 1


async def test_writes_go_through_the_environments_proxy(
    api: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward proxy gets the Binding (in absolute form, with the proxy's credentials and
    the API server's token); the API server behind it is not reached directly. The proxy here
    is a second fake API server, which answers what it is sent as the server would."""
    proxy_dir = tmp_path / "proxy"
    proxy_dir.mkdir()
    async with serving(FakeApiServer(), proxy_dir) as proxy:
        proxy.fake.add_pod("ns", "p", "uid-p")
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:secret@"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        cluster = await connect(api)
        try:
            await bind(cluster, "p", "uid-p")
            await cluster.record_event(
                namespace="ns", name="p", uid="uid-p", reason="R", message="m"
            )
        finally:
            await cluster.close()
        assert proxy.fake.binds == [("ns", "p", "gpu-1")]
        assert len(proxy.fake.events) == 1
    assert api.fake.requests == []
