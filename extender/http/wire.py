"""kube-scheduler's extender wire types (k8s.io/kube-scheduler/extender/v1), exactly as Go's
encoding/json writes and reads them.

Owns the field names and the decoding rules: the structs have no json tags, so keys are the Go
field names in PascalCase; requests are read case-insensitively (Go's decoder matches an exact
key first, then any case, and the upstream compatibility test decodes all-lowercase JSON);
responses are written in PascalCase with every field present (Go has no omitempty here, so a
nil map, slice or pointer is `null`); numbers are integers (Go cannot decode 5.0 into int64).
The embedded Pod and Node objects keep Kubernetes' own camelCase and are passed through.
Malformed input raises `WireError` with a reason for a 400 answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Final, TypedDict

import orjson

from extender.service import MAX_SCORE


class WireError(ValueError):
    """The request body is not a valid extender request; the message says what is wrong."""


def field(doc: Mapping[str, Any], name: str) -> Any:
    """`doc[name]` with Go's rule: the exact key first, then a case-insensitive match."""
    if name in doc:
        return doc[name]
    low = name.lower()
    return next((value for key, value in doc.items() if key.lower() == low), None)


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
    # str.join checks every element's type in C and is the cheapest such pass, even at
    # thousands of names; it refuses anything but str, subclasses included, as JSON never
    # makes those.
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
    #: orjson's encoding of `node_names` where the decoder has it at hand (the body carries the
    #: names exactly so), else empty. Not part of the value: the same request either way.
    names_json: bytes = dataclass_field(default=b"", compare=False)

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


#: Where the candidate names start in a body as kube-scheduler writes it: `json.Marshal` of
#: ExtenderArgs puts its fields in declaration order, Pod, Nodes, NodeNames.
_NAMES_MEMBER: Final = b',"NodeNames":'


class ExtenderArgsDecoder:
    """Decodes filter and prioritize bodies, the Pod (and NodeList) of a body once only when
    the next body carries the same bytes for them.

    kube-scheduler sends each pod to /filter and then to /prioritize with the nodes that passed:
    the two bodies are byte-identical up to `,"NodeNames":`. The decoder remembers that part of
    the last body decoded whole and the objects decoded from it; a body that starts with the
    same bytes gets those objects back and only its names decoded (the service's parse of a Pod
    is cached by uid and resourceVersion, not by object, so sharing the dict changes nothing
    downstream). A part is remembered only when what follows it is exactly orjson's encoding of
    the decoded names: then it ends at the top level of the object, and any body that starts
    with it and follows it with valid JSON and `}` decodes to the remembered members plus those
    names. Anything else is decoded whole."""

    __slots__ = ("_head", "_nodes", "_pod")

    def __init__(self) -> None:
        self._head = b""
        self._pod: dict[str, Any] = {}
        self._nodes: dict[str, Any] | None = None

    def decode(self, body: bytes) -> ExtenderArgs:
        """The request's ExtenderArgs; WireError when the body is not a valid one."""
        cut = body.rfind(_NAMES_MEMBER)
        start = cut + len(_NAMES_MEMBER)
        end = len(body) - 1
        # Compared in place (startswith), not through slices: a body is tens of KB.
        if cut == len(self._head) > 0 and body.endswith(b"}") and body.startswith(self._head):
            try:
                tail = orjson.loads(memoryview(body)[start:-1])
            except orjson.JSONDecodeError:
                pass  # decoded whole below, for the error message
            else:
                names = _strings(tail, "NodeNames")
                if names is not None or self._nodes is not None:
                    return ExtenderArgs(self._pod, self._nodes, names)
        args = extender_args(decode(body))
        self._head = b""
        given = args.node_names
        if cut <= 0 or given is None or not body.endswith(b"}"):
            return args
        encoded = orjson.dumps(given)
        if end - start != len(encoded) or not body.startswith(encoded, start):
            return args
        self._head, self._pod, self._nodes = body[:cut], args.pod, args.nodes
        return ExtenderArgs(args.pod, args.nodes, given, encoded)


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


def filter_answer(
    node_names_json: bytes, failed: dict[str, str], unresolvable: dict[str, str]
) -> bytes:
    """`orjson.dumps(filter_result(node_names=..., failed=..., unresolvable=...))`, byte for
    byte, from the names already encoded (`node_names_json`, orjson's encoding of a list of
    strings): a filter's answer without encoding its passed names a second time."""
    return b"".join(
        (
            b'{"Nodes":null,"NodeNames":',
            node_names_json,
            b',"FailedNodes":',
            orjson.dumps(failed),
            b',"FailedAndUnresolvableNodes":',
            orjson.dumps(unresolvable),
            b',"Error":""}',
        )
    )


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


#: `","Score":N},{"Host":"`: what follows a host name in a HostPriorityList but the last.
_SCORE_THEN_HOST: Final = tuple(b'","Score":%d},{"Host":"' % s for s in range(MAX_SCORE + 1))
#: `","Score":N}`: what follows the last host name.
_SCORE_LAST: Final = tuple(b'","Score":%d}' % s for s in range(MAX_SCORE + 1))


def _native_host_priorities() -> Callable[[list[str], tuple[int, ...]], bytes | None] | None:
    """The compiled build's C writer of the same bytes (`_wire.c`), or None (pure build)."""
    try:
        from extender.http._wire import host_priorities as written_in_c
    except ImportError:
        return None
    return written_in_c


_HOST_PRIORITIES_IN_C: Final = _native_host_priorities()


def host_priorities(hosts: Sequence[str], scores: Sequence[int], *, native: bool = True) -> bytes:
    """A HostPriorityList as JSON bytes, hosts in the order given (scores must be ints
    0..MAX_SCORE). The hot path of /prioritize: the compiled build writes it in C where the
    hosts need no escaping (`_wire.c`, a fraction of the Python writer's cost), else (and with
    `native=False`) `host_priorities_in_python` writes the same bytes."""
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts but {len(scores)} scores")
    in_c = _HOST_PRIORITIES_IN_C if native else None
    if in_c is not None and type(hosts) is list and type(scores) is tuple:
        written = in_c(hosts, scores)
        if written is not None:
            return written
    return host_priorities_in_python(hosts, scores)


def host_priorities_in_python(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """`host_priorities` in Python. orjson writes the host names in one C call; the scores are
    spliced between them from precomputed byte strings. This is exact when every `"` in that
    output is a string delimiter, which holds when no name contains a quote (Kubernetes node
    names never do; anything else is written by orjson whole). No per-host dict or lookup:
    dumping a list of dicts costs about twice as much."""
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts but {len(scores)} scores")
    if not hosts:
        return b"[]"
    names = orjson.dumps(hosts)
    if names.count(b'"') != 2 * len(hosts):
        return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])
    parts: list[bytes] = [b""] * (2 * len(hosts))
    parts[0::2] = names[2:-2].split(b'","')
    parts[1::2] = map(_SCORE_THEN_HOST.__getitem__, scores)
    parts[-1] = _SCORE_LAST[scores[-1]]
    return b'[{"Host":"' + b"".join(parts) + b"]"


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
