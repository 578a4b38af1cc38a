"""The embedded in-memory cluster: a `Cluster` that holds Node and Pod objects loaded from a
`kubectl get nodes,pods -A -o json` dump and applies binds to them the way the API server does.

Owns the fake API server's semantics, kept faithful so that what passes here passes against a
real cluster: every read returns a fresh copy; `follow()` delivers the objects as they were
when it was called, then `Synced`, then every later write; every write bumps the object's
`metadata.resourceVersion` from one cluster-wide counter and is delivered to every follower; a
Binding is refused with 404 when the pod is gone and 409 when its UID does not match, when it is
being deleted, when it is already assigned, or when it still has scheduling gates (the errors
built, through `error_from_status`, from the very Status bodies the API server answers), and
otherwise sets `spec.nodeName`, merges the Binding's annotations and sets PodScheduled in one
write (the API server's BindingREST). For the node agent (`NodeAgentCluster`), a Node's
JSON merge patch (RFC 7386, `merge_patch`) is one such write too, with a resourceVersion in the
patch as its precondition.

Objects are stored as zlib-compressed JSON: a 60,000-pod cluster as Python dicts takes over a
GB, as JSON ~200 MB, compressed ~100 MB; and a copy on every read comes for free.
"""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from extender.cluster import (
    ClusterEvent,
    EventStream,
    EventType,
    FollowItem,
    JsonObject,
    ObjectKind,
    Synced,
    error_from_status,
    status_body,
)
from extender.cluster.loader import ClusterFileError, parse_document, read_file

#: Events kept for inspection (`recorded_events`); older ones are dropped like the API server's
#: event TTL would drop them.
MAX_RECORDED_EVENTS = 10_000


class _Stream:
    """One follower: the objects as they were when `follow()` was called, then `Synced`, then
    every write after that call, in order. The snapshot is taken in the same instant the stream
    starts receiving writes, so nothing is lost or delivered twice."""

    def __init__(self, owner: EmbeddedCluster, nodes: list[bytes], pods: list[bytes]) -> None:
        self._owner = owner
        self._initial: Iterator[FollowItem] = self._snapshot(nodes, pods)
        #: Writes as stored (event type, kind, bytes): each is decoded when the follower takes
        #: it, as a real watch decodes its stream, not inside the write that made it.
        self._queue: asyncio.Queue[tuple[EventType, ObjectKind, bytes] | None] = asyncio.Queue()
        self._closed = False
        self._delivered = 0
        #: Always 0: memory does not break (the protocol's health counter).
        self.restarts = 0

    @staticmethod
    def _snapshot(nodes: list[bytes], pods: list[bytes]) -> Iterator[FollowItem]:
        # Decoded lazily, one object at a time: 60,000 pods as dicts would be a GB.
        for data in nodes:
            yield ClusterEvent("ADDED", "Node", _decode(data))
        for data in pods:
            yield ClusterEvent("ADDED", "Pod", _decode(data))
        yield Synced()

    def push(self, event: EventType, kind: ObjectKind, data: bytes) -> None:
        if not self._closed:
            self._queue.put_nowait((event, kind, data))

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> FollowItem:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = next(self._initial, None)
        if item is not None:
            self._delivered += 1
            if self._delivered % 2000 == 0:
                # A real list pages; let other tasks run between pages here too.
                await asyncio.sleep(0)
            return item
        written = await self._queue.get()
        if written is None:
            raise StopAsyncIteration
        event, kind, data = written
        return ClusterEvent(event, kind, _decode(data))

    def close(self) -> None:
        if not self._closed:
            self._initial = iter(())
            self._queue.put_nowait(None)
            self._closed = True
            self._owner._streams.discard(self)


