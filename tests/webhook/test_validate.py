"""`/validate`'s decisions on real AdmissionReview requests: the request checked in the words
`/filter` uses; a pod may not set the injected env vars, carry `mpsched.io/` annotations on
CREATE, add, change or remove them on UPDATE, or preset spec.nodeName while asking for
`mpsched.io/*` — unless mpsched's own service account sends it; a pod that asks for nothing
and carries no such annotation always passes. Every way of steering from issue 8 is a case."""

from __future__ import annotations

import copy

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY, VISIBLE_DEVICES_KEY, threads_key
from extender.service import ExtenderService
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import Decision, parse_review
from extender.webhook.validation import validate
from tests.http.kube_objects import gpu_node
from tests.webhook.reviews import (
    MPSCHED,
    Json,
    apply_patch,
    container,
    created,
    pod_object,
    review,
)

DEFAULT = AdmissionSettings.from_config(Config.default())
SHARE = {"mpsched.io/threads": "25"}
FORGED = '{"v":1,"node":"n","kind":"whole","gpus":[{"index":0,"uuid":"GPU-0"}],"threads":0,"memoryMiB":0,"clients":0,"containers":[]}'  # noqa: E501


def _validate(obj: Json | None, **kwargs: object) -> Decision:
    return validate(parse_review(review(obj, **kwargs)), DEFAULT)  # type: ignore[arg-type]


def _mutated(obj: Json) -> Json:
    return apply_patch(obj, mutate(parse_review(review(obj)), DEFAULT).patch)


def test_a_mutated_gpu_pod_passes() -> None:
    for limits in (SHARE, {"mpsched.io/units": "2"}, {"mpsched.io/gpus": "1"}):
        init = [container("i", limits=limits)]
        obj = _mutated(pod_object(container(limits=limits), init=init))
        decision = _validate(obj)
        assert decision.allowed, decision.message


def test_dry_run_is_decided_like_any_request() -> None:
    bad = pod_object(container(limits={"mpsched.io/threads": "0"}))
    assert _validate(bad, dry_run=True) == _validate(bad)
    assert not _validate(bad, dry_run=True).allowed


async def test_invalid_requests_are_refused_in_filters_words() -> None:
    obj = pod_object(container(limits={"mpsched.io/threads": "30", "mpsched.io/units": "1"}))
    decision = _validate(obj)
    assert not decision.allowed and decision.code == 422
    # The same pod through the extender's filter: the same reason, word for word.
    service = ExtenderService(
        cluster=EmbeddedCluster.from_objects([gpu_node("a")]), config=Config.default()
    )
    await service.start()
    try:
        out = service.filter(created(obj), ["a"])
    finally:
        await service.close()
    assert out.unresolvable["a"] == decision.message
    assert decision.message.startswith("invalid mpsched request: container 'main': ")


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ([{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}], "THREAD_PERCENTAGE"),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "NVIDIA_VISIBLE_DEVICES"),
        ([{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}], "MEM_LIMIT"),
        # Any absolute path only selects a daemon (the policy agrees); a relative one is no path.
        ([{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "other"}], "PIPE_DIRECTORY"),
        # A fieldRef to another container's share is steering too.
        (
            [
                {
                    "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": f"metadata.annotations['{threads_key('other')}']"}
                    },
                }
            ],
            "THREAD",
        ),
    ],
)
def test_pods_may_not_set_the_injected_env_vars(env: list[Json], var: str) -> None:
    obj = _mutated(pod_object(container(limits=SHARE, env=env)))
    decision = _validate(obj)
    assert not decision.allowed
    assert decision.message.startswith("container 'main': env ")
    assert var in decision.message and "set by the pod" in decision.message


