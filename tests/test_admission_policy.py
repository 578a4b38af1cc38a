"""deploy/base/admission-policy.yaml (only mpsched decides an allocation, in CEL): every
expression of the ValidatingAdmissionPolicy is compiled with cel-python and evaluated against
pod requests as kube-apiserver binds them (tests/webhook/cel_policy.py). Every request a test
admits also checks that the matchConditions never skip a request the validations would deny."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY, VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import parse_review
from tests.http.kube_objects import Json, pod
from tests.webhook.cel_policy import (
    EXEMPTION,
    POLICY_FILE,
    SCOPE,
    TENANT,
    Decision,
    policy,
    policy_documents,
)
from tests.webhook.reviews import apply_patch, review

_documents = policy_documents
_policy = policy
DEPLOY = POLICY_FILE.parents[1]
MPSCHED = "system:serviceaccount:mpsched-system:mpsched"
WEBHOOK = AdmissionSettings.from_config(Config.default())
GUARDED = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
)
#: What a bind writes (the issue's forged example claims 5 whole H100s the same way).
ALLOCATION = '{"containers":[{"name":"main","threads":10}],"gpus":[{"index":0}],"v":1}'


def create(obj: Json, *, user: str = TENANT) -> Decision:
    return _policy().admit("CREATE", obj, user=user)


def update(old: Json, new: Json, *, user: str = TENANT) -> Decision:
    return _policy().admit("UPDATE", new, old, user=user)


# --- pods as the API server holds them ------------------------------------------------------


def submitted(obj: Json) -> Json:
    """A pod as a client submits it: generateName instead of a name, no uid, no status."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["generateName"] = meta.pop("name") + "-"
    del meta["uid"]
    if not meta["annotations"]:
        del meta["annotations"]
    del obj["status"]
    return obj


def _field_ref(key: str) -> Json:
    return {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{key}']"}}


def mutated(obj: Json) -> Json:
    """The pod as the mutating webhook leaves it: its own decision, applied."""
    body = review(obj)
    decision = mutate(parse_review(body), WEBHOOK)
    assert decision.allowed, decision.message
    return apply_patch(obj, decision.patch)


def bound(obj: Json, node: str = "gpu-1") -> Json:
    """The pod after mpsched's Binding: nodeName and the allocation annotations, one write."""
    obj = copy.deepcopy(obj)
    obj["spec"]["nodeName"] = node
    obj["metadata"].setdefault("annotations", {}).update(
        {
            ALLOCATION_KEY: ALLOCATION,
            VISIBLE_DEVICES_KEY: "GPU-gpu-1-0",
            threads_key("main"): "10",
            mem_limit_key("main"): "0=4096M",
        }
    )
    return obj


def share_pod(name: str = "train", **kw: Any) -> Json:
    return submitted(pod(name, threads=10, memory="4Gi", **kw))


def with_init(obj: Json, container: Json) -> Json:
    obj = copy.deepcopy(obj)
    obj["spec"].setdefault("initContainers", []).append(container)
    return obj


def with_env(obj: Json, index: int, *entries: Json, init: bool = False) -> Json:
    obj = copy.deepcopy(obj)
    container = obj["spec"]["initContainers" if init else "containers"][index]
    container.setdefault("env", []).extend(entries)
    return obj


def _denied(decision: Decision, *fragments: str) -> None:
    assert decision.evaluated
    assert not decision.allowed
    assert all(f in decision.denials[0] for f in fragments), decision.denials


# --- the manifest ---------------------------------------------------------------------------


def test_manifest_is_a_policy_and_its_deny_binding_on_pod_create_and_update() -> None:
    policy, binding = _documents()
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "paramRef" not in binding["spec"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert "paramKind" not in spec
    (rule,) = spec["matchConstraints"]["resourceRules"]
    # Pods only: pods/binding (mpsched's Binding) and pods/status (kubelet) are not matched.
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["pods", "pods/ephemeralcontainers"],
    }
    for validation in spec["validations"]:
        assert validation["messageExpression"]
        assert validation["message"] and "\n" not in validation["message"]
        assert validation["reason"] == "Forbidden"
    names = [v["name"] for v in spec["variables"]]
    assert len(set(names)) == len(names)
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert POLICY_FILE.name in kustomization["resources"]


def test_the_exemption_is_mpscheds_service_account_in_one_place() -> None:
    text = POLICY_FILE.read_text()
    assert text.count(f"'{MPSCHED}'") == 1
    rbac = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text())
    }
    _, namespace, name = MPSCHED.rsplit(":", 2)
    assert ("ServiceAccount", namespace, name) in rbac


