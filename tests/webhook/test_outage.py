"""Issue 33 item 4: with the webhook unreachable, the rendered admission configuration of every
root still admits what running pods need and still refuses what only mpsched may write.

`admit` plays kube-apiserver's admission over the rendered objects: each webhook whose rules
match the request (operation, resource, subresource) and whose matchConditions hold (CEL,
cel-python) is called; the webhook being down, `failurePolicy: Fail` refuses the request and
`Ignore` lets it pass; then every ValidatingAdmissionPolicy bound with Deny is evaluated."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from extender.packing.codec import ALLOCATION_KEY, VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from tests.deploy.manifests import render, roots
from tests.webhook.cel_policy import TENANT, Policy, pod_request
from tests.webhook.reviews import REPLICASET_CONTROLLER, Json, container, created, pod_object

WEBHOOKS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
KUBELET = "system:node:gpu-1"
SHARE = {"mpsched.io/threads": "20", "mpsched.io/mps": "1"}


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    reasons: tuple[str, ...]


def _matches(rule: Json, operation: str, resource: str) -> bool:
    return (
        "" in rule["apiGroups"]
        and "v1" in rule["apiVersions"]
        and operation in rule["operations"]
        and resource in rule["resources"]
    )


def _conditions_hold(hook: Json, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    for condition in hook.get("matchConditions", ()):
        if not env.program(env.compile(condition["expression"])).evaluate(activation):
            return False
    return True


def admit(
    root: str,
    operation: str,
    obj: Json,
    old: Json | None = None,
    *,
    sub_resource: str = "",
    user: str = TENANT,
) -> Outcome:
    """The API server's admission of a pod request while no webhook replica answers."""
    docs = render(root)
    resource = "pods" + (f"/{sub_resource}" if sub_resource else "")
    request = pod_request(operation, obj, user=user, sub_resource=sub_resource)
    activation = {
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
    }
    reasons = []
    for config in (d for d in docs if d["kind"] in WEBHOOKS):
        for hook in config["webhooks"]:
            if not any(_matches(r, operation, resource) for r in hook["rules"]):
                continue
            if not _conditions_hold(hook, activation):
                continue
            if hook.get("failurePolicy", "Fail") == "Fail":
                reasons.append(f"failed calling webhook {hook['name']!r}: no endpoints")
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    for binding in bindings:
        assert "Deny" in binding["spec"]["validationActions"]
        (policy,) = [
            d
            for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"] == binding["spec"]["policyName"]
        ]
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        if not any(_matches(r, operation, resource) for r in rules):
            continue
        decision = Policy(policy["spec"]).admit(
            operation, obj, old, user=user, sub_resource=sub_resource
        )
        reasons += decision.denials
    return Outcome(not reasons, tuple(reasons))


def _running(finalizers: list[str] | None = None) -> Json:
    """A share pod as mutated, bound by mpsched and running."""
    pod = created(pod_object(container(limits=SHARE)), name="train-0")
    pod["spec"]["nodeName"] = "gpu-1"
    pod["metadata"]["annotations"] = {
        ALLOCATION_KEY: '{"containers":[{"name":"main","threads":20}],"gpus":[{"index":0}],"v":1}',
        VISIBLE_DEVICES_KEY: "GPU-gpu-1-0",
        threads_key("main"): "20",
        mem_limit_key("main"): "0=4096M",
    }
    pod["metadata"]["finalizers"] = finalizers or []
    pod["status"] = {"phase": "Running"}
    return pod


ROOTS = roots()


@pytest.mark.parametrize("root", ROOTS)
def test_running_gpu_pods_are_updated_and_deleted_while_the_webhook_is_down(root: str) -> None:
    old = _running(["example.com/cleanup"])
    old["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = []
    assert admit(root, "UPDATE", finalized, old, user=REPLICASET_CONTROLLER) == Outcome(True, ())
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["team"] = "b"
    assert admit(root, "UPDATE", relabelled, old).allowed
    status = copy.deepcopy(old)
    status["status"]["phase"] = "Succeeded"
    assert admit(root, "UPDATE", status, old, sub_resource="status", user=KUBELET).allowed
    assert admit(root, "DELETE", old, old).allowed
    # An honest debug container passes too (the validating webhook is Ignore).
    debugged = copy.deepcopy(old)
    debugged["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "busybox"}]
    assert admit(root, "UPDATE", debugged, old, sub_resource="ephemeralcontainers").allowed


@pytest.mark.parametrize("root", ROOTS)
def test_the_policy_still_refuses_a_self_made_allocation(root: str) -> None:
    forged = created(pod_object(container(limits={"cpu": "1"})), name="squatter")
    forged["metadata"]["annotations"] = {ALLOCATION_KEY: '{"gpus":[0,1,2,3],"kind":"whole","v":1}'}
    del forged["metadata"]["uid"]
    outcome = admit(root, "CREATE", forged)
    assert not outcome.allowed
    (reason,) = outcome.reasons  # the policy's alone: no webhook is asked about this pod
    assert f"annotation '{ALLOCATION_KEY}'" in reason
    # Writing one into a running pod is refused as well.
    old = _running()
    claimed = copy.deepcopy(old)
    claimed["metadata"]["annotations"][threads_key("main")] = "100"
    outcome = admit(root, "UPDATE", claimed, old)
    assert not outcome.allowed and f"annotation '{threads_key('main')}'" in outcome.reasons[0]
    # And a debug container that would reach the GPU.
    debugged = copy.deepcopy(old)
    debugged["spec"]["ephemeralContainers"] = [
        {
            "name": "dbg",
            "image": "busybox",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        }
    ]
    outcome = admit(root, "UPDATE", debugged, old, sub_resource="ephemeralcontainers")
    assert not outcome.allowed and "container 'dbg'" in outcome.reasons[0]


@pytest.mark.parametrize("root", ROOTS)
def test_only_new_gpu_pods_wait_for_the_webhook(root: str) -> None:
    gpu = pod_object(container(limits={"mpsched.io/threads": "20"}))
    gpu["metadata"]["name"] = "train-1"
    outcome = admit(root, "CREATE", gpu, user=REPLICASET_CONTROLLER)
    assert outcome == Outcome(False, ("failed calling webhook 'mutate.mpsched.io': no endpoints",))
    cpu = pod_object(container(limits={"cpu": "1"}))
    cpu["metadata"]["name"] = "web-1"
    assert admit(root, "CREATE", cpu, user=REPLICASET_CONTROLLER).allowed
