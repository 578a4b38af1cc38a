"""The admission decisions for pods (DESIGN §5 step 1, §5a rule 3): what `/mutate` adds to a pod
that asks for `mpsched.io/*`, and what `/validate` refuses. Pure: a request in, a `Decision` out.

Mutation wires the allocation the bind will write into the containers through the downward API:
each injected env var is a `fieldRef` to an annotation key built by `extender.packing.codec`, so
the kubelet resolves it from the bound pod when it starts the container, and nothing on the node
guesses which pod is which. The patch is computed against the pod as it is, so it applies to any
pod (no env, no volumes, init containers, sidecars) and adds nothing that is already there:
re-admission (`reinvocationPolicy: IfNeeded`) gives an empty patch.

Validation keeps the allocation the scheduler's alone: the request is read by the same parser
`/filter` uses (so both reject in the same words); a pod may not write `mpsched.io/`
annotations, set the injected env vars to anything but what mutation writes, or preset
`spec.nodeName` while asking for `mpsched.io/*` — unless the request comes from mpsched's own
service account. A pod that asks for nothing and carries no `mpsched.io/` annotation passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from extender.config import Config, WebhookSettings
from extender.packing.codec import VISIBLE_DEVICES_KEY, mem_limit_key, threads_key
from extender.packing.errors import InvalidRequest
from extender.packing.podspec import PREFIX, parse_pod
from extender.packing.request import ContainerAsk
from extender.packing.settings import BudgetSettings
from extender.webhook.patch import PatchOp, add, append_all, pointer
from extender.webhook.review import BAD_REQUEST, AdmissionRequest, Decision, allow, deny

VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEM_LIMIT_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
#: The env vars only mpsched may set: each one steers which GPU, or how much of it, a container
#: gets (or which MPS server it talks to).
GUARDED_ENV: Final = (VISIBLE_DEVICES_ENV, THREADS_ENV, MEM_LIMIT_ENV, PIPE_ENV)
#: Name of the hostPath volume of the MPS pipe directory that mutation adds.
PIPE_VOLUME: Final = "mpsched-mps-pipe"
#: kube-apiserver defaults an unset schedulerName to this.
DEFAULT_SCHEDULER: Final = "default-scheduler"
#: The words filter's reason starts with (`extender.packing.parsing`), so that admission and
#: filter refuse an invalid request alike.
INVALID: Final = "invalid mpsched request:"
#: `status.code` of a request the Pod API cannot honour (Kubernetes' code for Invalid).
UNPROCESSABLE: Final = 422
#: The containers of a pod spec that can ask for resources (ephemeral containers cannot).
CONTAINER_FIELDS: Final = ("containers", "initContainers")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSettings:
    """What the decisions read: the webhook's section, and the budgets `parse_pod` needs (the
    proportional rule decides whether a threads-only container has a memory budget)."""

    webhook: WebhookSettings
    budgets: BudgetSettings

    @classmethod
    def from_config(cls, config: Config) -> AdmissionSettings:
        return cls(webhook=config.webhook, budgets=config.budgets)


class _Malformed(Exception):
    """A part of the pod the decisions read has the wrong type (the API server never sends one;
    a hand-made review may)."""


# --- reading a pod ---------------------------------------------------------------------------


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Malformed(f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Malformed(f"{where} must be a list, got {type(value).__name__}")
    return value


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) for every container that can ask for resources."""
    spec = _mapping(pod.get("spec"), "spec")
    for field in CONTAINER_FIELDS:
        for i, container in enumerate(_list(spec.get(field), f"spec.{field}")):
            yield field, i, _mapping(container, f"spec.{field}[{i}]")


def asks_mpsched(pod: Mapping[str, Any]) -> bool:
    """Whether any container names an `mpsched.io/` resource in its limits or requests (what
    the deploy manifests' matchConditions test in CEL). Raises _Malformed."""
    for field, i, container in _containers(pod):
        resources = _mapping(container.get("resources"), f"spec.{field}[{i}].resources")
        for section in ("limits", "requests"):
            values = _mapping(resources.get(section), f"spec.{field}[{i}].resources.{section}")
            if any(isinstance(k, str) and k.startswith(PREFIX) for k in values):
                return True
    return False