def test_every_expression_compiles_with_cel_python() -> None:
    policy = _policy()
    assert [name for name, _ in policy.conditions] == [EXEMPTION, SCOPE]
    assert len(policy.validations) == 6


# --- pods that touch nothing of mpsched's ---------------------------------------------------


def test_a_cpu_only_pod_is_not_evaluated() -> None:
    web = submitted(pod("web", node="cpu-1"))  # nodeName preset: fine without mpsched.io/*
    assert create(web) == Decision(evaluated=False, denials=())
    relabelled = copy.deepcopy(web)
    relabelled["metadata"]["labels"] = {"tier": "front"}
    assert update(web, relabelled) == Decision(evaluated=False, denials=())


def test_env_vars_in_a_pod_that_asks_for_nothing_are_out_of_scope() -> None:
    # The MPS control daemon, the GPU operator and mpsched's agent set these as literals; a
    # pod that asks for nothing gets no allocation (see the policy's header).
    daemon = with_env(
        submitted(pod("mps-control")),
        0,
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/run/nvidia/mps"},
    )
    assert create(daemon) == Decision(evaluated=False, denials=())


def test_non_mpsched_annotations_are_not_evaluated() -> None:
    web = submitted(pod("web", annotations={"example.com/owner": "a", "notmpsched.io/x": "1"}))
    assert create(web) == Decision(evaluated=False, denials=())


# --- rule 1: no mpsched.io/ annotation on CREATE --------------------------------------------


def test_the_forged_allocation_from_the_issue_is_denied() -> None:
    forged = submitted(
        pod(
            "squatter",
            node="gpu-1",
            annotations={
                ALLOCATION_KEY: '{"gpus":[0,1,2,3,4],"kind":"whole","model":"H100","v":1}'
            },
        )
    )
    _denied(create(forged), f"annotation '{ALLOCATION_KEY}'", "written only by the mpsched")


@pytest.mark.parametrize(
    "key", [ALLOCATION_KEY, VISIBLE_DEVICES_KEY, threads_key("main"), "mpsched.io/anything"]
)
def test_any_mpsched_annotation_on_create_is_denied(key: str) -> None:
    _denied(create(share_pod(annotations={key: "1"})), f"annotation '{key}'")


def test_several_forged_annotations_are_counted_in_the_message() -> None:
    forged = share_pod(annotations={ALLOCATION_KEY: ALLOCATION, VISIBLE_DEVICES_KEY: "0"})
    _denied(create(forged), "(and 1 more mpsched.io/ annotations)")


def test_mpsched_may_create_a_pod_with_its_annotations() -> None:
    assert create(bound(share_pod()), user=MPSCHED) == Decision(evaluated=False, denials=())


def test_a_tenant_service_account_is_not_exempt() -> None:
    other = "system:serviceaccount:team-a:mpsched"
    _denied(create(share_pod(annotations={ALLOCATION_KEY: ALLOCATION}), user=other))


# --- rule 2: UPDATE leaves mpsched.io/ annotations as they are ------------------------------


def test_an_update_that_leaves_the_allocation_alone_is_allowed() -> None:
    running = bound(mutated(share_pod()))
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["labels"] = {"team": "a"}
    relabelled["metadata"]["annotations"]["example.com/note"] = "hi"
    assert update(running, relabelled) == Decision(evaluated=True, denials=())


def test_an_update_that_changes_the_allocation_is_denied() -> None:
    running = bound(mutated(share_pod()))
    edited = copy.deepcopy(running)
    edited["metadata"]["annotations"][threads_key("main")] = "100"
    _denied(update(running, edited), f"annotation '{threads_key('main')}'", "leave them")


def test_an_update_that_removes_the_allocation_is_denied() -> None:
    running = bound(mutated(share_pod()))
    stripped = copy.deepcopy(running)
    del stripped["metadata"]["annotations"][ALLOCATION_KEY]
    _denied(update(running, stripped), f"annotation '{ALLOCATION_KEY}'")
    emptied = copy.deepcopy(running)
    del emptied["metadata"]["annotations"]
    _denied(update(running, emptied), "(and 3 more mpsched.io/ annotations)")


