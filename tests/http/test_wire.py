"""Golden tests: upstream's compatibility fixtures (kube-scheduler extender/v1 types_test.go
TestCompatibility) decode, encode byte for byte, and
decode the same when the whole JSON is lowercased, as Go's case-insensitive decoder does."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.http.wire import (
    ExtenderArgs,
    ExtenderArgsDecoder,
    WireError,
    binding_args,
    binding_result,
    decode,
    extender_args,
    filter_answer,
    filter_result,
    host_priorities,
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
    encoded = host_priorities(["myhost"], [1])
    assert encoded.decode() == "[" + HOST_PRIORITY + "]"
    # Go cannot decode 5.0 into int64: scores are always written as integers.
    assert b"5.0" not in host_priorities(["h", "g"], [5, 5])
    assert host_priorities([], []) == b"[]"
    with pytest.raises(ValueError, match="2 hosts but 1 scores"):
        host_priorities(["a", "b"], [1])


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


#: Names as Kubernetes makes them, and names no node has but a request may carry: the spliced
#: encoding must not be fooled by quotes, backslashes, commas or control characters.
_HOST_NAMES = st.one_of(
    st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?", fullmatch=True),
    st.text(alphabet='",\\ab\x00\x1f\u00e9\U0001f600{}[]:', max_size=12),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(_HOST_NAMES, st.integers(0, 10)), max_size=40))
def test_host_priorities_writes_what_orjson_writes(rows: list[tuple[str, int]]) -> None:
    hosts = [h for h, _ in rows]
    scores = [s for _, s in rows]
    expected = orjson.dumps([{"Host": h, "Score": s} for h, s in rows])
    assert host_priorities(hosts, scores) == expected


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    names=st.lists(_HOST_NAMES, max_size=20),
    failed=st.dictionaries(_HOST_NAMES, st.text(max_size=30), max_size=5),
    unresolvable=st.dictionaries(_HOST_NAMES, st.text(max_size=30), max_size=5),
)
def test_filter_answer_writes_what_orjson_writes(
    names: list[str], failed: dict[str, str], unresolvable: dict[str, str]
) -> None:
    expected = orjson.dumps(
        filter_result(node_names=names, failed=failed, unresolvable=unresolvable)
    )
    assert filter_answer(orjson.dumps(names), failed, unresolvable) == expected


def _stateless(body: bytes) -> ExtenderArgs | str:
    try:
        return extender_args(decode(body))
    except WireError:
        return "WireError"


def _pod_doc(label: str) -> dict[str, Any]:
    # Labels that look like the NodeNames member, as a value and as a nested key after a
    # comma, must not fool the decoder.
    return {
        "metadata": {"name": "p", "labels": {"a": "1", label: ',"NodeNames":["x"]}'}},
        "spec": {},
    }


#: Few distinct values, so that successive bodies often share their beginning.
_NAME_LISTS = st.sampled_from([[], ["a"], ["a", "node-1"], ['q"uote', "c\\"]])
_LABELS = st.sampled_from(["app", "NodeNames", "x"])
_WELL_FORMED = st.one_of(
    # As kube-scheduler writes them: Pod, Nodes, NodeNames in that order, no spaces.
    st.builds(
        lambda label, names: orjson.dumps(
            {"Pod": _pod_doc(label), "Nodes": None, "NodeNames": names}
        ),
        _LABELS,
        st.one_of(st.none(), _NAME_LISTS),
    ),
    # The NodeList form (nodeCacheCapable: false).
    st.builds(
        lambda names: orjson.dumps(
            {
                "Pod": _pod_doc("app"),
                "Nodes": {"items": [{"metadata": {"name": n}} for n in names]},
                "NodeNames": None,
            }
        ),
        _NAME_LISTS,
    ),
    # Another key order: the last `,"NodeNames":` is then inside the Pod's labels.
    st.builds(
        lambda label, names: orjson.dumps(
            {"NodeNames": names, "Nodes": None, "Pod": _pod_doc(label)}
        ),
        _LABELS,
        _NAME_LISTS,
    ),
)


def _with_tail(body: bytes, tail: bytes) -> bytes:
    """`body` up to its last NodeNames member, then `tail` in place of the rest."""
    cut = body.rfind(b',"NodeNames":')
    return body + tail if cut < 0 else body[: cut + len(b',"NodeNames":')] + tail


_BODIES = st.one_of(
    _WELL_FORMED,
    # What shares their beginning but not their end: truncation, extra braces, wrong types.
    st.builds(
        _with_tail,
        _WELL_FORMED,
        st.sampled_from(
            [b'["a"]}', b'["a"]', b'["a"]}}', b"null}", b"1}", b'["a",1]}', b"}", b'["b"] }']
        ),
    ),
    st.binary(max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(bodies=st.lists(_BODIES, min_size=1, max_size=8), keep=st.integers(0, 3))
def test_args_decoder_answers_what_a_fresh_decode_answers(bodies: list[bytes], keep: int) -> None:
    decoder = ExtenderArgsDecoder()

    def check(body: bytes) -> ExtenderArgs | None:
        try:
            got: ExtenderArgs | str = decoder.decode(body)
        except WireError:
            got = "WireError"
        assert got == _stateless(body)
        if isinstance(got, ExtenderArgs) and got.names_json:
            assert orjson.loads(got.names_json) == got.node_names
        return got if isinstance(got, ExtenderArgs) else None

    for body in bodies:
        args = check(body)
        if args is not None and args.node_names is not None:
            # As prioritize's body follows filter's: the same beginning, the names that passed.
            answer = args.node_names[:keep]
            encoded = orjson.dumps(answer)
            again = check(_with_tail(body, encoded + b"}"))
            if again is not None and again.node_names is not None:
                assert again.node_names == answer
            # A later Pod member after the remembered beginning overrides it.
            check(_with_tail(body, b'["a"],"Pod":{},"NodeNames":' + encoded + b"}"))
            # Near misses of the names: more after them, less of them, members after the head.
            for tail in (
                b'["other"]}',
                encoded + b"}}",
                encoded[:-1] + b"}",
                encoded + b' ,"Pod":{}}',
            ):
                check(_with_tail(body, tail))


def test_args_decoder_reuses_the_pod_of_filter_for_prioritize() -> None:
    decoder = ExtenderArgsDecoder()
    pod = _pod_doc("app")
    first = decoder.decode(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]}))
    second = decoder.decode(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["b"]}))
    assert second.pod is first.pod  # decoded once: the service's parse cache hits
    assert second.node_names == ["b"]
    other = decoder.decode(orjson.dumps({"Pod": _pod_doc("db"), "Nodes": None, "NodeNames": ["b"]}))
    assert other.pod is not first.pod and other.pod == _pod_doc("db")