class EmbeddedCluster:
    """An in-memory cluster. Build it with `from_file` (blocking: call it before the event loop
    starts or through `asyncio.to_thread`), `from_text` or `from_objects`."""

    def __init__(self, *, description: str = "embedded cluster") -> None:
        self.description = description
        self._nodes: dict[str, bytes] = {}
        self._pods: dict[tuple[str, str], bytes] = {}
        self._version = 0
        self._streams: set[_Stream] = set()
        self.recorded_events: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_EVENTS)

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path) -> EmbeddedCluster:
        """Load a dump, streamed item by item. Raises ClusterFileError naming the fault."""
        cluster = cls(description=f"embedded cluster from {path}")
        cluster._load(read_file(path), source=str(path))
        return cluster

    @classmethod
    def from_text(cls, text: str | bytes, *, source: str = "<text>") -> EmbeddedCluster:
        cluster = cls(description=f"embedded cluster from {source}")
        cluster._load(parse_document(text, source=source), source=source)
        return cluster

    @classmethod
    def from_objects(
        cls, objects: Iterable[Mapping[str, Any]], *, description: str = "embedded cluster"
    ) -> EmbeddedCluster:
        cluster = cls(description=description)
        doc = {"kind": "List", "items": [dict(o) for o in objects]}
        cluster._load(parse_document(orjson.dumps(doc), source=description), source=description)
        return cluster

    def _load(self, items: Iterable[dict[str, Any]], *, source: str) -> None:
        versions: list[int] = []
        assigned = 0
        for item in items:
            meta = item["metadata"]
            rv = meta.get("resourceVersion")
            if isinstance(rv, str) and rv.isdigit():
                versions.append(int(rv))
            else:
                # Every object the API server returns has a resourceVersion; so do ours.
                assigned += 1
                meta["resourceVersion"] = str(assigned)
            if item["kind"] == "Node":
                self._nodes[meta["name"]] = _pack(item)
                continue
            meta.setdefault("namespace", "default")
            key = (meta["namespace"], meta["name"])
            if key in self._pods:
                raise ClusterFileError(f"{source}: pod {key[0]}/{key[1]} appears twice")
            # The API server gives every object a UID; a hand-written file may not. Derive a
            # stable one so that reloading the same file names the same pods.
            meta.setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod:{key[0]}/{key[1]}")))
            self._pods[key] = _pack(item)
        self._version = max([*versions, assigned])

    # -- the Cluster protocol ----------------------------------------------------------------

    def follow(self) -> EventStream:
        # The stored values are immutable bytes: copying the two dicts' values is the snapshot.
        stream = _Stream(self, list(self._nodes.values()), list(self._pods.values()))
        self._streams.add(stream)
        return stream

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        return self.pod(namespace, name)

    async def get_node(self, name: str) -> JsonObject | None:
        return self.node(name)

    async def bind(
        self, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        what = f"bind {namespace}/{name} to {node}"
        # The answers below are the real BindingREST's, Status bodies and all (the API
        # server's pod storage): its storage errors go through InterpretUpdateError on
        # resource "pods", anything else becomes a Conflict on "pods/binding".
        data = self._pods.get((namespace, name))
        if data is None:
            raise error_from_status(404, _not_found("pods", name), what=what)
        pod = _decode(data)
        meta = pod["metadata"]
        spec = pod.setdefault("spec", {})
        if not node:
            # ValidatePodBinding's field errors reach the client as a plain error, which the
            # API server answers as a 500 with no reason.
            raise error_from_status(
                500, status_body(500, "", "target.name: Required value"), what=what
            )
        # The storage layer checks the UID precondition before the update function runs.
        if uid and meta.get("uid") != uid:
            raise error_from_status(
                409,
                _conflict(
                    "pods",
                    name,
                    "StorageError: invalid object, Code: 4, "
                    f"Key: /registry/pods/{namespace}/{name}, ResourceVersion: 0, "
                    f"AdditionalErrorMsg: Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {meta.get('uid', '')}",
                ),
                what=what,
            )
        refusal: str | None = None
        if meta.get("deletionTimestamp"):
            refusal = f"pod {name} is being deleted, cannot be assigned to a host"
        elif assigned := spec.get("nodeName"):
            refusal = f'pod {name} is already assigned to node "{assigned}"'
        elif spec.get("schedulingGates"):
            refusal = f"pod {name} has non-empty .spec.schedulingGates"
        if refusal is not None:
            raise error_from_status(409, _conflict("pods/binding", name, refusal), what=what)
        spec["nodeName"] = node
        if annotations:
            merged = dict(meta.get("annotations") or {})
            merged.update(annotations)
            meta["annotations"] = merged
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True"})
        status["conditions"] = conditions
        self._write("Pod", pod, "MODIFIED")

    async def record_event(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        self.recorded_events.append(
            {
                "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
                "reason": reason,
                "message": message,
                "type": "Warning" if warning else "Normal",
            }
        )

    # -- the NodeAgentCluster protocol --------------------------------------------------------

    async def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> JsonObject:
        what = f"patch node {name}"
        data = self._nodes.get(name)
        if data is None:
            raise error_from_status(404, _not_found("nodes", name), what=what)
        if not isinstance(patch, Mapping):
            raise error_from_status(
                422, status_body(422, "Invalid", "a merge patch must be a JSON object"), what=what
            )
        node = _decode(data)
        wanted = patch.get("metadata")
        # A resourceVersion in the patch is an optimistic-concurrency precondition, as it is for
        # the API server's update of the patched object.
        rv = wanted.get("resourceVersion") if isinstance(wanted, Mapping) else None
        if rv is not None and rv != node["metadata"].get("resourceVersion"):
            raise error_from_status(
                409,
                _conflict(
                    "nodes",
                    name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again",
                ),
                what=what,
            )
        patched = merge_patch(node, patch)
        meta = patched.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != name:
            raise error_from_status(
                400,
                status_body(
                    400,
                    "BadRequest",
                    f"the name of the object ({(meta or {}).get('name', '')}) does not match "
                    f"the name on the URL ({name})",
                ),
                what=what,
            )
        return _decode(self._write("Node", patched, "MODIFIED"))

    async def list_node_pods(self, node: str) -> list[JsonObject]:
        pods: list[JsonObject] = []
        for i, data in enumerate(list(self._pods.values())):
            pod = _decode(data)
            if (pod.get("spec") or {}).get("nodeName") == node:
                pods.append(pod)
            if i % 2000 == 1999:
                await asyncio.sleep(0)  # as list pages do, let other tasks run
        return pods

    async def record_node_event(
        self,
        *,
        node: str,
        reason: str,
        message: str,
        warning: bool = False,
        component: str = "mpsched-agent",
    ) -> None:
        self.recorded_events.append(
            {
                # As the Kubernetes adapter records it: namespace "default", uid = node name.
                "metadata": {"namespace": "default"},
                "involvedObject": {"kind": "Node", "name": node, "uid": node},
                "reason": reason,
                "message": message,
                "type": "Warning" if warning else "Normal",
                "source": {"component": component},
            }
        )

    async def close(self) -> None:
        for stream in list(self._streams):
            stream.close()

    # -- direct access: tests, the demo, and simulated cluster activity ----------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A fresh copy of the pod, or None."""
        data = self._pods.get((namespace, name))
        return None if data is None else _decode(data)

    def node(self, name: str) -> dict[str, Any] | None:
        data = self._nodes.get(name)
        return None if data is None else _decode(data)

    def pod_count(self) -> int:
        return len(self._pods)

    def node_count(self) -> int:
        return len(self._nodes)

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a Node or Pod (kubectl apply); returns the stored copy."""
        item = next(parse_document(orjson.dumps({"kind": "List", "items": [obj]}), source="apply"))
        meta = item["metadata"]
        if item["kind"] == "Pod":
            meta.setdefault("namespace", "default")
            key = (meta["namespace"], meta["name"])
            old = self._pods.get(key)
            if old is None:
                meta.setdefault("uid", str(uuid.uuid4()))
            else:
                meta.setdefault("uid", _decode(old)["metadata"].get("uid"))
            event: EventType = "ADDED" if old is None else "MODIFIED"
        else:
            event = "ADDED" if meta["name"] not in self._nodes else "MODIFIED"
        return _decode(self._write(item["kind"], item, event))

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod at once (no grace period); False if there was none."""
        return self._emit_deleted("Pod", self._pods.pop((namespace, name), None))

    def delete_node(self, name: str) -> bool:
        return self._emit_deleted("Node", self._nodes.pop(name, None))

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        """Set `status.phase` (Succeeded / Failed make the pod terminal)."""
        pod = self.pod(namespace, name)
        if pod is None:
            raise error_from_status(
                404, _not_found("pods", name), what=f"set phase of {namespace}/{name}"
            )
        pod.setdefault("status", {})["phase"] = phase
        self._write("Pod", pod, "MODIFIED")

    # -- internals ---------------------------------------------------------------------------

    def _write(self, kind: ObjectKind, obj: dict[str, Any], event: EventType) -> bytes:
        """Store and deliver `obj`; the stored form (callers wanting a copy decode it: a bind
        does not, and a decode costs as much as the write)."""
        self._version += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._version)
        data = _pack(obj)
        if kind == "Pod":
            self._pods[(meta["namespace"], meta["name"])] = data
        else:
            self._nodes[meta["name"]] = data
        self._emit(event, kind, data)
        return data

    def _emit_deleted(self, kind: ObjectKind, data: bytes | None) -> bool:
        """Deliver the deletion of the object stored as `data`; False where there was none."""
        if data is None:
            return False
        obj = _decode(data)
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._emit("DELETED", kind, _pack(obj))
        return True

    def _emit(self, event: EventType, kind: ObjectKind, data: bytes) -> None:
        for stream in self._streams:
            # Each watcher decodes its own copy, as each real watch does.
            stream.push(event, kind, data)


def _not_found(resource: str, name: str) -> dict[str, Any]:
    # apimachinery errors.NewNotFound
    return status_body(404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource)


def _conflict(resource: str, name: str, why: str) -> dict[str, Any]:
    # apimachinery errors.NewConflict
    return status_body(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        name=name,
        kind=resource,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: `patch` applied to `target`, neither changed. An object patch
    merges key by key into an object (anything else counts as an empty one), a null value
    deletes its key; any other patch value, arrays included, replaces what was there."""
    if not isinstance(patch, Mapping):
        return patch
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _pack(obj: object) -> bytes:
    """An object as stored: JSON, zlib-compressed (the fast level: smaller, cheap per pod)."""
    return zlib.compress(orjson.dumps(obj), 1)


def _decode(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(zlib.decompress(data))
    return obj
