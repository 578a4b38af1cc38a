"""Kubernetes Node and Pod objects (plain JSON, as the API serves them) read into what the core
decides from: a node's GPU inventory and allocatable resources, a pod's effective CPU and
memory request, its placement and the allocation it carries.

Owns the one reading of each rule, so that `serve` and `simulate` cannot disagree:

- **the effective-request rule** (Kubernetes' `resourcehelper.PodRequests`): per resource, the
  larger of the app containers' sum (restartable init containers, "sidecars", included) and,
  for each regular init container, itself plus the sidecars started before it; then the pod's
  `overhead`. A missing request defaults to the limit, as the API server does;
- **one rounding**: a pod's request is rounded *up* (CPU to millicores, memory to MiB: a pod
  never gets less than it asked for), a node's allocatable is rounded *down* (a budget never
  promises what is not there);
- **a node's inventory**: the `mpsched.io/gpus` annotation, else GPU Feature Discovery or GKE
  labels; nodes outside the configured selection are excluded with the reason filter gives.

Pure: no I/O, no caches that outlive a call except the explicit `QuantityMemo`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from extender.packing.bounds import MAX_GPUS_PER_NODE
from extender.packing.codec import INVENTORY_KEY, decode_inventory
from extender.packing.codec_labels import inventory_from_labels
from extender.packing.effective import Role, effective
from extender.packing.errors import CodecError, PackingError
from extender.packing.ledger import Allocation
from extender.packing.model import NodeInventory
from extender.packing.podspec import is_object
from extender.packing.policies import WHOLE, PodShape
from extender.packing.quantity import MIB, parse_quantity
from extender.packing.request import ShareRequest
from extender.packing.settings import BudgetSettings, NodeSelection
from extender.packing.view import pod_shape

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
#: Distinct quantity strings remembered by a `QuantityMemo` (pods repeat a few sizes).
MEMO_SIZE: Final = 4096
_MILLI: Final = Fraction(1000)
_PER_MIB: Final = Fraction(1, MIB)


def mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else an empty one (objects from the wire are untrusted)."""
    # None (an absent field, the commonest non-object) is answered before `is_object`.
    return value if value is not None and is_object(value) else {}


def string_labels(value: object) -> dict[str, str]:
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


class QuantityMemo:
    """Parsed quantities by their text, bounded: reading 60,000 pods parses the same few
    strings ("500m", "2Gi") again and again, and Fraction arithmetic is slow."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        #: Keyed by (text, in MiB rather than thousandths, rounded up): a key without the
        #: Fraction factor, whose hash is a Python-level method (slow on every lookup).
        self._memo: dict[tuple[object, bool, bool], int] = {}

    def milli(self, raw: object, *, round_up: bool) -> int | None:
        """`raw` in thousandths (CPU in millicores); None when absent or not a quantity."""
        return self._scaled(raw, _MILLI, mib=False, round_up=round_up)

    def mib(self, raw: object, *, round_up: bool) -> int | None:
        """`raw` bytes in MiB; None when absent or not a quantity."""
        return self._scaled(raw, _PER_MIB, mib=True, round_up=round_up)

    def _scaled(self, raw: object, factor: Fraction, *, mib: bool, round_up: bool) -> int | None:
        if raw is None or isinstance(raw, bool) or not isinstance(raw, str | int | float):
            return None
        key = (raw, mib, round_up)
        found = self._memo.get(key)
        if found is not None:
            return found
        try:
            value = parse_quantity(raw) * factor  # exact, then rounded once
        except PackingError:
            return None
        out = math.ceil(value) if round_up else math.floor(value)
        if len(self._memo) < MEMO_SIZE:
            self._memo[key] = out
        return out


@dataclass(frozen=True, slots=True)
class PodResources:
    """A pod's effective request of the node resources the core tracks."""

    cpu_milli: int
    memory_mib: int


def _container_request(container: object, name: str, memo: QuantityMemo, *, mib: bool) -> int:
    resources = mapping(mapping(container).get("resources"))
    raw = mapping(resources.get("requests")).get(name)
    if raw is None:  # the API server defaults a missing request to the limit
        raw = mapping(resources.get("limits")).get(name)
    value = memo.mib(raw, round_up=True) if mib else memo.milli(raw, round_up=True)
    return value or 0


def _effective(spec: Mapping[str, Any], name: str, memo: QuantityMemo, *, mib: bool) -> int:
    """One resource's effective request (`effective.effective`) plus the pod's overhead."""
    parts: list[tuple[Role, tuple[int, ...]]] = []
    for c in spec.get("initContainers") or ():
        sidecar = is_object(c) and c.get("restartPolicy") == "Always"
        role = Role.SIDECAR if sidecar else Role.INIT
        parts.append((role, (_container_request(c, name, memo, mib=mib),)))
    for c in spec.get("containers") or ():
        parts.append((Role.APP, (_container_request(c, name, memo, mib=mib),)))
    (request,) = effective(parts, 1)
    raw = mapping(spec.get("overhead")).get(name)
    overhead = (memo.mib(raw, round_up=True) if mib else memo.milli(raw, round_up=True)) or 0
    return request + overhead