def test_an_update_that_adds_an_allocation_is_denied() -> None:
    pending = mutated(share_pod())
    claimed = copy.deepcopy(pending)
    claimed["metadata"]["annotations"] = {ALLOCATION_KEY: ALLOCATION}
    _denied(update(pending, claimed), f"annotation '{ALLOCATION_KEY}'")


def test_mpsched_may_update_the_annotations() -> None:
    running = bound(mutated(share_pod()))
    edited = copy.deepcopy(running)
    edited["metadata"]["annotations"][ALLOCATION_KEY] = "{}"
    assert update(running, edited, user=MPSCHED).allowed


def test_a_pod_admitted_before_the_policy_can_still_be_relabelled() -> None:
    # Rule 1 is for CREATE: a forged annotation from before stays, unchanged, and a controller
    # can still update the pod (e.g. remove its finalizer); the ledger ignores it (rule 2).
    old = bound(submitted(pod("legacy", threads=10)))
    old["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    old["metadata"]["finalizers"] = ["example.com/cleanup"]
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    assert update(old, new) == Decision(evaluated=True, denials=())


# --- rule 3: no preset spec.nodeName with mpsched.io/* --------------------------------------


def test_a_share_pod_with_a_preset_node_is_denied() -> None:
    _denied(create(share_pod(node="gpu-1")), "container 'main'", "spec.nodeName 'gpu-1'")


@pytest.mark.parametrize("resource", ["threads", "memory", "units", "gpus", "clients"])
def test_every_mpsched_resource_counts_in_limits_or_requests(resource: str) -> None:
    obj = submitted(pod("p", node="gpu-1"))
    obj["spec"]["containers"][0]["resources"] = {"requests": {f"mpsched.io/{resource}": "1"}}
    _denied(create(obj), "spec.nodeName")
    obj["spec"]["containers"][0]["resources"] = {"limits": {f"mpsched.io/{resource}": "1"}}
    _denied(create(obj), "spec.nodeName")


def test_an_init_container_asking_with_a_preset_node_is_denied() -> None:
    obj = with_init(
        submitted(pod("p", node="gpu-1")),
        {"name": "warmup", "image": "x", "resources": {"limits": {"mpsched.io/units": "1"}}},
    )
    _denied(create(obj), "container 'warmup'", "spec.nodeName")


def test_a_share_pod_left_to_the_scheduler_is_allowed() -> None:
    assert create(mutated(share_pod())) == Decision(evaluated=True, denials=())
    assert create(mutated(share_pod(node="gpu-1")), user=MPSCHED).allowed


# --- rule 4: the injected env vars only as the webhook injects them -------------------------


def test_the_webhooks_env_is_allowed_for_every_kind_of_request() -> None:
    whole = submitted(pod("whole", gpus=2))
    units = submitted(pod("units", units=1))
    two = share_pod()
    two["spec"]["containers"].append(
        {"name": "side", "image": "x", "resources": {"limits": {"mpsched.io/threads": "5"}}}
    )
    two["spec"]["containers"].append({"name": "plain", "image": "x"})  # asks for nothing
    init = with_init(
        share_pod(),
        {"name": "prep", "image": "x", "resources": {"limits": {"mpsched.io/threads": "5"}}},
    )
    for obj in (share_pod(), whole, units, two, init):
        decision = create(mutated(obj))
        assert decision == Decision(evaluated=True, denials=()), obj["metadata"]


def test_a_long_container_names_hashed_keys_are_allowed() -> None:
    obj = share_pod()
    obj["spec"]["containers"][0]["name"] = "c" * 63  # keys are cut and hashed (codec)
    assert threads_key("c" * 63) != f"mpsched.io/threads.{'c' * 63}"
    assert create(mutated(obj)).allowed


@pytest.mark.parametrize("name", GUARDED[:3])
def test_a_literal_value_is_denied(name: str) -> None:
    obj = with_env(share_pod(), 0, {"name": name, "value": "100"})
    _denied(create(obj), f"container 'main' sets {name}", "webhook injects")
    # ... also next to the webhook's own entry for that variable.
    _denied(create(with_env(mutated(share_pod()), 0, {"name": name, "value": "100"})), name)


@pytest.mark.parametrize(
    "source",
    [
        {"secretKeyRef": {"name": "s", "key": "k"}},
        {"configMapKeyRef": {"name": "c", "key": "k"}},
        {"fieldRef": {"fieldPath": "metadata.annotations['example.com/gpus']"}},
        {"fieldRef": {"fieldPath": "metadata.name"}},
        {"resourceFieldRef": {"resource": "limits.cpu"}},
    ],
)
def test_any_other_source_is_denied(source: Json) -> None:
    for name in GUARDED:
        obj = with_env(share_pod(), 0, {"name": name, "valueFrom": source})
        _denied(create(obj), f"sets {name}")


def test_a_value_beside_the_fieldref_is_denied() -> None:
    # The API server's own pod validation forbids both; the policy does not rely on it.
    entry = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    entry["valueFrom"] = _field_ref(VISIBLE_DEVICES_KEY)  # type: ignore[assignment]
    _denied(create(with_env(share_pod(), 0, entry)), "sets NVIDIA_VISIBLE_DEVICES")


def test_a_fieldref_to_another_containers_key_is_denied() -> None:
    obj = share_pod()
    obj["spec"]["containers"].append(
        {"name": "big", "image": "x", "resources": {"limits": {"mpsched.io/threads": "90"}}}
    )
    obj = with_env(
        obj,
        0,
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "valueFrom": _field_ref(threads_key("big"))},
    )
    _denied(create(obj), "container 'main' sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    swapped = with_env(
        share_pod(),
        0,
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "valueFrom": _field_ref(threads_key("main"))},
    )
    _denied(create(swapped), "sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


def test_a_container_that_asks_for_nothing_cannot_read_the_pods_gpus() -> None:
    obj = share_pod()
    obj["spec"]["containers"].append(
        {
            "name": "stowaway",
            "image": "x",
            "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": _field_ref(VISIBLE_DEVICES_KEY)}
            ],
        }
    )
    _denied(create(mutated(obj)), "container 'stowaway' sets NVIDIA_VISIBLE_DEVICES")


