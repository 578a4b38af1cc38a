"""Golden tests: upstream's compatibility fixtures (kube-scheduler extender/v1 types_test.go
TestCompatibility, reference extender-protocol.md §1.4) decode, encode byte for byte, and
decode the same when the whole JSON is lowercased, as Go's case-insensitive decoder does."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.http.wire import (
    HostPriorityEncoder,
    WireError,
    binding_args,
    binding_result,
    decode,
    extender_args,
    filter_result,
    preemption_args,
    preemption_result,
)

POD = '{"metadata":{"name":"podname"},"spec":{"containers":null},"status":{}}'
NODE_LIST = (
    '{"metadata":{},"items":[{"metadata":{"name":"nodename"},"spec":{},"status":{'
    '"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"",'
    '"bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"",'
    '"kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]}'
)
META_VICTIMS = '{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}'

PREEMPTION_RESULT = '{"NodeNameToMetaVictims":' + META_VICTIMS + "}"
PREEMPTION_ARGS = (
    '{"Pod":' + POD + ',"NodeNameToVictims":{"foo":{"Pods":[' + POD + '],"NumPDBViolations":1}},'
    '"NodeNameToMetaVictims":' + META_VICTIMS + "}"
)
EXTENDER_ARGS = '{"Pod":' + POD + ',"Nodes":' + NODE_LIST + ',"NodeNames":["node1"]}'
FILTER_RESULT = (
    '{"Nodes":' + NODE_LIST + ',"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},'
    '"FailedAndUnresolvableNodes":{"baz":"qux"},"Error":"myerror"}'
)
BINDING_ARGS = (
    '{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}'
)
BINDING_RESULT = '{"Error":"myerror"}'
HOST_PRIORITY = '{"Host":"myhost","Score":1}'


def _both(fixture: str) -> list[dict[str, Any]]:
    """The fixture as sent, and lowercased whole as upstream's test does."""
    return [decode(fixture.encode()), decode(fixture.lower().encode())]


def test_extender_args_both_ways() -> None:
    for doc in _both(EXTENDER_ARGS):
        args = extender_args(doc)
        assert args.pod["metadata"]["name"] == "podname"
        assert args.node_names == ["node1"]
        assert args.nodes is not None
        assert [i["metadata"]["name"] for i in args.nodes["items"]] == ["nodename"]
        assert args.names() == ["node1"]


def test_filter_result_encodes_byte_for_byte() -> None:
    nodes = orjson.loads(NODE_LIST)
    encoded = orjson.dumps(
        filter_result(
            nodes=nodes,
            node_names=["node1"],
            failed={"foo": "bar"},
            unresolvable={"baz": "qux"},
            error="myerror",
        )
    )
    assert encoded.decode() == FILTER_RESULT
    # Nil fields are null, never left out (Go has no omitempty here).
    empty = orjson.loads(orjson.dumps(filter_result(node_names=[])))
    assert empty == {
        "Nodes": None,
        "NodeNames": [],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_preemption_both_ways() -> None:
    for doc in _both(PREEMPTION_ARGS):
        args = preemption_args(doc)
        # The meta map is preferred when both are set.
        assert {n: (v.uids, v.pdb_violations) for n, v in args.victims.items()} == {
            "foo": (["myuid"], 1)
        }
    full_only = orjson.loads(PREEMPTION_ARGS)
    del full_only["NodeNameToMetaVictims"]
    full_only["NodeNameToVictims"]["foo"]["Pods"][0]["metadata"]["uid"] = "u9"
    assert preemption_args(full_only).victims["foo"].uids == ["u9"]
    encoded = orjson.dumps(preemption_result({"foo": (["myuid"], 1)}))
    assert encoded.decode() == PREEMPTION_RESULT


def test_binding_both_ways() -> None:
    for doc in _both(BINDING_ARGS):
        args = binding_args(doc)
        assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == (
            "mypodname",
            "mypodnamespace",
            "mypoduid",
            "mynode",
        )
    assert orjson.dumps(binding_result("myerror")).decode() == BINDING_RESULT


def test_host_priority_is_an_integer() -> None:
    encoded = HostPriorityEncoder().encode(["myhost"], [1])
    assert encoded.decode() == "[" + HOST_PRIORITY + "]"
    # Go cannot decode 5.0 into int64: scores are always written as integers.
    assert b"5.0" not in HostPriorityEncoder().encode(["h"], [5])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty body"),
        (b'{"Pod": {', "not valid JSON"),
        (b"[1]", "JSON list"),
        (b'{"NodeNames": ["a"]}', "Pod is required"),
        (b'{"Pod": [], "NodeNames": ["a"]}', "Pod must be an object"),
        (b'{"Pod": {}, "NodeNames": "a"}', "NodeNames must be a list"),
        (b'{"Pod": {}, "NodeNames": ["a", 1]}', "only strings"),
        (b'{"Pod": {}, "Nodes": {"items": [{}]}}', "not a Node"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": null}', "neither NodeNames nor Nodes"),
    ],
)
def test_bad_extender_args(body: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        extender_args(decode(body))


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"PodName": "p", "PodNamespace": "d", "PodUID": "u"}, "Node must be"),
        ({"PodName": 1, "PodNamespace": "d", "PodUID": "u", "Node": "n"}, "PodName must be"),
    ],
)
def test_bad_binding_args(doc: dict[str, Any], reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        binding_args(doc)


def test_bad_preemption_args() -> None:
    with pytest.raises(WireError, match="Pods must be a list"):
        preemption_args({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": 3}}})
    with pytest.raises(WireError, match="has no UID"):
        preemption_args({"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}})
    with pytest.raises(WireError, match="NumPDBViolations must be an integer"):
        preemption_args(
            {"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": "1"}}}
        )


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(0, 10)), max_size=40),
)
def test_priority_encoder_writes_what_orjson_writes(rows: list[tuple[str, int]]) -> None:
    encoder = HostPriorityEncoder(max_hosts=8)  # small: the cache also starts afresh
    hosts = [h for h, _ in rows]
    scores = [s for _, s in rows]
    for _ in range(2):  # cold, then from the cached prefixes
        got = encoder.encode(hosts, scores)
        assert orjson.loads(got) == [{"Host": h, "Score": s} for h, s in rows]
