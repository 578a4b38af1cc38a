"""The admission decisions for pods, mutation side: what `/mutate` adds to a pod that asks for
`mpsched.io/*`, and the names and settings the validation side (`validation`) shares. Pure: a
request in, a `Decision` out.

Mutation wires the allocation the bind will write into the containers through the downward API:
each injected env var is a `fieldRef` to an annotation key built by `extender.packing.codec`, so
the kubelet resolves it from the bound pod when it starts the container, and nothing on the node
guesses which pod is which. The MPS connection reaches only the share containers, by the
configured `webhook.delivery`: with `devicePlugin` one `mpsched.io/mps` per share container,
whose device-plugin Allocate mounts the pipe directory and the daemon's /dev/shm outside the pod
spec; with `hostIPC` the pod's host IPC namespace and a hostPath volume of the pipe directory.
The patch is computed against the pod as it is, so it applies to any pod (no env, no volumes,
init containers, sidecars) and adds nothing that is already there: re-admission
(`reinvocationPolicy: IfNeeded`) gives an empty patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.config import Config
from extender.config_agent import WebhookSettings
from extender.packing.codec import VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from extender.packing.errors import InvalidRequest
from extender.packing.podspec import MPS_DELIVERY, parse_pod
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.settings import BudgetSettings
from extender.webhook.patch import PatchOp, add, append_all, escape, pointer
from extender.webhook.pods import (
    Malformed,
    asking_containers,
    asks_mpsched,
    items,
    mapping,
    spec_of,
)
from extender.webhook.review import BAD_REQUEST, AdmissionRequest, Decision, allow, deny

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEM_LIMIT_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
CONNECTIONS_ENV: Final = "CUDA_DEVICE_MAX_CONNECTIONS"
#: Every variable of this prefix configures the MPS client (or reaches its daemon).
MPS_ENV_PREFIX: Final = "CUDA_MPS_"
#: The env vars only mpsched may set: each one steers which GPU, or how much of it, a container
#: gets (or which MPS server it talks to, or how many of the GPU's client slots it takes).
GUARDED_ENV: Final = (VISIBLE_DEVICES_ENV, THREADS_ENV, MEM_LIMIT_ENV, PIPE_ENV, CONNECTIONS_ENV)
#: Name of the hostPath volume of the MPS pipe directory that hostIPC delivery adds.
PIPE_VOLUME: Final = "mpsched-mps-pipe"
#: The count of `mpsched.io/mps` a share container gets: the Allocate answer is the same for any.
MPS_COUNT: Final = "1"
#: kube-apiserver defaults an unset schedulerName to this.
DEFAULT_SCHEDULER: Final = "default-scheduler"
#: The words filter's reason starts with (`extender.packing.parsing`), so that admission and
#: filter refuse an invalid request alike.
INVALID: Final = "invalid mpsched request:"
#: `status.code` of a request the Pod API cannot honour (Kubernetes' code for Invalid).
UNPROCESSABLE: Final = 422


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSettings:
    """What the decisions read: the webhook's section, and the budgets `parse_pod` needs (the
    proportional rule decides whether a threads-only container has a memory budget)."""

    webhook: WebhookSettings
    budgets: BudgetSettings

    @classmethod
    def from_config(cls, config: Config) -> AdmissionSettings:
        return cls(webhook=config.webhook, budgets=config.budgets)


# --- what a container gets ------------------------------------------------------------------


def has_memory_budget(ask: ContainerAsk, budgets: BudgetSettings) -> bool:
    """Whether the bind writes a memory-limit annotation for this share container: it does for
    units, memory, and threads when memory follows proportionally; a threads-only ask with
    `budgets.proportional` off has no memory budget and gets no key (`codec.env_annotations`)."""
    return ask.units is not None or ask.memory_mib is not None or budgets.proportional


def _from_annotation(name: str, key: str) -> dict[str, Any]:
    return {
        "name": name,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}},
    }


def container_env(ask: ContainerAsk, settings: AdmissionSettings) -> list[dict[str, Any]]:
    """The env entries mutation gives a container that asks `ask`, in this order. Whole-GPU
    containers get the visible devices only: they are not MPS clients. The memory limit's value
    is `0=<MiB>M`: device 0 as the container sees it (it sees only its one GPU). The pipe
    directory is the device plugin's to set under `delivery: devicePlugin`."""
    hook = settings.webhook
    inject = hook.inject
    env = []
    if inject.visible_devices:
        env.append(_from_annotation(VISIBLE_DEVICES_ENV, VISIBLE_DEVICES_KEY))
    if not ask.asks_share:
        return env
    if inject.thread_percentage:
        env.append(_from_annotation(THREADS_ENV, threads_key(ask.name)))
    if inject.memory_limit and has_memory_budget(ask, settings.budgets):
        env.append(_from_annotation(MEM_LIMIT_ENV, mem_limit_key(ask.name)))
    if inject.pipe_directory and hook.delivery == "hostIPC":
        env.append({"name": PIPE_ENV, "value": hook.pipe_directory})
    env.append({"name": CONNECTIONS_ENV, "value": str(hook.device_max_connections)})
    return env


