"""Reading a pod's `mpsched.io/*` ask (docs/design.md, Resources a pod asks for): from a Kubernetes
Pod as a JSON dict to a validated `ShareRequest`, or an `InvalidRequest` whose message names the
container and field.

Owns the Pod API's validation rules; the arithmetic of a demand on a given GPU stays in
`request.py`. Pure: the webhook (at admission) and filter (as a last line of defence) call the
same function, so both reject with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, TypeGuard

from extender.packing.effective import Role, effective, role_of
from extender.packing.errors import InvalidRequest, QuantityError
from extender.packing.model import VOLTA_CLIENT_LIMIT
from extender.packing.quantity import MIB, parse_quantity, whole_quantity
from extender.packing.request import ContainerAsk, RequestKind, ShareRequest
from extender.packing.settings import BudgetSettings

PREFIX: Final = "mpsched.io/"
THREADS: Final = "mpsched.io/threads"
MEMORY: Final = "mpsched.io/memory"
UNITS: Final = "mpsched.io/units"
GPUS: Final = "mpsched.io/gpus"
CLIENTS: Final = "mpsched.io/clients"
RESOURCES: Final = (THREADS, MEMORY, UNITS, GPUS, CLIENTS)
#: The node agent's device-plugin resource the admission webhook adds (one) to each share
#: container: its Allocate mounts the MPS pipe directory and shm. kube-scheduler counts it
#: against the node's allocatable like any extended resource; it is no ask of mpsched's.
MPS_DELIVERY: Final = "mpsched.io/mps"
#: The most clients one container may declare: every client is a context on one GPU, and no GPU
#: serves more than 48 (Volta and later; MPS doc §2.3.5.1).
MAX_CLIENTS: Final = VOLTA_CLIENT_LIMIT


@dataclass(frozen=True, slots=True)
class _Parsed:
    ask: ContainerAsk
    run_as_user: int | None

    @property
    def role(self) -> Role:
        return role_of(init=self.ask.init, sidecar=self.ask.sidecar)


def is_object(value: object) -> TypeGuard[Mapping[Any, Any]]:
    """Whether `value` is a JSON object (any Mapping). JSON's dicts are answered first: the
    Mapping ABC's isinstance is a Python-level __instancecheck__, and one pod parse
    asks this over a dozen times."""
    return type(value) is dict or isinstance(value, Mapping)


def parse_pod(
    pod: Mapping[str, Any],
    budgets: BudgetSettings,
    *,
    max_gpu_memory_mib: int | None = None,
    max_units: int | None = None,
) -> ShareRequest:
    """The pod's GPU request. `max_gpu_memory_mib` / `max_units`: the largest GPU memory and
    units per GPU in the cluster, when known, so that asks no GPU can ever hold are rejected
    here with a reason instead of pending forever. Raises InvalidRequest."""
    if not is_object(pod):
        raise InvalidRequest(f"pod is a {type(pod).__name__}, not an object")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    namespace = _string(meta.get("namespace", "default"), "metadata.namespace")
    name = _string(meta.get("name", ""), "metadata.name")
    uid = _string(meta.get("uid", ""), "metadata.uid")
    priority = spec.get("priority")
    if priority is None:
        priority = 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidRequest(f"spec.priority={priority!r} is not an integer")
    pod_user = _run_as_user(spec.get("securityContext"), "spec.securityContext", None)

    parsed: list[_Parsed] = []
    seen: set[str] = set()
    # App containers first, then init containers: the order `container_demands` documents.
    for field, init in (("containers", False), ("initContainers", True)):
        for i, container in enumerate(_sequence(spec.get(field), f"spec.{field}")):
            where = f"spec.{field}[{i}]"
            if not is_object(container):
                raise InvalidRequest(f"{where} is a {type(container).__name__}, not an object")
            cname = container.get("name")
            if not isinstance(cname, str) or not cname:
                raise InvalidRequest(f"{where} has no name")
            if cname in seen:
                raise InvalidRequest(f"container name {cname!r} appears twice")
            seen.add(cname)
            # A restartable init container (sidecar) keeps running beside the later init
            # containers and the app containers; `demand_on` adds it to both.
            sidecar = init and container.get("restartPolicy") == "Always"
            ask = _container_ask(
                container,
                cname,
                budgets,
                init=init,
                sidecar=sidecar,
                max_gpu_memory_mib=max_gpu_memory_mib,
                max_units=max_units,
            )
            if ask is None:
                continue
            user = _run_as_user(
                container.get("securityContext"), f"container {cname!r}: securityContext", pod_user
            )
            parsed.append(_Parsed(ask, user))

    if not parsed:
        return ShareRequest(
            namespace=namespace, name=name, pod_uid=uid, kind="none", priority=priority
        )
    share = [p for p in parsed if p.ask.asks_share]
    whole = [p for p in parsed if p.ask.gpus is not None]
    if share and whole:
        raise InvalidRequest(
            f"pod mixes shared-GPU containers ({_names(share)}) with whole-GPU containers "
            f"({_names(whole)}); use mpsched.io/gpus in all of them or in none"
        )
    users = {p.run_as_user for p in parsed}
    containers = tuple(p.ask for p in parsed)
    kind: RequestKind
    if whole:
        kind = "whole"
        (whole_gpus,) = effective(((p.role, (p.ask.gpus or 0,)) for p in whole), 1)
        # Whole GPUs are never shared, so differing users do not matter; record one if common.
        run_as_user = users.pop() if len(users) == 1 else None
    else:
        if len(users) > 1:
            shown = ", ".join(
                f"{p.ask.name!r} ({'image default' if p.run_as_user is None else p.run_as_user})"
                for p in share
            )
            raise InvalidRequest(
                f"containers {shown} have different effective runAsUser: one MPS server serves "
                "one UID, so the share containers of a pod must run as the same user"
            )
        _check_pod_totals(share, max_gpu_memory_mib=max_gpu_memory_mib, max_units=max_units)
        kind, whole_gpus, run_as_user = "share", 0, users.pop()
    # Built whole, not with dataclasses.replace: that is a slow Python-level function.
    return ShareRequest(
        namespace=namespace,
        name=name,
        pod_uid=uid,
        priority=priority,
        kind=kind,
        containers=containers,
        whole_gpus=whole_gpus,
        run_as_user=run_as_user,
    )


def _check_pod_totals(
    share: Sequence[_Parsed], *, max_gpu_memory_mib: int | None, max_units: int | None
) -> None:
    """All share containers of a pod land on one GPU: what runs at the same time, by the
    effective-request rule, must fit one (an init container beside the sidecars started before
    it, or the app containers beside every sidecar)."""
    if len(share) < 2:
        return
    threads, memory, units = effective(
        ((p.role, (p.ask.threads or 0, p.ask.memory_mib or 0, p.ask.units or 0)) for p in share),
        3,
    )
    if threads > 100:
        raise InvalidRequest(
            f"containers {_names(share)} need {THREADS}={threads} at once, above 100 (init "
            "containers run beside the sidecars started before them, app containers beside "
            "every sidecar): a pod's share containers run on one GPU"
        )
    if max_gpu_memory_mib is not None and memory > max_gpu_memory_mib:
        raise InvalidRequest(
            f"containers {_names(share)} need {MEMORY}={memory}Mi at once, larger than any "
            f"GPU ({max_gpu_memory_mib} MiB): a pod's share containers run on one GPU"
        )
    if max_units is not None and units > max_units:
        raise InvalidRequest(
            f"containers {_names(share)} need {UNITS}={units} at once, above {max_units}, "
            "the most share units any GPU has: a pod's share containers run on one GPU"
        )


def _container_ask(
    container: Mapping[Any, Any],
    cname: str,
    budgets: BudgetSettings,
    *,
    init: bool,
    sidecar: bool,
    max_gpu_memory_mib: int | None,
    max_units: int | None,
) -> ContainerAsk | None:
    where = f"container {cname!r}"
    values = _resource_values(container, where)
    if not values:
        return None

    threads = _count(values, where, THREADS, high=100, why=" (percent of one GPU's threads)")
    units = _count(values, where, UNITS, high=max_units, why=" (the most share units any GPU has)")
    gpus = _count(values, where, GPUS)
    clients = _count(values, where, CLIENTS, high=MAX_CLIENTS, why=" (MPS client limit of one GPU)")
    memory: int | None = None
    if MEMORY in values:
        raw = values[MEMORY]
        size = _whole(raw, where, MEMORY)
        if size <= 0:
            raise InvalidRequest(f"{where}: {MEMORY}={_shown(raw)} must be positive")
        memory = -(-size // MIB)  # round up: a pod never gets less memory than it asked for
        if max_gpu_memory_mib is not None and memory > max_gpu_memory_mib:
            raise InvalidRequest(
                f"{where}: {MEMORY}={_shown(raw)} ({memory} MiB) is larger than any GPU "
                f"({max_gpu_memory_mib} MiB)"
            )

    asked = [r for r, v in ((THREADS, threads), (MEMORY, memory), (UNITS, units)) if v is not None]
    if units is not None and len(asked) > 1:
        raise InvalidRequest(
            f"{where}: {UNITS} cannot be combined with {' or '.join(asked[:-1])} "
            "(ask either threads/memory or units)"
        )
    if gpus is not None and asked:
        raise InvalidRequest(
            f"{where}: {GPUS} (whole GPUs) cannot be combined with {', '.join(asked)} (a share)"
        )
    if not asked and gpus is None:
        raise InvalidRequest(
            f"{where}: {CLIENTS} needs {THREADS}, {MEMORY}, {UNITS} or {GPUS} in the same container"
        )
    if memory is not None and threads is None and not budgets.proportional:
        raise InvalidRequest(
            f"{where}: {MEMORY} without {THREADS} needs budgets.proportional, which is off"
        )
    return ContainerAsk(
        name=cname,
        init=init,
        sidecar=sidecar,
        threads=threads,
        memory_mib=memory,
        units=units,
        gpus=gpus,
        clients=1 if clients is None else clients,
    )


def _count(
    values: Mapping[str, object],
    where: str,
    resource: str,
    *,
    low: int = 1,
    high: int | None = None,
    why: str = "",
) -> int | None:
    """The whole count `resource` asks, checked against its bounds; None when not asked. (A
    function of its own: compiled, a nested one builds its closure on every call.)"""
    if resource not in values:
        return None
    raw = values[resource]
    n = _whole(raw, where, resource)
    if n < low:
        raise InvalidRequest(f"{where}: {resource}={_shown(raw)} is below {low}")
    if high is not None and n > high:
        raise InvalidRequest(f"{where}: {resource}={_shown(raw)} is above {high}{why}")
    return n


def _resource_values(container: Mapping[Any, Any], where: str) -> dict[str, object]:
    """`mpsched.io/*` values from limits and requests. Kubernetes requires an extended
    resource's request to equal its limit and fills in a missing request from the limit."""
    resources = _mapping(container.get("resources"), f"{where}: resources")
    limits = _mapping(resources.get("limits"), f"{where}: resources.limits")
    requests = _mapping(resources.get("requests"), f"{where}: resources.requests")
    values: dict[str, object] = {}
    for section in (limits, requests):
        for key, raw in section.items():
            if not isinstance(key, str) or not key.startswith(PREFIX) or key == MPS_DELIVERY:
                continue
            if key not in RESOURCES:
                raise InvalidRequest(
                    f"{where}: unknown resource {key!r} (known: {', '.join(RESOURCES)})"
                )
            # Equal texts are equal quantities: parse only when they differ (the usual pod
            # writes the same text in limits and requests).
            if (
                key in values
                and values[key] != raw
                and _exact(values[key], where, key) != _exact(raw, where, key)
            ):
                raise InvalidRequest(
                    f"{where}: {key} request {_shown(raw)} differs from limit "
                    f"{_shown(values[key])} (extended resources need requests == limits)"
                )
            values.setdefault(key, raw)
    return values


