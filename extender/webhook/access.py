"""Which containers of a pod may reach the node's MPS daemon: only those that ask for an
`mpsched.io/*` share. Pure: a pod in, the reasons it is refused out.

In a pod that asks for `mpsched.io/*`, a container that asks for nothing (an app container, an
init container or sidecar, or an ephemeral container `kubectl debug` adds later) may not carry
any source of the variables that make a CUDA process an MPS client or pick its GPU: no env entry
named NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_MAX_CONNECTIONS or CUDA_MPS_*; no `envFrom` of a
ConfigMap or Secret whose prefix could produce one of those names (admission cannot read the
object's keys, so an envFrom without a prefix, or with one like `CUDA_`, is refused; a prefix
none of the names starts with, such as `APP_`, is fine); no mount of a host-path volume (the
MPS pipe directory and the daemon's shm live on the host, and a path's ancestors, bind mounts
and symlinks reach them too). In any pod, `mpsched.io/mps` (its device plugin mounts the
daemon) is refused in a container that asks for no share, whole-GPU containers included (they
are no MPS clients). The ValidatingAdmissionPolicy in deploy/base holds the same rules in CEL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from extender.packing.podspec import MPS_DELIVERY
from extender.webhook.admission import (
    CONNECTIONS_ENV,
    MPS_ENV_PREFIX,
    PIPE_VOLUME,
    VISIBLE_DEVICES_ENV,
)
from extender.webhook.pods import (
    ALL_CONTAINER_FIELDS,
    asks,
    asks_mpsched,
    asks_share,
    containers,
    items,
    mapping,
    resource_keys,
    volumes,
)

#: The whole names a container that asks for nothing may not set; plus every MPS_ENV_PREFIX one.
MPS_CLIENT_ENV: Final = (VISIBLE_DEVICES_ENV, CONNECTIONS_ENV)
WHY: Final = "only containers that ask for an mpsched.io share reach the GPU and its MPS daemon"


def is_mps_client_env(name: object) -> bool:
    return isinstance(name, str) and (name in MPS_CLIENT_ENV or name.startswith(MPS_ENV_PREFIX))


def prefix_is_safe(prefix: object) -> bool:
    """Whether no key of an envFrom source with this prefix can become a guarded name: the
    prefix is not empty, not the start of a guarded name, and not inside CUDA_MPS_."""
    if not isinstance(prefix, str) or not prefix:
        return False
    starts = (*MPS_CLIENT_ENV, MPS_ENV_PREFIX)
    return not any(s.startswith(prefix) for s in starts) and not prefix.startswith(MPS_ENV_PREFIX)


def access_problems(
    pod: Mapping[str, Any], fields: Sequence[str] = ALL_CONTAINER_FIELDS
) -> list[str]:
    """Why containers of the kinds `fields` names may not run as they are. Raises Malformed."""
    gpu_pod = asks_mpsched(pod)
    host_paths = {n for n, v in volumes(pod).items() if v.get("hostPath") is not None}
    host_paths.add(PIPE_VOLUME)
    problems = []
    for field, i, container in containers(pod, fields):
        where = f"spec.{field}[{i}]"
        name = container.get("name", "")
        if MPS_DELIVERY in resource_keys(container, where) and not asks_share(container, where):
            problems.append(
                f"container {name!r} has {MPS_DELIVERY} without asking for an mpsched.io share: "
                "it mounts the node's MPS daemon, which only share containers may reach"
            )
        if gpu_pod and not asks(container, where):
            problems += _sources(container, name, where, host_paths)
    return problems


def _sources(
    container: Mapping[str, Any], name: str, where: str, host_paths: set[str]
) -> list[str]:
    problems = []
    for entry in items(container.get("env"), f"{where}.env"):
        var = mapping(entry, f"{where}.env[]").get("name")
        if is_mps_client_env(var):
            problems.append(
                f"container {name!r} sets {var} but asks for no mpsched.io share: {WHY}"
            )
    for j, source in enumerate(items(container.get("envFrom"), f"{where}.envFrom")):
        source = mapping(source, f"{where}.envFrom[{j}]")
        if prefix_is_safe(source.get("prefix")):
            continue
        problems.append(
            f"container {name!r} takes envFrom {_source(source)} with prefix "
            f"{source.get('prefix') or ''!r}, which could set {VISIBLE_DEVICES_ENV}, "
            f"{CONNECTIONS_ENV} or {MPS_ENV_PREFIX}*, and asks for no mpsched.io share: {WHY} "
            "(give the envFrom a prefix none of those names starts with, e.g. APP_)"
        )
    for mount in items(container.get("volumeMounts"), f"{where}.volumeMounts"):
        volume = mapping(mount, f"{where}.volumeMounts[]").get("name")
        if volume in host_paths:
            problems.append(
                f"container {name!r} mounts volume {volume!r}, a host path, and asks for no "
                f"mpsched.io share: {WHY} (the MPS directories live on the host)"
            )
    return problems


def _source(source: Mapping[str, Any]) -> str:
    for kind in ("configMapRef", "secretRef"):
        ref = source.get(kind)
        if isinstance(ref, Mapping):
            return f"{kind} {ref.get('name', '')!r}"
    return "of an unknown source"