def connections_problem(entry: Mapping[str, Any], cname: str, limit: int) -> str | None:
    """Why a share container's own CUDA_DEVICE_MAX_CONNECTIONS entry is refused, or None: only a
    literal count of at most `limit` is taken (each connection above the MPS client's default
    takes work queues that the client budget counts for other clients)."""
    value = entry.get("value")
    literal = "valueFrom" not in entry and isinstance(value, str) and value.isdigit()
    if literal and 1 <= int(str(value)) <= limit:
        return None
    return (
        f"container {cname!r} sets {CONNECTIONS_ENV} to {_shown(entry)}: a share container may "
        f"use at most {limit} connections per device (webhook.deviceMaxConnections), as a "
        "literal number; leave it out to get that default"
    )


def _shown(entry: Mapping[str, Any]) -> str:
    if "valueFrom" in entry:
        return "a value from elsewhere (valueFrom)"
    return repr(entry.get("value", ""))


def not_a_pod(request: AdmissionRequest) -> Decision | None:
    """A denial when the review is not about a Pod, or carries something else than a Pod in
    `object` or `oldObject` (a misrouted or forged request: passing it unchecked would let
    anything through); None for a Pod review. A null object (DELETE) is no object."""
    if request.kind not in ("", "Pod"):
        return deny(f"mpsched admission reviews Pods only; request.kind is {request.kind!r}")
    for field, obj in (("object", request.obj), ("oldObject", request.old_obj)):
        if obj is None:
            continue
        kind = obj.get("kind") if isinstance(obj, Mapping) else None
        version = obj.get("apiVersion") if isinstance(obj, Mapping) else None
        if kind != "Pod" or version not in (None, "v1"):
            shown = f"kind {kind!r}" if isinstance(obj, Mapping) else type(obj).__name__
            return deny(
                f"request.{field} must be a v1 Pod, got {shown}: mpsched admission reviews "
                "Pods only",
                code=BAD_REQUEST,
            )
    return None


def parse_asks(pod: Mapping[str, Any], settings: AdmissionSettings) -> dict[str, ContainerAsk]:
    """The pod's asks by container name. Raises InvalidRequest."""
    return {a.name: a for a in parse_pod(pod, settings.budgets).containers}


# --- /mutate --------------------------------------------------------------------------------


def mutate(request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """The JSONPatch that wires the allocation into the pod of a CREATE; nothing otherwise."""
    refused = not_a_pod(request)
    if refused is not None:
        return refused
    if request.operation != "CREATE" or request.sub_resource:
        return allow()
    pod = request.obj
    if not isinstance(pod, Mapping):
        return deny("request.object must be a Pod object", code=BAD_REQUEST)
    try:
        if not asks_mpsched(pod):
            return allow()
        share = parse_pod(pod, settings.budgets)
        asks = {a.name: a for a in share.containers}
        problems = _connection_problems(pod, asks, settings)
        if problems:
            return deny("; ".join(problems))
        return allow(patch=_patch(pod, asks, settings), warnings=_warnings(share, settings))
    except InvalidRequest as exc:
        return deny(f"{INVALID} {exc}", code=UNPROCESSABLE)
    except Malformed as exc:
        return deny(f"request.object: {exc}", code=BAD_REQUEST)


#: Shown by kubectl when a share pod's user is unknown (the extender then shares no GPU with it).
UNKNOWN_USER_WARNING: Final = (
    "this pod asks for a GPU share but sets no runAsUser (pod or container securityContext): "
    "its user is unknown, so it will not share a GPU with any other pod except on nodes whose "
    "MPS runs in multi-user mode; set securityContext.runAsUser to share GPUs"
)


def _warnings(request: ShareRequest, settings: AdmissionSettings) -> list[str]:
    """What kubectl shows the pod's author: the one way an admitted share pod packs worse than
    its author would expect (an unknown user is never taken to be anybody else)."""
    if request.kind == "share" and request.run_as_user is None and settings.budgets.uid_isolation:
        return [UNKNOWN_USER_WARNING]
    return []


def _connection_problems(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk], settings: AdmissionSettings
) -> list[str]:
    problems = []
    for field, i, container, name, ask in asking_containers(pod, asks):
        if not ask.asks_share:
            continue
        for entry in items(container.get("env"), f"spec.{field}[{i}].env"):
            if isinstance(entry, Mapping) and entry.get("name") == CONNECTIONS_ENV:
                problem = connections_problem(entry, name, settings.webhook.device_max_connections)
                if problem:
                    problems.append(problem)
    return problems


