"""The embedded cluster behaves like the API server: dumps in JSON and YAML, fresh copies on
read, resourceVersion bumps on every write, watch events, and the Binding rules (404, 409 for
UID mismatch / already assigned / being deleted / gated, annotations merged in the same write)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import yaml

from extender.cluster import ClusterEvent, Conflict, NotFound
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
    stream = cluster.watch()
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
    with pytest.raises(NotFound, match='pods "ghost" not found'):
        await cluster.bind(namespace="default", name="ghost", uid="", node="n1", annotations={})
    with pytest.raises(Conflict, match="Precondition failed: UID"):
        await cluster.bind(namespace="default", name="p", uid="other", node="n1", annotations={})
    with pytest.raises(Conflict, match='already assigned to node "n2"') as err:
        await cluster.bind(namespace="default", name="bound", uid="ub", node="n1", annotations={})
    assert err.value.assigned_node == "n2"
    assert err.value.status == 409
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
    a, b = cluster.watch(), cluster.watch()
    cluster.set_pod_phase("default", "p", "Succeeded")
    assert cluster.delete_pod("default", "p")
    for stream in (a, b):
        it = aiter(stream)
        first = await asyncio.wait_for(anext(it), 1)
        second = await asyncio.wait_for(anext(it), 1)
        assert (first.type, first.obj["status"]["phase"]) == ("MODIFIED", "Succeeded")
        assert second.type == "DELETED"
        assert int(second.obj["metadata"]["resourceVersion"]) > int(
            first.obj["metadata"]["resourceVersion"]
        )
    await cluster.close()
    # Closed streams end.
    assert [e async for e in a] == []


async def test_lists_page_through_everything() -> None:
    items = [gpu_node(f"n{i}") for i in range(3)] + [pod(f"p{i}") for i in range(4500)]
    cluster = EmbeddedCluster.from_objects(items)
    assert len([n async for n in cluster.list_nodes()]) == 3
    pods = [p async for p in cluster.list_pods()]
    assert len(pods) == 4500
    assert len({p["metadata"]["uid"] for p in pods}) == 4500


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