def mpsched_annotations(pod: object) -> dict[str, object]:
    """The pod's annotations under `mpsched.io/` (those only mpsched writes)."""
    if not isinstance(pod, Mapping):
        return {}
    meta = _mapping(pod.get("metadata"), "metadata")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    return {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)}


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
    is `0=<MiB>M`: device 0 as the container sees it (it sees only its one GPU)."""
    inject = settings.webhook.inject
    env = []
    if inject.visible_devices:
        env.append(_from_annotation(VISIBLE_DEVICES_ENV, VISIBLE_DEVICES_KEY))
    if not ask.asks_share:
        return env
    if inject.thread_percentage:
        env.append(_from_annotation(THREADS_ENV, threads_key(ask.name)))
    if inject.memory_limit and has_memory_budget(ask, settings.budgets):
        env.append(_from_annotation(MEM_LIMIT_ENV, mem_limit_key(ask.name)))
    if inject.pipe_directory:
        env.append({"name": PIPE_ENV, "value": settings.webhook.pipe_directory})
    return env


def _is_pod(request: AdmissionRequest) -> bool:
    return request.kind in ("", "Pod") and not request.sub_resource


def _not_a_pod(request: AdmissionRequest) -> Decision:
    what = request.kind + (f"/{request.sub_resource}" if request.sub_resource else "")
    return allow(warnings=(f"mpsched admission checks Pods only; {what} passed unchecked",))


def _parse(pod: Mapping[str, Any], settings: AdmissionSettings) -> dict[str, ContainerAsk]:
    """The pod's asks by container name. Raises InvalidRequest."""
    return {a.name: a for a in parse_pod(pod, settings.budgets).containers}


# --- /mutate --------------------------------------------------------------------------------


def mutate(request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """The JSONPatch that wires the allocation into the pod of a CREATE; nothing otherwise."""
    if request.operation != "CREATE":
        return allow()
    if not _is_pod(request):
        return _not_a_pod(request)
    pod = request.obj
    if not isinstance(pod, Mapping):
        return deny("request.object must be a Pod object", code=BAD_REQUEST)
    try:
        if not asks_mpsched(pod):
            return allow()
        asks = _parse(pod, settings)
        return allow(patch=_patch(pod, asks, settings))
    except InvalidRequest as exc:
        return deny(f"{INVALID} {exc}", code=UNPROCESSABLE)
    except _Malformed as exc:
        return deny(f"request.object: {exc}", code=BAD_REQUEST)


def _patch(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk], settings: AdmissionSettings
) -> list[PatchOp]:
    hook = settings.webhook
    spec = _mapping(pod.get("spec"), "spec")
    ops: list[PatchOp] = []
    share = False
    for field, i, container in _containers(pod):
        ask = asks.get(container.get("name", ""))
        if ask is None:
            continue  # asks for nothing: untouched
        at = pointer("spec", field, i)
        where = f"spec.{field}[{i}]"
        present = {
            e.get("name")
            for e in _list(container.get("env"), f"{where}.env")
            if isinstance(e, Mapping)
        }
        missing = [e for e in container_env(ask, settings) if e["name"] not in present]
        ops += append_all(container, "env", f"{at}/env", missing)
        if not ask.asks_share:
            continue
        share = True
        if hook.inject.pipe_directory:
            mounts = _list(container.get("volumeMounts"), f"{where}.volumeMounts")
            # A second mount at the same path would make the pod invalid; one named ours is ours.
            if not any(
                isinstance(m, Mapping)
                and (m.get("mountPath") == hook.pipe_directory or m.get("name") == PIPE_VOLUME)
                for m in mounts
            ):
                mount = {"name": PIPE_VOLUME, "mountPath": hook.pipe_directory}
                ops += append_all(container, "volumeMounts", f"{at}/volumeMounts", [mount])
    if share and hook.inject.pipe_directory:
        volumes = _list(spec.get("volumes"), "spec.volumes")
        if not any(isinstance(v, Mapping) and v.get("name") == PIPE_VOLUME for v in volumes):
            # Directory, not DirectoryOrCreate: the node's MPS control daemon creates it, and a
            # pod on a node without one should fail to start visibly, not run without MPS.
            volume = {
                "name": PIPE_VOLUME,
                "hostPath": {"path": hook.pipe_directory, "type": "Directory"},
            }
            ops += append_all(spec, "volumes", "/spec/volumes", [volume])
    if share and hook.host_ipc and spec.get("hostIPC") is not True:
        ops.append(add("/spec/hostIPC", True))
    scheduler = spec.get("schedulerName")
    if hook.scheduler_name not in (None, scheduler) and scheduler in (None, "", DEFAULT_SCHEDULER):
        ops.append(add("/spec/schedulerName", hook.scheduler_name))
    if hook.runtime_class_name is not None and not spec.get("runtimeClassName"):
        ops.append(add("/spec/runtimeClassName", hook.runtime_class_name))
    return ops


