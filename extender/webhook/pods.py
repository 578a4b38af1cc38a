"""Reading the parts of a Pod object that admission decides on: its containers of every kind,
which of them ask for `mpsched.io/*`, its volumes and its `mpsched.io/` annotations.

Owns the tolerant reading only (a missing field is empty, a field of the wrong type raises
`Malformed` naming it); what is allowed is decided in `admission` and `validation`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from extender.packing.podspec import GPUS, MPS_DELIVERY, PREFIX
from extender.packing.request import ContainerAsk

#: The containers of a pod spec that can ask for resources (ephemeral containers cannot).
CONTAINER_FIELDS: Final = ("containers", "initContainers")
#: Every kind of container: the ones above and those `kubectl debug` adds to a running pod.
ALL_CONTAINER_FIELDS: Final = (*CONTAINER_FIELDS, "ephemeralContainers")


class Malformed(Exception):
    """A part of the pod the decisions read has the wrong type (the API server never sends one;
    a hand-made review may)."""


def mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Malformed(f"{where} must be an object, got {type(value).__name__}")
    return value


def items(value: object, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Malformed(f"{where} must be a list, got {type(value).__name__}")
    return value


def spec_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(pod.get("spec"), "spec")


def containers(
    pod: Mapping[str, Any], fields: Sequence[str] = CONTAINER_FIELDS
) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) for every container of the kinds `fields` names."""
    spec = spec_of(pod)
    for field in fields:
        for i, container in enumerate(items(spec.get(field), f"spec.{field}")):
            yield field, i, mapping(container, f"spec.{field}[{i}]")


def asking_containers(
    pod: Mapping[str, Any], asks: Mapping[str, ContainerAsk]
) -> Iterator[tuple[str, int, Mapping[str, Any], str, ContainerAsk]]:
    """(field, index, container, name, ask) for every container that asks mpsched for
    something (`asks` by container name); the others are never touched."""
    for field, i, container in containers(pod):
        name = container.get("name", "")
        ask = asks.get(name)
        if ask is not None:
            yield field, i, container, name, ask


def resource_keys(container: Mapping[str, Any], where: str) -> set[str]:
    """The resource names of a container's limits and requests."""
    resources = mapping(container.get("resources"), f"{where}.resources")
    keys: set[str] = set()
    for section in ("limits", "requests"):
        values = mapping(resources.get(section), f"{where}.resources.{section}")
        keys.update(k for k in values if isinstance(k, str))
    return keys


def asks(container: Mapping[str, Any], where: str) -> bool:
    """Whether a container asks for an `mpsched.io/*` share or GPUs: any `mpsched.io/` resource
    (an unknown name too, so that the parser rejects it with its reason) but `mpsched.io/mps`,
    the delivery resource the webhook adds, which only reaches what an ask was given."""
    return any(k.startswith(PREFIX) and k != MPS_DELIVERY for k in resource_keys(container, where))


def asks_share(container: Mapping[str, Any], where: str) -> bool:
    """Whether a container asks for a share (an ask, and not whole GPUs): an MPS client."""
    return asks(container, where) and GPUS not in resource_keys(container, where)


def asks_mpsched(pod: Mapping[str, Any]) -> bool:
    """Whether any container asks for an `mpsched.io/` resource other than `mpsched.io/mps`
    (what the deploy manifests' matchConditions test in CEL). Raises Malformed."""
    return any(asks(c, f"spec.{f}[{i}]") for f, i, c in containers(pod))


def mpsched_annotations(pod: object) -> dict[str, object]:
    """The pod's annotations under `mpsched.io/` (those only mpsched writes)."""
    if not isinstance(pod, Mapping):
        return {}
    meta = mapping(pod.get("metadata"), "metadata")
    annotations = mapping(meta.get("annotations"), "metadata.annotations")
    return {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)}


def volumes(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The pod's volumes by name."""
    out = {}
    for i, volume in enumerate(items(spec_of(pod).get("volumes"), "spec.volumes")):
        read = mapping(volume, f"spec.volumes[{i}]")
        name = read.get("name")
        if isinstance(name, str):
            out[name] = read
    return out
