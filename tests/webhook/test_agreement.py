"""The webhook and the ValidatingAdmissionPolicy decide alike: each case, a pod as a client
submits it, goes through the webhook (/mutate, its patch applied, then /validate) and through
the policy (evaluated in CEL on the pod as mutated, as the API server runs validating admission
after mutating admission); both allow it, or both deny it naming the container and the source.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY, VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import parse_review
from extender.webhook.validation import validate
from tests.webhook.cel_policy import policy
from tests.webhook.reviews import Json, apply_patch, container, created, pod_object, review

SETTINGS = AdmissionSettings.from_config(Config.default())
SHARE = {"mpsched.io/threads": "20", "mpsched.io/memory": "4Gi"}


@dataclass(frozen=True)
class Case:
    pod: Json
    #: None: allowed; else fragments both reasons must hold (the container and the source).
    refused: tuple[str, ...] | None = None
    operation: str = "CREATE"
    sub_resource: str = ""
    old: Json | None = None

    def _refused(self, *fragments: str) -> Case:
        return dataclasses.replace(self, refused=fragments)


def _pod(*containers: Json, init: list[Json] | None = None, **spec: Any) -> Json:
    return pod_object(*containers, init=init, **spec)


def _sidecar(name: str = "sidecar", **extra: Any) -> Json:
    out = container(name, **extra)
    out["image"] = "busybox:1.36"
    return out


GPU_ENV: Json = {"configMapRef": {"name": "gpu-env"}}  # holds NVIDIA_VISIBLE_DEVICES=all
PIPE_HOST_PATH: Json = {"name": "pipe", "hostPath": {"path": "/tmp/nvidia-mps"}}


def _with_volume(pod: Json, volume: Json) -> Json:
    pod = copy.deepcopy(pod)
    pod["spec"]["volumes"].append(volume)
    return pod


def _running() -> Json:
    """A share pod as admitted, bound and running."""
    body = review(_pod(container(limits=SHARE)))
    decision = mutate(parse_review(body), SETTINGS)
    pod = created(apply_patch(body["request"]["object"], decision.patch))
    pod["spec"]["nodeName"] = "gpu-1"
    pod["metadata"]["annotations"] = {
        ALLOCATION_KEY: '{"containers":[{"name":"main","threads":20}],"gpus":[{"index":0}],"v":1}',
        VISIBLE_DEVICES_KEY: "GPU-gpu-1-0",
        threads_key("main"): "20",
        mem_limit_key("main"): "0=4096M",
    }
    pod["status"] = {"phase": "Running"}
    return pod


def _debugged(*ephemeral: Json, volumes: tuple[Json, ...] = ()) -> Case:
    """`kubectl debug` on the running share pod: an UPDATE of pods/ephemeralcontainers."""
    old = _running()
    old["spec"]["volumes"].extend(volumes)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "debugger", "image": "busybox:1.36", "targetContainerName": "main", **e}
        for e in ephemeral
    ]
    return Case(new, operation="UPDATE", sub_resource="ephemeralcontainers", old=old)


CASES: dict[str, Case] = {
    "an honest share pod": Case(_pod(container(limits=SHARE))),
    "an honest sidecar": Case(
        _pod(container(limits=SHARE), _sidecar(env=[{"name": "LOG_LEVEL", "value": "info"}]))
    ),
    "a literal pipe directory in a container that asks nothing": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}]),
        ),
        ("container 'sidecar'", "CUDA_MPS_PIPE_DIRECTORY"),
    ),
    "a literal pipe directory in the share container": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}]))
    ),
    "a relative pipe directory in the share container": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "x"}])),
        ("container 'main'", "CUDA_MPS_PIPE_DIRECTORY"),
    ),
    # Issue 31 item 2: every way a container that asks nothing could reach the GPU or MPS.
    "a sidecar with envFrom a ConfigMap and no prefix": Case(
        _pod(container(limits=SHARE), _sidecar(envFrom=[GPU_ENV])),
        ("container 'sidecar'", "envFrom configMapRef 'gpu-env'"),
    ),
    "a sidecar with envFrom a Secret, prefix CUDA_": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(envFrom=[{"secretRef": {"name": "s"}, "prefix": "CUDA_"}]),
        ),
        ("container 'sidecar'", "envFrom secretRef 's'"),
    ),
    "a sidecar with envFrom prefixed inside CUDA_MPS_": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(envFrom=[{**GPU_ENV, "prefix": "CUDA_MPS_ACTIVE_THREAD_"}]),
        ),
        ("container 'sidecar'", "envFrom configMapRef 'gpu-env'"),
    ),
    "a sidecar with envFrom prefixed APP_ (honest)": Case(
        _pod(container(limits=SHARE), _sidecar(envFrom=[{**GPU_ENV, "prefix": "APP_"}]))
    ),
    "a sidecar with NVIDIA_VISIBLE_DEVICES=all": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
        ),
        ("container 'sidecar'", "NVIDIA_VISIBLE_DEVICES"),
    ),
    "a sidecar with a thread percentage of its own": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]),
        ),
        ("container 'sidecar'", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    ),
    "a sidecar with any other CUDA_MPS_ variable": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "CUDA_MPS_LOG_DIRECTORY", "value": "/l"}]),
        ),
        ("container 'sidecar'", "CUDA_MPS_LOG_DIRECTORY"),
    ),
    "a sidecar with CUDA_DEVICE_MAX_CONNECTIONS": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]),
        ),
        ("container 'sidecar'", "CUDA_DEVICE_MAX_CONNECTIONS"),
    ),
    "an init container that asks nothing, with NVIDIA_VISIBLE_DEVICES": Case(
        _pod(
            container(limits=SHARE),
            init=[_sidecar("setup", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])],
        ),
        ("container 'setup'", "NVIDIA_VISIBLE_DEVICES"),
    ),
    "a sidecar mounting the MPS pipe directory from the host": Case(
        _with_volume(
            _pod(
                container(limits=SHARE),
                _sidecar(volumeMounts=[{"name": "pipe", "mountPath": "/tmp/nvidia-mps"}]),
            ),
            PIPE_HOST_PATH,
        ),
        ("container 'sidecar'", "volume 'pipe'"),
    ),
    "a sidecar mounting an ancestor of the MPS directories": Case(
        _with_volume(
            _pod(
                container(limits=SHARE), _sidecar(volumeMounts=[{"name": "tmp", "mountPath": "/h"}])
            ),
            {"name": "tmp", "hostPath": {"path": "/tmp"}},
        ),
        ("container 'sidecar'", "volume 'tmp'"),
    ),
    "a sidecar mounting the hostIPC delivery's volume by name": Case(
        _with_volume(
            _pod(
                container(limits=SHARE),
                _sidecar(volumeMounts=[{"name": "mpsched-mps-pipe", "mountPath": "/p"}]),
            ),
            {"name": "mpsched-mps-pipe", "emptyDir": {}},
        ),
        ("container 'sidecar'", "volume 'mpsched-mps-pipe'"),
    ),
    "a sidecar mounting a ConfigMap (honest)": Case(
        _with_volume(
            _pod(
                container(limits=SHARE), _sidecar(volumeMounts=[{"name": "cfg", "mountPath": "/c"}])
            ),
            {"name": "cfg", "configMap": {"name": "c"}},
        )
    ),
    "a sidecar with mpsched.io/mps of its own": Case(
        _pod(container(limits=SHARE), _sidecar(resources={"limits": {"mpsched.io/mps": "1"}})),
        ("container 'sidecar'", "mpsched.io/mps"),
    ),
    "a pod that asks nothing but mpsched.io/mps": Case(
        _pod(_sidecar("stowaway", resources={"limits": {"mpsched.io/mps": "1"}})),
        ("container 'stowaway'", "mpsched.io/mps"),
    ),
    "a whole-GPU container with mpsched.io/mps": Case(
        _pod(container(limits={"mpsched.io/gpus": "1", "mpsched.io/mps": "1"})),
        ("container 'main'", "mpsched.io/mps"),
    ),
    "a whole-GPU pod's sidecar with envFrom": Case(
        _pod(container(limits={"mpsched.io/gpus": "1"}), _sidecar(envFrom=[GPU_ENV])),
        ("container 'sidecar'", "envFrom configMapRef 'gpu-env'"),
    ),
    "a CPU pod with envFrom and GPU variables (no GPU pod: out of scope)": Case(
        _pod(_sidecar(envFrom=[GPU_ENV], env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))
    ),
    # Issue 31 item 4: the connection count of a share container.
    "a share container with more device connections": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "8"}])),
        ("container 'main'", "CUDA_DEVICE_MAX_CONNECTIONS"),
    ),
    "a share container with fewer device connections": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]))
    ),
    "a whole-GPU container with many device connections": Case(
        _pod(
            container(
                limits={"mpsched.io/gpus": "1"},
                env=[{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "32"}],
            )
        )
    ),
    # kubectl debug: the pods/ephemeralcontainers subresource.
    "a debug container with NVIDIA_VISIBLE_DEVICES": _debugged(
        {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    )._refused("container 'debugger'", "NVIDIA_VISIBLE_DEVICES"),
    "a debug container with envFrom": _debugged({"envFrom": [GPU_ENV]})._refused(
        "container 'debugger'", "envFrom configMapRef 'gpu-env'"
    ),
    "a debug container mounting a host path of the pod": _debugged(
        {"volumeMounts": [{"name": "pipe", "mountPath": "/tmp/nvidia-mps"}]},
        volumes=(PIPE_HOST_PATH,),
    )._refused("container 'debugger'", "volume 'pipe'"),
    "an honest debug container": _debugged({"command": ["sh"], "stdin": True, "tty": True}),
}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


def _webhook(case: Case) -> tuple[Verdict, Json]:
    """The webhook's verdict, and the pod as the policy sees it (mutated when allowed)."""
    body = review(case.pod, operation=case.operation, old=case.old)
    body["request"]["subResource"] = case.sub_resource or None
    request = parse_review(body)
    mutated = mutate(request, SETTINGS)
    if not mutated.allowed:
        return Verdict(False, mutated.message), case.pod
    pod = apply_patch(case.pod, mutated.patch)
    body = review(pod, operation=case.operation, old=case.old)
    body["request"]["subResource"] = case.sub_resource or None
    checked = validate(parse_review(body), SETTINGS)
    return Verdict(checked.allowed, checked.message), pod


def _policy(case: Case, pod: Json) -> Verdict:
    obj = copy.deepcopy(pod)
    obj["metadata"].setdefault("name", "train-x")
    old = None if case.old is None else copy.deepcopy(case.old)
    decision = policy().admit(case.operation, obj, old, sub_resource=case.sub_resource)
    return Verdict(decision.allowed, "; ".join(decision.denials))


@pytest.mark.parametrize("name", CASES)
def test_the_webhook_and_the_policy_agree(name: str) -> None:
    case = CASES[name]
    webhook, pod = _webhook(case)
    cel = _policy(case, pod)
    assert webhook.allowed == cel.allowed == (case.refused is None), (webhook, cel)
    for fragment in case.refused or ():
        assert fragment in webhook.reason, webhook.reason
        assert fragment in cel.reason, cel.reason