# --- /validate ------------------------------------------------------------------------------


def validate(request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """Allowed, or denied with every reason found, each naming the container and field."""
    if request.operation not in ("CREATE", "UPDATE"):
        return allow()
    if not _is_pod(request):
        return _not_a_pod(request)
    if request.username == settings.webhook.service_account:
        return allow()
    pod = request.obj
    if not isinstance(pod, Mapping):
        return deny("request.object must be a Pod object", code=BAD_REQUEST)
    try:
        problems = _annotation_problems(request, settings)
        # On UPDATE only the annotations can change: a pod's resources, env and nodeName are
        # immutable there, and re-checking the request could block a finalizer's removal.
        if request.operation == "CREATE" and asks_mpsched(pod):
            problems += _create_problems(pod, settings)
    except _Malformed as exc:
        return deny(f"request.object: {exc}", code=BAD_REQUEST)
    if not problems:
        return allow()
    code = UNPROCESSABLE if problems[0].startswith(INVALID) else 403
    return deny("; ".join(problems), code=code)


def _annotation_problems(request: AdmissionRequest, settings: AdmissionSettings) -> list[str]:
    who = f"only mpsched's service account ({settings.webhook.service_account}) writes them"
    new = mpsched_annotations(request.obj)
    if request.operation == "CREATE":
        if not new:
            return []
        return [f"metadata.annotations: a pod may not set {_keys(new)}: {who}, when it binds"]
    old = mpsched_annotations(request.old_obj)
    changes = [
        (verb, keys)
        for verb, keys in (
            ("add", sorted(new.keys() - old.keys())),
            ("remove", sorted(old.keys() - new.keys())),
            ("change", sorted(k for k in new.keys() & old.keys() if new[k] != old[k])),
        )
        if keys
    ]
    return [
        f"metadata.annotations: an update may not {verb} {_keys(keys)}: {who}"
        for verb, keys in changes
    ]


def _create_problems(pod: Mapping[str, Any], settings: AdmissionSettings) -> list[str]:
    problems = []
    asks: Mapping[str, ContainerAsk] | None
    try:
        asks = _parse(pod, settings)
    except InvalidRequest as exc:
        problems.append(f"{INVALID} {exc}")
        asks = None
    node = _mapping(pod.get("spec"), "spec").get("nodeName")
    if node:
        problems.append(
            f"spec.nodeName: a pod asking for {PREFIX}* resources may not preset its node "
            f"({node!r}): the scheduler places it and mpsched chooses its GPU"
        )
    if asks is not None:
        problems += _env_problems(pod, asks, settings)
    return problems


def _env_problems(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk], settings: AdmissionSettings
) -> list[str]:
    """Guarded env vars set to anything but what mutation writes for that container."""
    problems = []
    for field, i, container in _containers(pod):
        name = container.get("name", "")
        ask = asks.get(name)
        ours = {e["name"]: e for e in container_env(ask, settings)} if ask else {}
        env = _list(container.get("env"), f"spec.{field}[{i}].env")
        for entry in env:
            var = entry.get("name") if isinstance(entry, Mapping) else None
            if var not in GUARDED_ENV:
                continue
            if var in ours and _same_env(entry, ours[var]):
                continue
            why = (
                "mpsched sets it from the allocation the scheduler makes"
                if ask
                else f"the container asks for no {PREFIX} resource and only mpsched sets it"
            )
            problems.append(f"container {name!r}: env {var} is set by the pod, but {why}")
    return problems


def _same_env(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Equal env entries, allowing for the API server's defaulting (`fieldRef.apiVersion: v1`)."""
    return _normal(have) == _normal(want)


def _normal(entry: Mapping[str, Any]) -> tuple[str, object]:
    value_from = entry.get("valueFrom")
    if value_from is None:
        return ("value", entry.get("value") or "")
    if "value" not in entry and isinstance(value_from, Mapping) and set(value_from) == {"fieldRef"}:
        ref = value_from["fieldRef"]
        if (
            isinstance(ref, Mapping)
            and set(ref) <= {"apiVersion", "fieldPath"}
            and ref.get("apiVersion", "v1") == "v1"
        ):
            return ("fieldRef", ref.get("fieldPath"))
    return ("other", None)


def _keys(keys: Mapping[str, object] | Sequence[str]) -> str:
    return ", ".join(sorted(keys))


def decide(endpoint: str, request: AdmissionRequest, settings: AdmissionSettings) -> Decision:
    """The decision of `endpoint` ("mutate" or "validate") on `request`."""
    return mutate(request, settings) if endpoint == "mutate" else validate(request, settings)