def _exact(raw: object, where: str, resource: str) -> Fraction:
    try:
        return parse_quantity(raw)
    except QuantityError as exc:
        raise InvalidRequest(f"{where}: {resource}={_shown(raw)}: {exc}") from exc


def _whole(raw: object, where: str, resource: str) -> int:
    fast = whole_quantity(raw)
    if fast is not None:
        return fast
    q = _exact(raw, where, resource)
    if q.denominator != 1:
        raise InvalidRequest(
            f"{where}: {resource}={_shown(raw)} is not a whole number "
            "(Kubernetes extended resources are integers)"
        )
    return int(q)


def _run_as_user(context: object, where: str, inherited: int | None) -> int | None:
    """The effective runAsUser: a container's securityContext overrides the pod's."""
    ctx = _mapping(context, where)
    user = ctx.get("runAsUser")
    if user is None:
        return inherited
    if isinstance(user, bool) or not isinstance(user, int) or user < 0:
        raise InvalidRequest(f"{where}.runAsUser={user!r} is not a valid UID")
    return user


def _mapping(value: object, where: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not is_object(value):
        raise InvalidRequest(f"{where} is a {type(value).__name__}, not an object")
    return value


def _sequence(value: object, where: str) -> Sequence[object]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequest(f"{where} is a {type(value).__name__}, not a list")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}={value!r} is not a string")
    return value


def _shown(raw: object) -> str:
    return raw.strip() if isinstance(raw, str) else repr(raw)


def _names(parsed: Sequence[_Parsed]) -> str:
    return ", ".join(repr(p.ask.name) for p in parsed)
