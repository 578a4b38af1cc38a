"""Turning cluster objects into ledger state (DESIGN §5 step 4): node inventories from the
`mpsched.io/gpus` annotation or GPU labels, allocations from the `mpsched.io/allocation`
annotation of every non-terminal pod, and the CPU requested on each node.

Owns the rules for reading Nodes and Pods, and nothing else: it mutates the ledger it is given
and reports every node whose state changed through `on_change`, so that caches keyed on node
state can refresh exactly those nodes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.cluster import ClusterEvent
from extender.config import Config
from extender.packing.codec import (
    ALLOCATION_KEY,
    INVENTORY_KEY,
    decode_allocation,
    decode_inventory,
    inventory_from_labels,
)
from extender.packing.errors import CodecError, LedgerError, PackingError
from extender.packing.ledger import Allocation, Ledger
from extender.packing.model import NodeInventory
from extender.packing.podspec import parse_pod
from extender.packing.policies import PodShape
from extender.packing.quantity import parse_quantity

log = logging.getLogger(__name__)

#: Free CPU reported for a node whose allocatable CPU is unknown: large enough never to limit.
UNKNOWN_CPU_FREE: Final = 10**9
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True)
class PodRecord:
    """What the service remembers of one non-terminal pod."""

    namespace: str
    name: str
    node: str | None
    cpu_milli: int
    priority: int
    #: The pod's shape for the typical-pod workload; None when its request is invalid.
    shape: PodShape | None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _labels(value: object) -> dict[str, str]:
    return {k: v for k, v in _mapping(value).items() if isinstance(v, str)}


class ClusterState:
    """The cluster as the ledger needs it. Not thread-safe; the service calls it from the loop."""

    def __init__(self, ledger: Ledger, config: Config, *, on_change: Callable[[str], None]) -> None:
        self.ledger = ledger
        self.config = config
        self._on_change = on_change
        self.pods: dict[str, PodRecord] = {}
        #: Node → allocatable CPU in millicores (None: unknown), for every node seen.
        self.cpu_allocatable: dict[str, int | None] = {}
        #: Node → CPU requested by the non-terminal pods bound to it.
        self.cpu_used: dict[str, int] = {}
        #: Nodes that exist but are not scheduled onto, with the reason filter gives.
        self.excluded: dict[str, str] = {}
        #: Allocations seen on pods whose node has no inventory yet (listing order, or an agent
        #: that has not published): applied when the node arrives.
        self._orphans: dict[str, Allocation] = {}
        self._cpu_cache: dict[object, int] = {}
        #: Allocations found in the cluster that the ledger refused (drift), for logs and tests.
        self.drift = 0
        #: Bumped whenever a node's inventory enters, changes or leaves the ledger.
        self.inventory_version = 0

    # -- nodes ------------------------------------------------------------------------------

    def apply_node(self, node: Mapping[str, Any]) -> None:
        meta = _mapping(node.get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        status = _mapping(node.get("status"))
        cpu = self._cpu_milli(_mapping(status.get("allocatable")).get("cpu"))
        if self.cpu_allocatable.get(name, -1) != cpu:
            self.cpu_allocatable[name] = cpu
            self._on_change(name)
        labels = _labels(meta.get("labels"))
        inventory = self._inventory(name, labels, _mapping(meta.get("annotations")), status)
        if inventory is None:
            self._drop_node(name)
            return
        self.excluded.pop(name, None)
        current = self.ledger.get_node(name)
        # Node status heartbeats arrive every few seconds per node: only a real change of the
        # inventory may reset the node's usage and its cache entries.
        if current is not None and current.inventory == inventory:
            return
        for alloc in self.ledger.set_node(inventory):
            log.warning("node %s changed: allocation of pod %s no longer fits", name, alloc.key)
        self.inventory_version += 1
        self._on_change(name)
        for uid, alloc in list(self._orphans.items()):
            if alloc.node == name:
                del self._orphans[uid]
                self._assume(alloc)

    def _inventory(
        self,
        name: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, Any],
        status: Mapping[str, Any],
    ) -> NodeInventory | None:
        budgets = self.config.budgets
        text = annotations.get(INVENTORY_KEY)
        inventory: NodeInventory | None
        try:
            if text is not None:
                inventory = decode_inventory(name, text, budgets=budgets, labels=labels)
            else:
                capacity = _mapping(status.get("capacity"))
                inventory = inventory_from_labels(name, labels, budgets=budgets, capacity=capacity)
        except CodecError as exc:
            log.warning("%s", exc)
            self.excluded[name] = f"GPU inventory unreadable: {exc}"
            return None
        if inventory is None:
            self.excluded[name] = "node has no GPU inventory (no mpsched.io/gpus, no GPU labels)"
            return None
        selector = self.config.nodes.selector
        if selector and any(labels.get(k) != v for k, v in selector.items()):
            self.excluded[name] = "node is not selected by the mpsched nodes.selector"
            return None
        multi = self.config.isolation.multi_user_node_selector
        multi_user = bool(multi) and all(labels.get(k) == v for k, v in (multi or {}).items())
        cpu = self.cpu_allocatable.get(name)
        return dataclasses.replace(inventory, multi_user=multi_user, cpu_milli=cpu)

    def remove_node(self, name: str) -> None:
        self.cpu_allocatable.pop(name, None)
        self.excluded.pop(name, None)
        self._drop_node(name)

    def _drop_node(self, name: str) -> None:
        if self.ledger.get_node(name) is None:
            return
        for alloc in self.ledger.remove_node(name):
            # The pods are still there; their allocation returns if the node does.
            self._orphans[alloc.pod_uid] = alloc
        self.inventory_version += 1
        self._on_change(name)

    # -- pods -------------------------------------------------------------------------------

    def apply_pod(self, pod: Mapping[str, Any]) -> None:
        meta = _mapping(pod.get("metadata"))
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        spec = _mapping(pod.get("spec"))
        phase = _mapping(pod.get("status")).get("phase")
        if phase in TERMINAL_PHASES:
            self.forget_pod(uid)
            return
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        node = spec.get("nodeName") or None
        node = node if isinstance(node, str) else None
        priority = spec.get("priority")
        priority = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
        cpu = self.pod_cpu_milli(spec)
        old = self.pods.get(uid)
        self._move_cpu(old, node, cpu)
        alloc = self._pod_allocation(meta, uid, namespace, name, priority, node)
        held = self.ledger.allocation(uid)
        if alloc is not None:
            if held != alloc:
                if held is not None:
                    self._release(uid)
                self._assume(alloc)
            elif self.ledger.state(uid) != "confirmed":
                self.ledger.confirm(uid)
        elif held is not None and node is not None:
            # Bound without a readable allocation for that node: someone else placed the pod
            # (or the annotation was damaged), and our reservation for it is void.
            self._release(uid)
        # Parse the pod's shape once per placement, not on every status update.
        same = old is not None and old.node == node
        shape = old.shape if old is not None and same else self._shape(pod, cpu, alloc)
        self.pods[uid] = PodRecord(namespace, name, node, cpu, priority, shape)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone or terminal: its share and its CPU return."""
        record = self.pods.pop(uid, None)
        self._move_cpu(record, None, 0)
        self._orphans.pop(uid, None)
        self._release(uid)

    def _pod_allocation(
        self,
        meta: Mapping[str, Any],
        uid: str,
        namespace: str,
        name: str,
        priority: int,
        node: str | None,
    ) -> Allocation | None:
        text = _mapping(meta.get("annotations")).get(ALLOCATION_KEY)
        if text is None or node is None:
            return None
        try:
            alloc = decode_allocation(
                text, pod_uid=uid, namespace=namespace, name=name, priority=priority
            )
        except CodecError as exc:
            log.warning("%s", exc)
            return None
        if alloc.node != node:
            log.warning(
                "pod %s/%s: allocation names node %s but the pod is bound to %s; ignored",
                namespace,
                name,
                alloc.node,
                node,
            )
            return None
        return alloc

    def _assume(self, alloc: Allocation) -> None:
        if self.ledger.get_node(alloc.node) is None:
            self._orphans[alloc.pod_uid] = alloc
            return
        try:
            self.ledger.assume(alloc, confirmed=True)
        except LedgerError as exc:
            self.drift += 1
            log.warning("allocation of pod %s is not in the ledger: %s", alloc.key, exc)
            return
        self._on_change(alloc.node)

    def _release(self, uid: str) -> None:
        alloc = self.ledger.release(uid)
        if alloc is not None:
            self._on_change(alloc.node)

    def _move_cpu(self, old: PodRecord | None, node: str | None, cpu: int) -> None:
        if old is not None and old.node is not None:
            left = self.cpu_used.get(old.node, 0) - old.cpu_milli
            self.cpu_used[old.node] = max(0, left)
            if old.node != node or old.cpu_milli != cpu:
                self._on_change(old.node)
        if node is not None:
            self.cpu_used[node] = self.cpu_used.get(node, 0) + cpu
            if old is None or old.node != node or old.cpu_milli != cpu:
                self._on_change(node)

    def cpu_free(self, node: str) -> int:
        allocatable = self.cpu_allocatable.get(node)
        if allocatable is None:
            return UNKNOWN_CPU_FREE
        return allocatable - self.cpu_used.get(node, 0)

    # -- shapes and CPU ---------------------------------------------------------------------

    def _shape(self, pod: Mapping[str, Any], cpu: int, alloc: Allocation | None) -> PodShape | None:
        if alloc is not None:
            if alloc.kind == "whole":
                return PodShape(cpu, 100, len(alloc.gpus))
            return PodShape(cpu, min(99, max(1, alloc.threads)), 1)
        try:
            request = parse_pod(pod, self.config.budgets)
        except PackingError:
            return None
        if request.kind == "none":
            return PodShape(cpu, 0, 0)
        if request.kind == "whole":
            return PodShape(cpu, 100, request.whole_gpus)
        units = self.config.budgets.default_units
        threads = 0
        for ask in request.containers:
            if ask.init or not ask.asks_share:
                continue
            if ask.threads is not None:
                threads += ask.threads
            elif ask.units is not None:
                threads += 100 * ask.units // max(1, units)
        # A memory-only ask's thread share depends on the GPU it lands on; count it as small.
        return PodShape(cpu, min(99, max(1, threads)), 1)

    def pod_cpu_milli(self, spec: Mapping[str, Any]) -> int:
        """The pod's effective CPU request (Kubernetes' rule: the larger of the app containers'
        sum, sidecars included, and the largest init container) plus its overhead."""
        app = 0
        init = 0
        for c in spec.get("initContainers") or ():
            cpu = self._container_cpu(c)
            if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
                app += cpu
            else:
                init = max(init, cpu)
        for c in spec.get("containers") or ():
            app += self._container_cpu(c)
        overhead = self._cpu_milli(_mapping(spec.get("overhead")).get("cpu")) or 0
        return max(app, init) + overhead

    def _container_cpu(self, container: object) -> int:
        resources = _mapping(_mapping(container).get("resources"))
        # The API server defaults a missing request to the limit.
        raw = _mapping(resources.get("requests")).get("cpu")
        if raw is None:
            raw = _mapping(resources.get("limits")).get("cpu")
        return self._cpu_milli(raw) or 0

    def _cpu_milli(self, raw: object) -> int | None:
        if raw is None or not isinstance(raw, str | int | float) or isinstance(raw, bool):
            return None
        cached = self._cpu_cache.get(raw)
        if cached is not None:
            return cached
        try:
            milli = math.ceil(parse_quantity(raw) * 1000)
        except PackingError:
            return None
        if len(self._cpu_cache) < 4096:
            self._cpu_cache[raw] = milli
        return milli

    # -- events -----------------------------------------------------------------------------

    def handle(self, event: ClusterEvent) -> None:
        if event.kind == "Node":
            if event.type == "DELETED":
                name = _mapping(event.obj.get("metadata")).get("name")
                if isinstance(name, str):
                    self.remove_node(name)
            else:
                self.apply_node(event.obj)
        elif event.type == "DELETED":
            uid = _mapping(event.obj.get("metadata")).get("uid")
            if isinstance(uid, str):
                self.forget_pod(uid)
        else:
            self.apply_pod(event.obj)

    def max_gpu_facts(self) -> tuple[int | None, int | None]:
        """The largest GPU memory (MiB) and units per GPU in the ledger, for parse_pod."""
        memory = units = 0
        for name in self.ledger.node_names():
            for g in self.ledger.node(name).gpus:
                memory = max(memory, g.info.memory_mib)
                units = max(units, g.info.units)
        return (memory or None), (units or None)