def pod_requests(spec: Mapping[str, Any], memo: QuantityMemo | None = None) -> PodResources:
    """The pod's effective CPU (millicores) and memory (MiB) request (module docstring)."""
    memo = memo or QuantityMemo()
    return PodResources(
        _effective(spec, "cpu", memo, mib=False), _effective(spec, "memory", memo, mib=True)
    )


#: NVIDIA's device-plugin resource: whole GPUs the kubelet hands out, outside mpsched.
DEVICE_PLUGIN_GPU: Final = "nvidia.com/gpu"


def device_plugin_gpus(spec: Mapping[str, Any], memo: QuantityMemo | None = None) -> int:
    """Whole GPUs the pod holds through NVIDIA's device plugin, by the effective-request rule
    (an extended resource: limits equal requests). At most a node's 64 (`bounds`): a pod
    asking more holds all its node's GPUs, and sums over a node's pods stay small."""
    milli = _effective(spec, DEVICE_PLUGIN_GPU, memo or QuantityMemo(), mib=False)
    return min(MAX_GPUS_PER_NODE, -(-milli // 1000))


def pod_cpu_milli(spec: Mapping[str, Any], memo: QuantityMemo | None = None) -> int:
    """The effective CPU request alone (what the policies weigh)."""
    return _effective(spec, "cpu", memo or QuantityMemo(), mib=False)


@dataclass(frozen=True, slots=True)
class NodeReading:
    """A Node object as the core sees it: its inventory, or why it takes no GPU pods."""

    name: str
    #: Allocatable CPU (millicores) and memory (MiB), rounded down; None where not reported.
    cpu_milli: int | None
    memory_mib: int | None
    inventory: NodeInventory | None
    #: Why `inventory` is None: the reason filter gives for this node.
    excluded: str | None = None
    #: The inventory was there but refused (malformed, or a number out of its documented
    #: range): `excluded` says why, and the operator is told.
    refused: bool = False


def read_node(
    node: Mapping[str, Any],
    budgets: BudgetSettings,
    selection: NodeSelection,
    memo: QuantityMemo | None = None,
) -> NodeReading | None:
    """The node's reading, or None for an object without a name."""
    memo = memo or QuantityMemo()
    meta = mapping(node.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    status = mapping(node.get("status"))
    allocatable = mapping(status.get("allocatable"))
    cpu = memo.milli(allocatable.get("cpu"), round_up=False)
    memory = memo.mib(allocatable.get("memory"), round_up=False)
    labels = string_labels(meta.get("labels"))
    text = mapping(meta.get("annotations")).get(INVENTORY_KEY)
    inventory: NodeInventory | None
    try:
        if text is not None:
            inventory = decode_inventory(name, text, budgets=budgets, labels=labels)
        else:
            capacity = mapping(status.get("capacity"))
            inventory = inventory_from_labels(name, labels, budgets=budgets, capacity=capacity)
    except CodecError as exc:
        return NodeReading(name, cpu, memory, None, f"GPU inventory unreadable: {exc}", True)
    if inventory is None:
        reason = "node has no GPU inventory (no mpsched.io/gpus, no GPU labels)"
        return NodeReading(name, cpu, memory, None, reason)
    if not selection.selects(labels):
        return NodeReading(name, cpu, memory, None, "node is not selected by nodes.selector")
    inventory = dataclasses.replace(
        inventory,
        multi_user=selection.multi_user(labels),
        cpu_milli=cpu,
        memory_mib=memory,
    )
    return NodeReading(name, cpu, memory, inventory)


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where a pod stands, read from its object: identity, node, priority, phase."""

    uid: str
    namespace: str
    name: str
    node: str | None
    priority: int
    terminal: bool


def read_placement(pod: Mapping[str, Any]) -> PodPlacement | None:
    """The pod's identity and placement, or None for an object without a uid."""
    meta = mapping(pod.get("metadata"))
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    spec = mapping(pod.get("spec"))
    node = spec.get("nodeName") or None
    priority = spec.get("priority")
    namespace = meta.get("namespace")
    name = meta.get("name")
    return PodPlacement(
        uid=uid,
        namespace=namespace if isinstance(namespace, str) and namespace else "default",
        name=name if isinstance(name, str) else "",
        node=node if isinstance(node, str) else None,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        terminal=mapping(pod.get("status")).get("phase") in TERMINAL_PHASES,
    )


def observed_shape(
    request: ShareRequest | None, cpu_milli: int, alloc: Allocation | None, budgets: BudgetSettings
) -> PodShape | None:
    """A pod's shape for the learned typical-pod workload (`view.pod_shape`): a placed share's
    thread percent is its allocation's; a pending share's is its written thread asks, units
    counted on the default U, since no GPU is chosen yet (a memory-only ask, whose share depends
    on the GPU, counts as the smallest). None when its request is invalid."""
    if alloc is not None:
        return pod_shape(alloc, cpu_milli, threads=alloc.threads)
    if request is None:
        return None
    threads = 0
    for ask in request.containers:
        if ask.init or not ask.asks_share:
            continue
        if ask.threads is not None:
            threads += ask.threads
        elif ask.units is not None:
            threads += WHOLE * ask.units // max(1, budgets.default_units)
    return pod_shape(request, cpu_milli, threads=threads)