def _patch(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk], settings: AdmissionSettings
) -> list[PatchOp]:
    hook = settings.webhook
    spec = spec_of(pod)
    host_ipc = hook.delivery == "hostIPC" and hook.inject.pipe_directory
    device_plugin = hook.delivery == "devicePlugin" and hook.inject.pipe_directory
    ops: list[PatchOp] = []
    share = False
    for field, i, container, _, ask in asking_containers(pod, asks):
        at = pointer("spec", field, i)
        where = f"spec.{field}[{i}]"
        present = {
            e.get("name")
            for e in items(container.get("env"), f"{where}.env")
            if isinstance(e, Mapping)
        }
        missing = [e for e in container_env(ask, settings) if e["name"] not in present]
        ops += append_all(container, "env", f"{at}/env", missing)
        if not ask.asks_share:
            continue
        share = True
        if device_plugin:
            ops += _delivery_resource(container, at, where)
        if host_ipc:
            mounts = items(container.get("volumeMounts"), f"{where}.volumeMounts")
            # A second mount at the same path would make the pod invalid; one named ours is ours.
            if not any(
                isinstance(m, Mapping)
                and (m.get("mountPath") == hook.pipe_directory or m.get("name") == PIPE_VOLUME)
                for m in mounts
            ):
                mount = {"name": PIPE_VOLUME, "mountPath": hook.pipe_directory}
                ops += append_all(container, "volumeMounts", f"{at}/volumeMounts", [mount])
    if share and host_ipc:
        volumes = items(spec.get("volumes"), "spec.volumes")
        if not any(isinstance(v, Mapping) and v.get("name") == PIPE_VOLUME for v in volumes):
            # Directory, not DirectoryOrCreate: the node's MPS control daemon creates it, and a
            # pod on a node without one should fail to start visibly, not run without MPS.
            volume = {
                "name": PIPE_VOLUME,
                "hostPath": {"path": hook.pipe_directory, "type": "Directory"},
            }
            ops += append_all(spec, "volumes", "/spec/volumes", [volume])
        if spec.get("hostIPC") is not True:
            ops.append(add("/spec/hostIPC", True))
    scheduler = spec.get("schedulerName")
    if hook.scheduler_name not in (None, scheduler) and scheduler in (None, "", DEFAULT_SCHEDULER):
        ops.append(add("/spec/schedulerName", hook.scheduler_name))
    if hook.runtime_class_name is not None and not spec.get("runtimeClassName"):
        ops.append(add("/spec/runtimeClassName", hook.runtime_class_name))
    if hook.tolerate_taint is not None and not _tolerated(spec, hook.tolerate_taint):
        toleration = {"key": hook.tolerate_taint, "operator": "Exists", "effect": "NoSchedule"}
        ops += append_all(spec, "tolerations", "/spec/tolerations", [toleration])
    return ops


def _tolerated(spec: Mapping[str, Any], key: str) -> bool:
    """Whether a toleration of the pod already tolerates a NoSchedule taint `key` whatever its
    value: that key (or any key) with operator Exists, for NoSchedule (or every effect)."""
    for toleration in items(spec.get("tolerations"), "spec.tolerations"):
        t = mapping(toleration, "spec.tolerations[]")
        if (
            t.get("operator") == "Exists"
            and t.get("key") in (key, None, "")
            and t.get("effect") in ("NoSchedule", None, "")
        ):
            return True
    return False


def _delivery_resource(container: Mapping[str, Any], at: str, where: str) -> list[PatchOp]:
    """One `mpsched.io/mps` in the limits (created when missing) and in the requests where the
    container has requests: extended resources need both equal when both are given."""
    if container.get("resources") is None:  # an ask is in the resources; kept for hand-made pods
        return [add(f"{at}/resources", {"limits": {MPS_DELIVERY: MPS_COUNT}})]
    resources = mapping(container.get("resources"), f"{where}.resources")
    ops: list[PatchOp] = []
    for section in ("limits", "requests"):
        if resources.get(section) is None:
            if section == "limits":
                ops.append(add(f"{at}/resources/limits", {MPS_DELIVERY: MPS_COUNT}))
            continue
        values = mapping(resources.get(section), f"{where}.resources.{section}")
        if values.get(MPS_DELIVERY) != MPS_COUNT:
            ops.append(add(f"{at}/resources/{section}/{escape(MPS_DELIVERY)}", MPS_COUNT))
    return ops
