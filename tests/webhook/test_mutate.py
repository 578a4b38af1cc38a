"""`/mutate`'s decisions on real AdmissionReview requests: the env vars and the `mpsched.io/mps`
resource a GPU pod gets (under `delivery: hostIPC`: the mount, volume and hostIPC), applied with
an RFC 6902 applier to every shape of pod (no env, no volumes, init containers, sidecars, env of
other names); re-admission adds nothing; containers and pods that ask for nothing are untouched;
each injection can be turned off."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from extender.config import Config
from extender.config_agent import InjectSettings, WebhookSettings
from extender.packing.codec import VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from extender.packing.podspec import MPS_DELIVERY, parse_pod
from extender.packing.settings import BudgetSettings
from extender.webhook.admission import (
    CONNECTIONS_ENV,
    MEM_LIMIT_ENV,
    PIPE_ENV,
    PIPE_VOLUME,
    THREADS_ENV,
    VISIBLE_DEVICES_ENV,
    AdmissionSettings,
    mutate,
)
from extender.webhook.patch import append_all, escape, pointer
from extender.webhook.review import parse_review
from tests.webhook.reviews import Json, PatchError, apply_patch, container, pod_object, review

DEFAULT = AdmissionSettings.from_config(Config.default())
PIPE = "/tmp/nvidia-mps"
HOST_IPC = dataclasses.replace(
    DEFAULT, webhook=dataclasses.replace(DEFAULT.webhook, delivery="hostIPC")
)


def _settings(**webhook: Any) -> AdmissionSettings:
    return dataclasses.replace(DEFAULT, webhook=dataclasses.replace(DEFAULT.webhook, **webhook))


def _mutated(obj: Json, settings: AdmissionSettings = DEFAULT) -> tuple[Json, list[Any]]:
    decision = mutate(parse_review(review(obj)), settings)
    assert decision.allowed, decision.message
    ops = list(decision.patch)
    return apply_patch(obj, ops), ops


def _env(pod: Json, name: str = "main") -> dict[str, Any]:
    spec = pod["spec"]
    (c,) = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    return {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", e.get("value"))
            for e in c.get("env", [])}  # fmt: skip


def _ref(key: str) -> str:
    return f"metadata.annotations['{key}']"


def test_share_container_gets_its_env_and_the_delivery_resource_only() -> None:
    obj = pod_object(container(limits={"mpsched.io/threads": "25"}))
    pod, _ = _mutated(obj)
    assert _env(pod) == {
        VISIBLE_DEVICES_ENV: _ref(VISIBLE_DEVICES_KEY),
        THREADS_ENV: _ref(threads_key("main")),
        MEM_LIMIT_ENV: _ref(mem_limit_key("main")),
        CONNECTIONS_ENV: "2",
    }
    spec = pod["spec"]
    resources = spec["containers"][0]["resources"]
    assert resources["limits"] == {"mpsched.io/threads": "25", MPS_DELIVERY: "1"}
    assert resources["requests"] == {"mpsched.io/threads": "25", MPS_DELIVERY: "1"}
    # No host namespace, no host path, no volume or mount: the node's device plugin mounts.
    assert "hostIPC" not in spec
    assert spec["volumes"] == obj["spec"]["volumes"]
    assert spec["containers"][0]["volumeMounts"] == obj["spec"]["containers"][0]["volumeMounts"]
    # The resource added is no ask: the pod's request reads the same.
    assert parse_pod(pod, DEFAULT.budgets) == parse_pod(obj, DEFAULT.budgets)


def test_host_ipc_delivery_gets_env_mount_volume_and_host_ipc() -> None:
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "25"})), HOST_IPC)
    assert _env(pod) == {
        VISIBLE_DEVICES_ENV: _ref(VISIBLE_DEVICES_KEY),
        THREADS_ENV: _ref(threads_key("main")),
        MEM_LIMIT_ENV: _ref(mem_limit_key("main")),
        PIPE_ENV: PIPE,
        CONNECTIONS_ENV: "2",
    }
    spec = pod["spec"]
    assert spec["hostIPC"] is True
    assert MPS_DELIVERY not in spec["containers"][0]["resources"]["limits"]
    assert {"name": PIPE_VOLUME, "mountPath": PIPE} in spec["containers"][0]["volumeMounts"]
    assert spec["volumes"][0]["name"] == "kube-api-access-x7k2p"  # kept, in place
    assert spec["volumes"][1] == {
        "name": PIPE_VOLUME,
        "hostPath": {"path": PIPE, "type": "Directory"},
    }


def test_a_connection_count_of_the_pods_own_is_kept_up_to_the_limit() -> None:
    mine = [{"name": CONNECTIONS_ENV, "value": "1"}]
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "5"}, env=mine)))
    assert _env(pod)[CONNECTIONS_ENV] == "1"
    for value in (
        {"value": "8"},
        {"value": "two"},
        {"valueFrom": {"fieldRef": {"fieldPath": "x"}}},
    ):
        env = [{"name": CONNECTIONS_ENV, **value}]
        obj = pod_object(container(limits={"mpsched.io/threads": "5"}, env=env))
        decision = mutate(parse_review(review(obj)), DEFAULT)
        assert not decision.allowed
        assert f"container 'main' sets {CONNECTIONS_ENV}" in decision.message
        assert "at most 2 connections" in decision.message
    # A whole-GPU container is no MPS client: its own count is its business.
    env = [{"name": CONNECTIONS_ENV, "value": "32"}]
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/gpus": "1"}, env=env)))
    assert _env(pod)[CONNECTIONS_ENV] == "32"


def test_whole_gpu_container_gets_visible_devices_only() -> None:
    pod, ops = _mutated(pod_object(container(limits={"mpsched.io/gpus": "2"})))
    assert _env(pod) == {VISIBLE_DEVICES_ENV: _ref(VISIBLE_DEVICES_KEY)}
    assert "hostIPC" not in pod["spec"]
    # No mpsched.io/mps: env, and the GPU toleration.
    assert [op["path"] for op in ops] == ["/spec/containers/0/env", "/spec/tolerations/-"]


@pytest.mark.parametrize("delivery", ["devicePlugin", "hostIPC"])
@pytest.mark.parametrize(
    "shape",
    ["bare", "no-volumes", "env-of-other-names", "init-and-sidecar", "null-env"],
)
def test_the_patch_applies_to_any_pod(shape: str, delivery: str) -> None:
    gpu = {"mpsched.io/units": "1"}
    obj: Json
    if shape == "bare":
        # Nothing the apiserver would default: no env, no mounts, no volumes, no resources.
        obj = {"kind": "Pod", "metadata": {"generateName": "x-"}, "spec": {"containers": [
            {"name": "main", "resources": {"limits": gpu}}]}}  # fmt: skip
    elif shape == "no-volumes":
        obj = pod_object(container(limits=gpu, volumeMounts=[]))
        obj["spec"].pop("volumes")
    elif shape == "env-of-other-names":
        obj = pod_object(container(limits=gpu, env=[{"name": "A", "value": "1"}]))
    elif shape == "null-env":
        obj = pod_object(container(limits=gpu, env=None, volumeMounts=None), volumes=None)
    else:
        obj = pod_object(
            container("app", limits={"mpsched.io/threads": "30"}),
            init=[
                container("fetch", limits={"mpsched.io/threads": "10"}),
                container("proxy", limits={"mpsched.io/threads": "5"}, restartPolicy="Always"),
                container("setup"),
            ],
        )
    pod, _ = _mutated(obj, _settings(delivery=delivery))
    spec = pod["spec"]
    names = [c["name"] for c in spec["containers"] + spec.get("initContainers", [])]
    for name in names:
        if name == "setup":
            assert "env" not in _find(spec, name)  # asks for nothing: untouched
            assert MPS_DELIVERY not in str(_find(spec, name))
            continue
        env = _env(pod, name)
        assert env[THREADS_ENV] == _ref(threads_key(name))
        limits = _find(spec, name)["resources"]["limits"]
        if delivery == "devicePlugin":
            assert PIPE_ENV not in env and limits[MPS_DELIVERY] == "1"
            continue
        assert env[PIPE_ENV] == PIPE and MPS_DELIVERY not in limits
        mounts = _find(spec, name)["volumeMounts"]
        assert [m["mountPath"] for m in mounts].count(PIPE) == 1
    if shape == "env-of-other-names":
        assert spec["containers"][0]["env"][0] == {"name": "A", "value": "1"}
    volumes = [v["name"] for v in spec.get("volumes") or []]
    assert volumes.count(PIPE_VOLUME) == (delivery == "hostIPC")


def _find(spec: Json, name: str) -> Json:
    c: Json
    (c,) = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    return c


@pytest.mark.parametrize("settings", [DEFAULT, HOST_IPC], ids=["devicePlugin", "hostIPC"])
def test_readmission_adds_nothing_twice(settings: AdmissionSettings) -> None:
    obj = pod_object(
        container("a", limits={"mpsched.io/threads": "20"}),
        container("b", limits={"mpsched.io/memory": "4Gi"}),
    )
    once, ops = _mutated(obj, settings)
    assert ops
    twice, again = _mutated(once, settings)
    assert again == [] and twice == once
    # Also when the API server defaulted the fieldRefs' apiVersion in between.
    for c in once["spec"]["containers"]:
        for e in c["env"]:
            if "valueFrom" in e:
                e["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    assert _mutated(once, settings)[1] == []


def test_pods_and_containers_that_ask_for_nothing_are_untouched() -> None:
    decision = mutate(parse_review(review(pod_object(container(limits={"cpu": "2"})))), DEFAULT)
    assert decision.allowed and not decision.patch
    pod, _ = _mutated(
        pod_object(container("gpu", limits={"mpsched.io/threads": "10"}), container("log"))
    )
    assert "env" not in _find(pod["spec"], "log")
    assert [m["name"] for m in _find(pod["spec"], "log")["volumeMounts"]] == [
        "kube-api-access-x7k2p"
    ]


def test_no_memory_limit_for_a_container_without_a_memory_budget() -> None:
    no_proportional = dataclasses.replace(DEFAULT, budgets=BudgetSettings(proportional=False))
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "25"})), no_proportional)
    assert MEM_LIMIT_ENV not in _env(pod) and THREADS_ENV in _env(pod)
    # Memory asked, or units: there is a budget whatever the proportional rule says.
    pod, _ = _mutated(
        pod_object(container(limits={"mpsched.io/threads": "25", "mpsched.io/memory": "1Gi"})),
        no_proportional,
    )
    assert MEM_LIMIT_ENV in _env(pod)


@pytest.mark.parametrize("off", [f.name for f in dataclasses.fields(InjectSettings)])
def test_each_injection_can_be_turned_off(off: str) -> None:
    settings = _settings(inject=InjectSettings(**{off: False}), delivery="hostIPC")
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "25"})), settings)
    gone = {
        "visible_devices": VISIBLE_DEVICES_ENV,
        "thread_percentage": THREADS_ENV,
        "memory_limit": MEM_LIMIT_ENV,
        "pipe_directory": PIPE_ENV,
    }[off]
    assert gone not in _env(pod)
    assert len(_env(pod)) == 4
    volumes = [v["name"] for v in pod["spec"]["volumes"]]
    assert (PIPE_VOLUME in volumes) == (off != "pipe_directory")
    # Under devicePlugin delivery, pipeDirectory turns the resource off.
    pod, _ = _mutated(
        pod_object(container(limits={"mpsched.io/threads": "25"})),
        _settings(inject=InjectSettings(**{off: False})),
    )
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (MPS_DELIVERY in limits) == (off != "pipe_directory")


def test_host_ipc_scheduler_and_runtime_class_as_configured() -> None:
    share = pod_object(container(limits={"mpsched.io/threads": "25"}))
    pod, _ = _mutated(share)
    assert "hostIPC" not in pod["spec"]
    assert pod["spec"]["schedulerName"] == "default-scheduler"  # off by default
    assert "runtimeClassName" not in pod["spec"]
    pod, _ = _mutated(share, _settings(scheduler_name="mpsched", runtime_class_name="nvidia"))
    assert (pod["spec"]["schedulerName"], pod["spec"]["runtimeClassName"]) == ("mpsched", "nvidia")
    # A scheduler or runtime class the pod names on purpose is left alone.
    chosen = pod_object(
        container(limits={"mpsched.io/gpus": "1"}), schedulerName="volcano", runtimeClassName="kata"
    )
    pod, _ = _mutated(chosen, _settings(scheduler_name="mpsched", runtime_class_name="nvidia"))
    assert (pod["spec"]["schedulerName"], pod["spec"]["runtimeClassName"]) == ("volcano", "kata")


def test_an_existing_mount_at_the_pipe_path_is_kept() -> None:
    mounts = [{"name": "mine", "mountPath": PIPE}]
    pod, _ = _mutated(
        pod_object(container(limits={"mpsched.io/threads": "5"}, volumeMounts=mounts)), HOST_IPC
    )
    assert pod["spec"]["containers"][0]["volumeMounts"] == mounts


def test_invalid_requests_are_denied_with_the_parsers_words() -> None:
    decision = mutate(
        parse_review(review(pod_object(container(limits={"mpsched.io/threads": "101"})))), DEFAULT
    )
    assert not decision.allowed
    assert decision.message == (
        "invalid mpsched request: container 'main': mpsched.io/threads=101 is above 100 "
        "(percent of one GPU's threads)"
    )


def test_only_create_is_mutated() -> None:
    obj = pod_object(container(limits={"mpsched.io/threads": "5"}))
    obj["metadata"]["name"] = "p"
    decision = mutate(parse_review(review(obj, operation="UPDATE", old=obj)), DEFAULT)
    assert decision.allowed and not decision.patch


def test_pointers_escape_tilde_then_slash() -> None:
    assert escape("a~b/c") == "a~0b~1c"
    path = pointer("metadata", "annotations", "mpsched.io/x~1")
    assert path == "/metadata/annotations/mpsched.io~1x~01"
    doc = apply_patch(
        {"metadata": {"annotations": {}}}, [{"op": "add", "path": path, "value": "v"}]
    )
    assert doc["metadata"]["annotations"] == {"mpsched.io/x~1": "v"}


def test_append_all_creates_a_missing_array_and_appends_to_one_that_exists() -> None:
    assert append_all({}, "env", "/e", [1, 2]) == [{"op": "add", "path": "/e", "value": [1, 2]}]
    assert append_all({"env": []}, "env", "/e", [1]) == [{"op": "add", "path": "/e/-", "value": 1}]
    assert append_all({}, "env", "/e", []) == []
    # What the first form avoids: `-` on a missing array does not apply.
    with pytest.raises(PatchError):
        apply_patch({}, [{"op": "add", "path": "/e/-", "value": 1}])


def test_settings_come_from_the_configuration() -> None:
    assert DEFAULT.webhook == WebhookSettings()
    assert DEFAULT.webhook.service_account == "system:serviceaccount:mpsched-system:mpsched"


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_gpu_pods_get_the_gpu_nodes_toleration_once() -> None:
    share = pod_object(container(limits={"mpsched.io/threads": "25"}))
    pod, _ = _mutated(share)
    assert pod["spec"]["tolerations"] == [*share["spec"]["tolerations"], GPU_TOLERATION]
    assert _mutated(pod)[1] == []  # re-admission adds it no second time
    bare = pod_object(container(limits={"mpsched.io/gpus": "1"}))
    del bare["spec"]["tolerations"]
    assert _mutated(bare)[0]["spec"]["tolerations"] == [GPU_TOLERATION]
    # A pod that asks for nothing is not touched.
    decision = mutate(parse_review(review(pod_object(container()))), DEFAULT)
    assert not decision.patch


@pytest.mark.parametrize(
    "own",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ],
)
def test_a_toleration_of_the_pods_own_that_covers_the_taint_is_kept_alone(own: Json) -> None:
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "5"}), tolerations=[own]))
    assert pod["spec"]["tolerations"] == [own]


def test_a_toleration_that_does_not_cover_the_taint_gets_ours_beside_it() -> None:
    own = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
    pod, _ = _mutated(pod_object(container(limits={"mpsched.io/threads": "5"}), tolerations=[own]))
    assert pod["spec"]["tolerations"] == [own, GPU_TOLERATION]


def test_the_toleration_follows_the_configured_key_or_is_off() -> None:
    share = pod_object(container(limits={"mpsched.io/threads": "5"}))
    pod, _ = _mutated(share, _settings(tolerate_taint="example.com/accelerator"))
    assert pod["spec"]["tolerations"][-1]["key"] == "example.com/accelerator"
    pod, _ = _mutated(share, _settings(tolerate_taint=None))
    assert pod["spec"]["tolerations"] == share["spec"]["tolerations"]