def test_a_container_asking_for_nothing_may_not_borrow_the_pods_gpu() -> None:
    ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{VISIBLE_DEVICES_KEY}']"}}
    obj = _mutated(
        pod_object(
            container(limits=SHARE),
            container("sneak", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": ref}]),
        )
    )
    decision = _validate(obj)
    assert not decision.allowed
    assert decision.message == (
        "container 'sneak' sets NVIDIA_VISIBLE_DEVICES but asks for no mpsched.io share: only "
        "containers that ask for an mpsched.io share reach the GPU and its MPS daemon"
    )


def test_annotations_on_create_are_refused_even_on_pods_that_ask_for_nothing() -> None:
    # Issue 8: a pod asking for nothing, nodeName preset, a self-written allocation.
    obj = pod_object(container(), nodeName="gpu-node-1")
    obj["metadata"]["annotations"] = {ALLOCATION_KEY: FORGED, "team": "a"}
    decision = _validate(obj)
    assert not decision.allowed
    assert decision.message.startswith(
        "metadata.annotations: a pod may not set mpsched.io/allocation: only mpsched's service "
        "account (system:serviceaccount:mpsched-system:mpsched) writes them, when it binds"
    )


def test_a_gpu_pod_may_not_preset_its_node() -> None:
    decision = _validate(_mutated(pod_object(container(limits=SHARE), nodeName="gpu-node-1")))
    assert not decision.allowed
    assert decision.message.startswith("spec.nodeName: a pod asking for mpsched.io/* resources")
    assert "'gpu-node-1'" in decision.message
    # A pod that asks for nothing may.
    assert _validate(pod_object(container(), nodeName="gpu-node-1")).allowed


def test_every_problem_is_named_at_once() -> None:
    obj = pod_object(
        container(limits=SHARE, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]),
        nodeName="n1",
    )
    obj["metadata"]["annotations"] = {VISIBLE_DEVICES_KEY: "GPU-x"}
    parts = _validate(obj).message.split("; ")
    assert [p.split(":")[0] for p in parts] == [
        "metadata.annotations",
        "spec.nodeName",
        "container 'main'",
    ]


def _bound(annotations: dict[str, str]) -> Json:
    pod = created(_mutated(pod_object(container(limits=SHARE))))
    pod["metadata"]["annotations"] = dict(annotations)
    pod["spec"]["nodeName"] = "gpu-node-1"
    return pod


@pytest.mark.parametrize(
    ("old", "new", "verb"),
    [
        ({}, {ALLOCATION_KEY: FORGED}, "add"),
        ({threads_key("main"): "25"}, {threads_key("main"): "100"}, "change"),
        ({ALLOCATION_KEY: FORGED}, {}, "remove"),
    ],
)
def test_updates_may_not_touch_mpsched_annotations(
    old: dict[str, str], new: dict[str, str], verb: str
) -> None:
    decision = _validate(_bound(new), operation="UPDATE", old=_bound(old))
    assert not decision.allowed
    assert decision.message.startswith(f"metadata.annotations: an update may not {verb} ")


def test_updates_that_leave_them_alone_pass() -> None:
    old = _bound({ALLOCATION_KEY: FORGED, "a": "1"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["a"] = "2"
    new["metadata"]["finalizers"] = []
    assert _validate(new, operation="UPDATE", old=old).allowed


def test_mpsched_itself_may_do_all_of_it() -> None:
    obj = pod_object(container(limits=SHARE), nodeName="n1")
    obj["metadata"]["annotations"] = {ALLOCATION_KEY: FORGED}
    assert _validate(obj, username=MPSCHED).allowed
    assert _validate(_bound({}), operation="UPDATE", old=_bound({ALLOCATION_KEY: FORGED}),
                     username=MPSCHED).allowed  # fmt: skip
    assert not _validate(obj, username="system:serviceaccount:mpsched-system:other").allowed


def test_pods_that_ask_for_nothing_always_pass() -> None:
    plain = pod_object(container(limits={"cpu": "1", "nvidia.com/gpu": "1"}))
    assert _validate(plain).allowed
    old = created(plain)
    assert _validate(old, operation="UPDATE", old=old).allowed
    assert _validate(None, operation="DELETE", old=old).allowed


def test_wrong_types_in_the_object_are_denied_with_the_field() -> None:
    for spec, where in (
        ({"containers": "x"}, "spec.containers must be a list"),
        ({"containers": [{"name": "a", "resources": []}]}, "resources must be an object"),
    ):
        decision = _validate({"kind": "Pod", "apiVersion": "v1", "metadata": {}, "spec": spec})
        assert not decision.allowed and decision.code == 400
        assert where in decision.message
    assert _validate(None).code == 400  # CREATE without an object
