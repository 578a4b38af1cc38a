"""The embedded cluster behaves like the API server: dumps in JSON and YAML, fresh copies on
read, resourceVersion bumps on every write, following (the objects, Synced, then every later
write, none lost or repeated), and the Binding rules (404, 409 for UID mismatch / already
assigned / being deleted / gated, as the real server's Status bodies; annotations merged in the
same write)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import yaml

from extender.cluster import ClusterEvent, Conflict, EventStream, FollowItem, NotFound, Synced
from extender.cluster.embedded import EmbeddedCluster
from extender.cluster.loader import ClusterFileError
from tests.http.kube_objects import gpu_node, plain_node, pod


def _dump(*items: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": list(items)}


def test_loads_json_and_yaml_alike(tmp_path: Path) -> None:
    doc = _dump(gpu_node("n1"), plain_node("n2"), pod("p1"), pod("p2", node="n1"))
    as_json = tmp_path / "c.json"
    as_json.write_bytes(orjson.dumps(doc))
    as_yaml = tmp_path / "c.yaml"
    as_yaml.write_text(yaml.safe_dump(doc))
    for path in (as_json, as_yaml):
        cluster = EmbeddedCluster.from_file(path)
        assert cluster.node_count() == 2
        assert cluster.pod_count() == 2
        p = cluster.pod("default", "p2")
        assert p is not None and p["spec"]["nodeName"] == "n1"
        # Every object has a resourceVersion, as the API server's do.
        assert p["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b'{"kind": "List", "items": [', "not valid JSON"),
        (b"[1, 2]", "expected a v1 List"),
        (b'{"kind": "Deployment"}', "expected kind List"),
        (b'{"kind": "List", "items": {}}', "items is a dict"),
        (b'{"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "s"}}]}', "Service"),
        (b'{"kind": "List", "items": [{"kind": "Pod", "metadata": {}}]}', "no metadata.name"),
        (
            b'{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a","labels":[1]}}]}',
            "metadata.labels is not a map",
        ),
    ],
)
def test_bad_dumps_say_what_is_wrong(text: bytes, fragment: str) -> None:
    with pytest.raises(ClusterFileError) as err:
        EmbeddedCluster.from_text(text, source="dump.json")
    assert fragment in str(err.value)
    assert "dump.json" in str(err.value)


def test_missing_file_is_a_clean_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match="cannot read cluster file"):
        EmbeddedCluster.from_file(tmp_path / "nope.json")


def test_duplicate_pod_is_refused() -> None:
    with pytest.raises(ClusterFileError, match="appears twice"):
        EmbeddedCluster.from_objects([pod("a"), pod("a")])


async def test_bind_sets_node_and_annotations_in_one_write() -> None:
    cluster = EmbeddedCluster.from_objects([gpu_node("n1"), pod("p", uid="u1")])
    before = cluster.pod("default", "p")
    assert before is not None
    stream = cluster.follow()
    await until_synced(stream)
    await cluster.bind(
        namespace="default", name="p", uid="u1", node="n1", annotations={"a.io/x": "1"}
    )
    after = cluster.pod("default", "p")
    assert after is not None
    assert after["spec"]["nodeName"] == "n1"
    assert after["metadata"]["annotations"]["a.io/x"] == "1"
    assert {"type": "PodScheduled", "status": "True"} in after["status"]["conditions"]
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    # Exactly one event, carrying both changes (one write).
    event = await asyncio.wait_for(anext(aiter(stream)), 1)
    assert isinstance(event, ClusterEvent)
    assert event.type == "MODIFIED" and event.kind == "Pod"
    assert event.obj["spec"]["nodeName"] == "n1"
    assert event.obj["metadata"]["annotations"]["a.io/x"] == "1"
    stream.close()


async def test_bind_refusals_match_the_api_server() -> None:
    gated = pod("gated", uid="ug")
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    dying = pod("dying", uid="ud")
    dying["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cluster = EmbeddedCluster.from_objects(
        [gpu_node("n1"), pod("p", uid="u1"), pod("bound", uid="ub", node="n2"), gated, dying]
    )
    with pytest.raises(NotFound, match='pods "ghost" not found') as missing:
        await cluster.bind(namespace="default", name="ghost", uid="", node="n1", annotations={})
    assert (missing.value.code, missing.value.details.kind) == (404, "pods")
    with pytest.raises(Conflict, match="Precondition failed: UID") as uid:
        await cluster.bind(namespace="default", name="p", uid="other", node="n1", annotations={})
    assert uid.value.details.kind == "pods"  # a storage precondition, not the binding's rule
    with pytest.raises(Conflict, match='already assigned to node "n2"') as err:
        await cluster.bind(namespace="default", name="bound", uid="ub", node="n1", annotations={})
    # The real server's Status: reason, code, and the object named in its details.
    assert (err.value.code, err.value.reason) == (409, "Conflict")
    assert (err.value.details.name, err.value.details.kind) == ("bound", "pods/binding")
    assert err.value.message.startswith('Operation cannot be fulfilled on pods/binding "bound"')
    with pytest.raises(Conflict, match="schedulingGates"):
        await cluster.bind(namespace="default", name="gated", uid="ug", node="n1", annotations={})
    with pytest.raises(Conflict, match="being deleted"):
        await cluster.bind(namespace="default", name="dying", uid="ud", node="n1", annotations={})
    # Nothing changed on any refusal.
    p = cluster.pod("default", "p")
    assert p is not None and "nodeName" not in p["spec"]


async def test_reads_are_copies_and_writes_reach_every_watch() -> None:
    cluster = EmbeddedCluster.from_objects([gpu_node("n1"), pod("p", uid="u1")])
    copy = cluster.pod("default", "p")
    assert copy is not None
    copy["spec"]["nodeName"] = "mutated"
    again = cluster.pod("default", "p")
    assert again is not None and "nodeName" not in again["spec"]
    a, b = cluster.follow(), cluster.follow()
    cluster.set_pod_phase("default", "p", "Succeeded")
    assert cluster.delete_pod("default", "p")
    for stream in (a, b):
        await until_synced(stream)
        it = aiter(stream)
        first = await asyncio.wait_for(anext(it), 1)
        second = await asyncio.wait_for(anext(it), 1)
        assert isinstance(first, ClusterEvent) and isinstance(second, ClusterEvent)
        assert (first.type, first.obj["status"]["phase"]) == ("MODIFIED", "Succeeded")
        assert second.type == "DELETED"
        assert int(second.obj["metadata"]["resourceVersion"]) > int(
            first.obj["metadata"]["resourceVersion"]
        )
    await cluster.close()
    # Closed streams end.
    assert [e async for e in a] == []


async def until_synced(stream: EventStream) -> list[ClusterEvent]:
    listed: list[ClusterEvent] = []
    async with asyncio.timeout(5):
        async for item in stream:
            if isinstance(item, Synced):
                return listed
            listed.append(item)
    raise AssertionError("stream ended before Synced")


async def test_follow_delivers_every_node_then_every_pod_then_synced() -> None:
    items = (
        [pod("p0")] + [gpu_node(f"n{i}") for i in range(3)] + [pod(f"p{i}") for i in range(1, 4500)]
    )
    cluster = EmbeddedCluster.from_objects(items)
    stream = cluster.follow()
    listed = await until_synced(stream)
    assert [e.kind for e in listed] == ["Node"] * 3 + ["Pod"] * 4500
    assert {e.type for e in listed} == {"ADDED"}
    assert len({e.obj["metadata"]["uid"] for e in listed[3:]}) == 4500
    assert stream.restarts == 0
    assert await cluster.get_node("n1") is not None
    assert await cluster.get_node("ghost") is None


async def test_writes_during_the_initial_delivery_come_after_synced_none_lost_or_repeated() -> None:
    cluster = EmbeddedCluster.from_objects([gpu_node("n0")] + [pod(f"p{i}") for i in range(5000)])
    stream = cluster.follow()
    items: list[FollowItem] = []
    async with asyncio.timeout(5):
        async for item in stream:
            items.append(item)
            if len(items) == 10:
                # Halfway through the delivery: change a pod already delivered, one not yet
                # delivered, delete one, add one.
                cluster.set_pod_phase("default", "p1", "Running")
                cluster.set_pod_phase("default", "p4000", "Running")
                assert cluster.delete_pod("default", "p4001")
                cluster.apply(pod("late"))
            if isinstance(item, Synced):
                break
        after = [await anext(aiter(stream)) for _ in range(4)]
    listed = [i for i in items if isinstance(i, ClusterEvent)]
    assert len(listed) == 5001  # the snapshot, whole, as it was when following began
    snapshot = {e.obj["metadata"]["name"]: e.obj for e in listed}
    assert "late" not in snapshot
    assert snapshot["p4001"]["status"].get("phase") != "Running"
    assert snapshot["p4000"]["status"].get("phase") != "Running"
    assert [(e.type, e.obj["metadata"]["name"]) for e in after if isinstance(e, ClusterEvent)] == [
        ("MODIFIED", "p1"),
        ("MODIFIED", "p4000"),
        ("DELETED", "p4001"),
        ("ADDED", "late"),
    ]
    stream.close()
    assert [i async for i in stream] == []


def test_streamed_file_matches_whole_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # kubectl puts `items` before `kind`; chunk boundaries fall inside items.
    import extender.cluster.loader as loader

    items = [gpu_node(f"n{i}") for i in range(20)] + [pod(f"p{i}") for i in range(300)]
    text = orjson.dumps({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {}})
    path = tmp_path / "dump.json"
    path.write_bytes(text)
    monkeypatch.setattr(loader, "CHUNK", 777)
    streamed = list(loader.read_file(path))
    whole = list(loader.parse_document(text, source="x"))
    assert streamed == whole
    assert len(streamed) == 320
    truncated = tmp_path / "cut.json"
    truncated.write_bytes(text[: len(text) // 2])
    with pytest.raises(ClusterFileError, match="not valid JSON near item"):
        list(loader.read_file(truncated))
