"""kube-scheduler's extender wire types (k8s.io/kube-scheduler/extender/v1), exactly as Go's
encoding/json writes and reads them (reference extender-protocol.md §1).

Owns the field names and the decoding rules: the structs have no json tags, so keys are the Go
field names in PascalCase; requests are read case-insensitively (Go's decoder matches an exact
key first, then any case, and the upstream compatibility test decodes all-lowercase JSON);
responses are written in PascalCase with every field present (Go has no omitempty here, so a
nil map, slice or pointer is `null`); numbers are integers (Go cannot decode 5.0 into int64).
The embedded Pod and Node objects keep Kubernetes' own camelCase and are passed through.
Malformed input raises `WireError` with a reason for a 400 answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import orjson


class WireError(ValueError):
    """The request body is not a valid extender request; the message says what is wrong."""


def field(doc: Mapping[str, Any], name: str) -> Any:
    """`doc[name]` with Go's rule: the exact key first, then a case-insensitive match."""
    if name in doc:
        return doc[name]
    low = name.lower()
    for key, value in doc.items():
        if key.lower() == low:
            return value
    return None


def decode(body: bytes) -> dict[str, Any]:
    """A JSON object from the body; WireError for anything else."""
    if not body:
        raise WireError("empty body: expected a JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"body is not valid JSON: {str(exc)[:160]}") from None
    if not isinstance(doc, dict):
        raise WireError(f"body is a JSON {type(doc).__name__}, expected an object")
    return doc


def _object(value: object, what: str, *, required: bool = False) -> dict[str, Any] | None:
    if value is None:
        if required:
            raise WireError(f"{what} is required")
        return None
    if not isinstance(value, dict):
        raise WireError(f"{what} must be an object, got {_kind(value)}")
    return value


def _strings(value: object, what: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireError(f"{what} must be a list of strings, got {_kind(value)}")
    # str.join checks every element's type in C and is the cheapest such pass (5,000 names:
    # ~20 us); it refuses anything but str, subclasses included, as JSON never makes those.
    try:
        "".join(value)
    except TypeError:
        raise WireError(f"{what} must contain only strings") from None
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize request: the Pod and the candidates, as NodeNames
    (nodeCacheCapable: true) or as a full NodeList (false)."""

    pod: dict[str, Any]
    #: The NodeList object as sent (its `items` checked to be Nodes with names), or None.
    nodes: dict[str, Any] | None
    node_names: list[str] | None

    def names(self) -> list[str]:
        """Every candidate name: NodeNames when sent, else the NodeList items' names."""
        if self.node_names is not None:
            return self.node_names
        if self.nodes is not None:
            return [item["metadata"]["name"] for item in self.nodes["items"]]
        return []


def extender_args(doc: Mapping[str, Any]) -> ExtenderArgs:
    pod = _object(field(doc, "Pod"), "Pod", required=True)
    assert pod is not None
    nodes = _object(field(doc, "Nodes"), "Nodes")
    if nodes is not None:
        items = nodes.get("items")
        if items is None:
            items = nodes["items"] = []
        if not isinstance(items, list):
            raise WireError(f"Nodes.items must be a list, got {_kind(items)}")
        for i, item in enumerate(items):
            meta = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
                raise WireError(f"Nodes.items[{i}] is not a Node with metadata.name")
    names = _strings(field(doc, "NodeNames"), "NodeNames")
    if nodes is None and names is None:
        raise WireError("neither NodeNames nor Nodes is set")
    return ExtenderArgs(pod, nodes, names)


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def binding_args(doc: Mapping[str, Any]) -> BindingArgs:
    values = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = field(doc, key)
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise WireError(f"{key} must be a non-empty string, got {_kind(value)}")
        values.append(value)
    return BindingArgs(*values)


@dataclass(frozen=True, slots=True)
class NodeVictims:
    uids: list[str]
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: dict[str, Any]
    victims: dict[str, NodeVictims]


def _int(value: object, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an integer, got {_kind(value)}")
    return value


def _victims(value: object, where: str, *, meta: bool) -> NodeVictims:
    obj = _object(value, where, required=True)
    assert obj is not None
    pods = field(obj, "Pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise WireError(f"{where}.Pods must be a list, got {_kind(pods)}")
    uids: list[str] = []
    for i, pod in enumerate(pods):
        if not isinstance(pod, dict):
            raise WireError(f"{where}.Pods[{i}] must be an object, got {_kind(pod)}")
        if meta:
            uid = field(pod, "UID")
        else:
            metadata = pod.get("metadata")
            uid = metadata.get("uid") if isinstance(metadata, dict) else None
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}.Pods[{i}] has no UID")
        uids.append(uid)
    return NodeVictims(uids, _int(field(obj, "NumPDBViolations"), f"{where}.NumPDBViolations"))


def preemption_args(doc: Mapping[str, Any]) -> PreemptionArgs:
    pod = _object(field(doc, "Pod"), "Pod", required=True)
    assert pod is not None
    # The scheduler sets one of the two maps (meta when nodeCacheCapable); prefer it if both.
    for key, meta in (("NodeNameToMetaVictims", True), ("NodeNameToVictims", False)):
        value = _object(field(doc, key), key)
        if value is not None:
            victims = {
                node: _victims(v, f"{key}[{node!r}]", meta=meta) for node, v in value.items()
            }
            return PreemptionArgs(pod, victims)
    return PreemptionArgs(pod, {})


# -- responses --------------------------------------------------------------------------------


class FilterResult(TypedDict):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class MetaPod(TypedDict):
    UID: str


class MetaVictims(TypedDict):
    Pods: list[MetaPod]
    NumPDBViolations: int


class PreemptionResult(TypedDict):
    NodeNameToMetaVictims: dict[str, MetaVictims]


class BindingResult(TypedDict):
    Error: str


def filter_result(
    *,
    nodes: dict[str, Any] | None = None,
    node_names: list[str] | None = None,
    failed: dict[str, str] | None = None,
    unresolvable: dict[str, str] | None = None,
    error: str = "",
) -> FilterResult:
    return {
        "Nodes": nodes,
        "NodeNames": node_names,
        "FailedNodes": failed if failed is not None else {},
        "FailedAndUnresolvableNodes": unresolvable if unresolvable is not None else {},
        "Error": error,
    }


class HostPriorityEncoder:
    """Encodes HostPriorityLists (arrays of `HostPriority`), keeping each host's `{"Host":"…","Score":` prefix as bytes:
    prioritize answers for the same few thousand nodes on every call, and joining cached bytes
    costs a quarter less than building and dumping 500 dicts. Bounded: past `max_hosts` the
    cache starts afresh (nodes come and go)."""

    _SCORE_TAILS: tuple[bytes, ...] = tuple(b"%d}" % s for s in range(11))

    def __init__(self, *, max_hosts: int = 100_000) -> None:
        self._prefixes: dict[str, bytes] = {}
        self._max_hosts = max_hosts

    def _prefix(self, host: str) -> bytes:
        if len(self._prefixes) >= self._max_hosts:
            self._prefixes.clear()
        prefix = self._prefixes[host] = b'{"Host":' + orjson.dumps(host) + b',"Score":'
        return prefix

    def encode(self, hosts: Sequence[str], scores: Sequence[int]) -> bytes:
        """The HostPriorityList as JSON bytes (scores must already be ints 0..10)."""
        get, tails = self._prefixes.get, self._SCORE_TAILS
        parts = [(get(h) or self._prefix(h)) + tails[s] for h, s in zip(hosts, scores, strict=True)]
        return b"[" + b",".join(parts) + b"]"


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> PreemptionResult:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": int(pdb)}
            for node, (uids, pdb) in victims.items()
        }
    }


def binding_result(error: str = "") -> BindingResult:
    return {"Error": error}


def encode(value: object) -> bytes:
    return orjson.dumps(value)
