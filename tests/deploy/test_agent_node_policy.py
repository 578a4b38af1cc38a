"""deploy/base/agent-node-policy.yaml: every expression of the ValidatingAdmissionPolicy is
compiled with cel-python and evaluated against Node requests as kube-apiserver binds them
(`object`, `oldObject`, `request` with the token's userInfo, `variables` first). The agent's
token may patch its own Node's mpsched keys, and nothing else: another Node, another key,
the spec, a token that names no node. Requests of other users are not evaluated."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from extender.agent.inventory import AGENT_KEY, MPS_READY_LABEL
from extender.packing.codec import INVENTORY_KEY

Json = dict[str, Any]
POLICY = Path(__file__).resolve().parents[2] / "deploy" / "base" / "agent-node-policy.yaml"
AGENT = "system:serviceaccount:mpsched-node:mpsched-agent"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def _value(program: celpy.Runner, activation: dict[str, Any], what: str) -> Any:
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:  # failurePolicy Fail would deny; no sample may get here
        raise AssertionError(f"{what}: evaluation error {exc.args[:2]}") from None
    if isinstance(result, CELEvalError):
        raise AssertionError(f"{what}: evaluation error {result.args[:2]}")
    return result


@cache
def _documents() -> tuple[Json, ...]:
    return tuple(d for d in yaml.safe_load_all(POLICY.read_text()) if d)


@cache
def _compiled() -> tuple[Any, Any, Any]:
    spec = _documents()[0]["spec"]
    env = celpy.Environment()

    def compile_(text: str) -> celpy.Runner:
        return env.program(env.compile(text))

    return (
        [compile_(m["expression"]) for m in spec["matchConditions"]],
        [(v["name"], compile_(v["expression"])) for v in spec["variables"]],
        [
            (compile_(v["expression"]), compile_(v["messageExpression"]))
            for v in spec["validations"]
        ],
    )


def admit(
    operation: str,
    name: str,
    new: Json | None,
    old: Json | None,
    *,
    user: str = AGENT,
    bound: str | None = "gpu-1",
) -> tuple[bool, list[str]]:
    """(evaluated, denial messages) for one request on Node `name`."""
    conditions, variables, validations = _compiled()
    extra = {NODE_NAME_KEY: [bound], "authentication.kubernetes.io/pod-name": ["agent-x"]}
    user_info: Json = {"username": user, "uid": "u-1", "groups": ["system:serviceaccounts"]}
    if bound is not None:
        user_info["extra"] = extra
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": name,
        "operation": operation,
        "userInfo": user_info,
        "dryRun": False,
    }
    activation: dict[str, Any] = {
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
    }
    if not all(_value(c, activation, "matchCondition") for c in conditions):
        return False, []
    values = celtypes.MapType()
    activation["variables"] = values
    for var, program in variables:
        values[celtypes.StringType(var)] = _value(program, activation, f"variable {var}")
    denials = [
        str(_value(message, activation, "messageExpression"))
        for check, message in validations
        if not _value(check, activation, "validation")
    ]
    return True, denials


def node(name: str = "gpu-1") -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "9b1e2c3d-0000-4000-8000-000000000001",
            "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", INVENTORY_KEY: "[]"},
        },
        "spec": {"podCIDR": "10.0.1.0/24"},
    }


def patched(before: Json, *, annotations: Json | None = None, labels: Json | None = None) -> Json:
    """`before` with a merge patch of metadata (a None value removes the key)."""
    after = copy.deepcopy(before)
    for section, change in (("annotations", annotations), ("labels", labels)):
        for key, value in (change or {}).items():
            if value is None:
                after["metadata"][section].pop(key, None)
            else:
                after["metadata"][section][key] = value
    return after


def update(before: Json, after: Json, **kwargs: Any) -> tuple[bool, list[str]]:
    return admit("UPDATE", before["metadata"]["name"], after, before, **kwargs)


def test_the_agent_patches_its_own_nodes_mpsched_keys() -> None:
    before = node()
    after = patched(
        before,
        annotations={INVENTORY_KEY: '[{"index":0}]', AGENT_KEY: "{}"},
        labels={MPS_READY_LABEL: "true"},
    )
    assert update(before, after) == (True, [])
    # removing its own keys, and a patch that changes nothing, are its own business too
    assert update(after, patched(after, annotations={AGENT_KEY: None})) == (True, [])
    assert update(before, copy.deepcopy(before)) == (True, [])


def test_a_node_without_annotations_or_labels_yet() -> None:
    bare = node()
    del bare["metadata"]["annotations"], bare["metadata"]["labels"]
    after = copy.deepcopy(bare)
    after["metadata"]["annotations"] = {INVENTORY_KEY: "[]"}
    after["metadata"]["labels"] = {MPS_READY_LABEL: "false"}
    assert update(bare, after) == (True, [])


def test_another_node_is_refused() -> None:
    before = node("gpu-2")
    after = patched(before, annotations={INVENTORY_KEY: '[{"memoryMiB":99999999}]'})
    evaluated, denials = update(before, after)
    assert evaluated and denials == [
        "the mpsched agent of node gpu-1 may only patch that Node, not UPDATE gpu-2"
    ]


@pytest.mark.parametrize(
    ("annotations", "labels", "denied"),
    [
        ({"node.alpha.kubernetes.io/ttl": "30"}, None, "annotations"),
        ({"example.com/owner": "me"}, None, "annotations"),
        ({"node.alpha.kubernetes.io/ttl": None}, None, "annotations"),
        ({"mpsched.io/allocation": "{}"}, None, "annotations"),  # mpsched's, not the agent's
        (None, {"node-role.kubernetes.io/control-plane": ""}, "label"),
        (None, {"nvidia.com/gpu.present": "false"}, "label"),
        (None, {"kubernetes.io/hostname": None}, "label"),
        (None, {"mpsched.io/pool": "a"}, "label"),
    ],
)
def test_any_other_key_is_refused(
    annotations: Json | None, labels: Json | None, denied: str
) -> None:
    before = node()
    after = patched(before, annotations=annotations, labels=labels)
    evaluated, denials = update(before, after)
    assert evaluated and len(denials) == 1 and f"change only the {denied}" in denials[0]


def test_the_spec_and_owners_are_refused() -> None:
    before = node()
    for change in (
        {"unschedulable": True},
        {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        {"podCIDR": "10.9.0.0/24"},
    ):
        after = copy.deepcopy(before)
        after["spec"].update(change)
        assert update(before, after)[1] == [
            "the mpsched agent may not change its Node's spec, ownerReferences or finalizers"
        ]
    after = copy.deepcopy(before)
    after["metadata"]["finalizers"] = ["example.com/hold"]
    assert len(update(before, after)[1]) == 1


def test_a_token_that_names_no_node_is_refused() -> None:
    before = node()
    after = patched(before, labels={MPS_READY_LABEL: "true"})
    evaluated, denials = update(before, after, bound=None)
    assert evaluated
    assert denials[0] == (
        "the mpsched agent must use its pod's token, which names its node; this token names none"
    )


def test_create_and_delete_are_refused() -> None:
    assert admit("CREATE", "gpu-1", node(), None)[1]
    assert admit("DELETE", "gpu-1", None, node())[1]


def test_other_users_are_not_evaluated() -> None:
    before = node("gpu-2")
    after = patched(before, labels={"node-role.kubernetes.io/worker": ""})
    assert admit("UPDATE", "gpu-2", after, before, user="system:node:gpu-2") == (False, [])


def test_the_binding_denies_and_the_agent_account_matches_the_daemonset() -> None:
    policy, binding = _documents()
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    daemonset = Path(__file__).resolve().parents[2] / "deploy" / "base" / "agent-daemonset.yaml"
    accounts = [
        d for d in yaml.safe_load_all(daemonset.read_text()) if d["kind"] == "ServiceAccount"
    ]
    (account,) = accounts
    meta = account["metadata"]
    assert f"system:serviceaccount:{meta['namespace']}:{meta['name']}" == AGENT