def test_an_init_container_literal_is_denied() -> None:
    obj = with_init(
        share_pod(),
        {
            "name": "prep",
            "image": "x",
            "resources": {"limits": {"mpsched.io/threads": "5"}},
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        },
    )
    _denied(create(mutated(obj)), "container 'prep' sets NVIDIA_VISIBLE_DEVICES")


def test_the_pipe_directory_may_be_any_absolute_path_and_nothing_else() -> None:
    pipe = "CUDA_MPS_PIPE_DIRECTORY"
    assert create(with_env(share_pod(), 0, {"name": pipe, "value": "/run/mps/pipe"})).allowed
    _denied(create(with_env(share_pod(), 0, {"name": pipe, "value": "tmp/nvidia-mps"})), pipe)
    _denied(create(with_env(share_pod(), 0, {"name": pipe})), pipe)  # empty value


def test_violations_in_several_containers_are_counted() -> None:
    obj = share_pod()
    obj["spec"]["containers"].append(
        {
            "name": "b",
            "image": "x",
            "resources": {"limits": {"mpsched.io/threads": "5"}},
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
        }
    )
    obj = with_env(obj, 0, {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"})
    _denied(create(obj), "container 'main' sets", "(and 1 more containers)")


def test_other_env_vars_are_fine() -> None:
    obj = with_env(
        share_pod(),
        0,
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    )
    assert create(mutated(obj)).allowed


def test_rules_3_and_4_are_for_create_only() -> None:
    # nodeName and env cannot change in an UPDATE; a bound pod with the webhook's env and a
    # label change passes even though it now has a nodeName.
    running = bound(mutated(share_pod()))
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert update(running, relabelled).allowed


def test_several_rules_deny_together() -> None:
    obj = with_env(
        share_pod(node="gpu-1", annotations={ALLOCATION_KEY: ALLOCATION}),
        0,
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    )
    decision = create(obj)
    assert len(decision.denials) == 3, decision.denials


def test_the_policys_connection_limit_is_the_webhooks() -> None:
    (variable,) = [v for v in _policy().spec["variables"] if v["name"] == "maxDeviceConnections"]
    sample = yaml.safe_load((DEPLOY.parent / "config" / "mpsched.yaml").read_text())
    assert int(variable["expression"]) == WEBHOOK.webhook.device_max_connections
    assert sample["webhook"]["deviceMaxConnections"] == WEBHOOK.webhook.device_max_connections
