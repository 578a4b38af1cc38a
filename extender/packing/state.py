"""The decision state: everything the extender decides from, as one object — the ledger, the
cluster's bookkeeping (pods, CPU requested per node, excluded nodes), the evaluator's caches and
the parser — built from cluster objects and kept current by `apply(event)`.

Owns the truth rules of docs/design.md that concern what runs:

1. every bound, non-terminal pod counts, as its allocation says, over budget or not
   (`Ledger.record`); nothing that runs is dropped to make the numbers fit;
2. an allocation is immutable once seen for a pod UID: a later edit or removal of the pod's
   annotation changes nothing here and is reported (a `Notice`);
7. one configuration decides a whole state: a reconfiguration builds a new `DecisionState` from
   the cluster and the service swaps one reference, so no bind decides half under each.

`apply` reports what it touched (the nodes whose state changed, and notices for the operator)
so the caller can log, count and record Events; the state itself never does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from extender.packing.codec import ALLOCATION_KEY, allocation_annotations, decode_allocation_on
from extender.packing.errors import LedgerError
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, allocate
from extender.packing.ledger import Allocation, GpuUsage, Ledger
from extender.packing.notices import Crossings, Notice
from extender.packing.objects import (
    QuantityMemo,
    device_plugin_gpus,
    mapping,
    observed_shape,
    pod_cpu_milli,
    read_node,
    read_placement,
)
from extender.packing.parsing import PodParser
from extender.packing.policies import (
    NodeState,
    NodeTypes,
    Workload,
    all_shapes,
    make_policy,
    node_types,
    typical_workload,
)
from extender.packing.policies.frag import Fragmentation
from extender.packing.results import Demand
from extender.packing.state_records import Applied, ObjectEvent, PodRecord, StateSettings
from extender.packing.workload import (
    DEFAULT_WORKLOAD,
    Learned,
    materially_different,
    types_materially_different,
)

#: Free CPU reported for a node whose allocatable CPU is unknown: large enough never to limit.
UNKNOWN_CPU_FREE = 10**9
#: Ended pods remembered for swaps: far more than can end while a new state is being built.
MAX_ENDED = 50_000


class DecisionState:
    """The ledger and everything around it for one configuration. Not thread-safe: the
    service calls it from one event loop and holds its bind lock around check-and-reserve."""

    def __init__(
        self, settings: StateSettings, *, workload: Workload = DEFAULT_WORKLOAD, native: bool = True
    ) -> None:
        self.settings = settings
        budgets = settings.budgets
        self.ledger = Ledger(budgets)
        self.workload = workload
        #: Every pod shape known with its share (the pinned loads'; () until learned).
        self.demand: Workload = ()
        #: The node types the policy weighs task types by (none known yet).
        self.types: NodeTypes = ()
        #: Measure and decide with the compiled build's C code where it has it.
        self.native = native
        self.frag = Fragmentation(workload, compiled=native)
        policy = make_policy(settings.policy.name, workload=workload, settings=settings.policy)
        # native=False: the fit and score in Python where the compiled build has them in C.
        self.evaluator = Evaluator(
            self.ledger, budgets, policy, cpu_free=self.cpu_free, native=native
        )
        self.parser = PodParser(budgets, cpu_milli=self._pod_cpu, limits=self.gpu_limits)
        self.pods: dict[str, PodRecord] = {}
        #: Node → allocatable CPU in millicores (None: unknown), for every node seen.
        self.cpu_allocatable: dict[str, int | None] = {}
        #: Node → CPU requested by the non-terminal pods bound to it.
        self.cpu_used: dict[str, int] = {}
        #: Node → GPUs its device-plugin pods hold (truth rule 3 of docs/design.md: they count).
        self.plugin_gpus: dict[str, int] = {}
        #: Nodes that exist but are not scheduled onto, with the reason filter gives.
        self.excluded: dict[str, str] = {}
        #: GPUs over budget and pods unplaced, as last reported (once per crossing each).
        self._crossings = Crossings()
        #: The excluded nodes whose inventory was refused (malformed or out of range): why.
        self.refused: dict[str, str] = {}
        #: Pods seen to end (deleted or terminal), newest last: a swap must not carry an older
        #: state's allocation for one of them back to life.
        self._ended: dict[str, None] = {}
        #: The allocation annotation each reservation of this state was bound with, until the
        #: watch shows the pod bound: a pod that carries exactly that text carries the reserved
        #: allocation, and is confirmed without decoding it again.
        self._written: dict[str, str] = {}
        self._memo = QuantityMemo()
        self._inventory_version = 0
        self._limits_version = -1
        self._limits: tuple[int | None, int | None] = (None, None)

    # -- events -----------------------------------------------------------------------------

    def apply(self, event: ObjectEvent) -> Applied:
        """Take one watch event into the state; what it touched."""
        out = Applied()
        obj = event.obj
        if event.kind == "Node":
            if event.type == "DELETED":
                name = mapping(obj.get("metadata")).get("name")
                if isinstance(name, str):
                    self._remove_node(name, out)
            else:
                self._apply_node(obj, out)
        elif event.type == "DELETED":
            uid = mapping(obj.get("metadata")).get("uid")
            if isinstance(uid, str):
                self._forget_pod(uid, out)
        else:
            self._apply_pod(obj, out)
        for node in out.touched:
            self.evaluator.touch(node)
        if out.touched:
            self._crossings.note(self.ledger, out.touched, out.notices)
        return out

    # -- nodes ------------------------------------------------------------------------------

    def _apply_node(self, obj: Mapping[str, Any], out: Applied) -> None:
        reading = read_node(obj, self.settings.budgets, self.settings.selection, self._memo)
        if reading is None:
            return
        name = reading.name
        if self.cpu_allocatable.get(name, -1) != reading.cpu_milli:
            self.cpu_allocatable[name] = reading.cpu_milli
            out.touched.add(name)
        if reading.inventory is None:
            reason = self.excluded[name] = reading.excluded or "node takes no GPU pods"
            self._note_refused(name, reason if reading.refused else None, out)
            self._drop_inventory(name, out)
            return
        self.excluded.pop(name, None)
        self.refused.pop(name, None)
        current = self.ledger.get_node(name)
        # Node status heartbeats arrive every few seconds per node: only a real change of the
        # inventory may touch the node's usage and its cache entries.
        if current is not None and current.inventory == reading.inventory:
            return
        self.ledger.set_node(reading.inventory)
        self.ledger.hold_elsewhere(name, self.plugin_gpus.get(name, 0))
        self._inventory_version += 1
        out.touched.add(name)

    def _note_refused(self, name: str, reason: str | None, out: Applied) -> None:
        """Report a refused inventory once per reason (status heartbeats repeat it)."""
        if reason is None:
            self.refused.pop(name, None)
        elif self.refused.get(name) != reason:
            self.refused[name] = reason
            out.notices.append(Notice("inventory_refused", "", name, "", reason))

    def _remove_node(self, name: str, out: Applied) -> None:
        self.cpu_allocatable.pop(name, None)
        self.excluded.pop(name, None)
        self.refused.pop(name, None)
        self._drop_inventory(name, out)

    def _drop_inventory(self, name: str, out: Applied) -> None:
        if self.ledger.get_node(name) is None:
            return
        # The pods still run: their allocations stay counted, unplaced, until the node returns.
        self.ledger.remove_node(name)
        self._inventory_version += 1
        out.touched.add(name)

    # -- pods -------------------------------------------------------------------------------

    def _apply_pod(self, obj: Mapping[str, Any], out: Applied) -> None:
        placement = read_placement(obj)
        if placement is None:
            return
        uid = placement.uid
        if placement.terminal:
            self._forget_pod(uid, out)
            return
        node = placement.node
        spec = mapping(obj.get("spec"))
        cpu = self._pod_cpu(spec)
        old = self.pods.get(uid)
        self._move_cpu(old, node, cpu, out)
        plugin = device_plugin_gpus(spec, self._memo)
        self._move_plugin_gpus(old, node, plugin, out)
        record = PodRecord(
            placement.namespace,
            placement.name,
            node,
            cpu,
            placement.priority,
            old.shape if old is not None and old.node == node else None,
        )
        record.plugin_gpus = plugin
        if old is not None:
            record.allocation = old.allocation
            record.allocation_text = old.allocation_text
            record.reported_text = old.reported_text
        text = mapping(mapping(obj.get("metadata")).get("annotations")).get(ALLOCATION_KEY)
        if node is None:
            record.parsed = self.parser.parse(obj)
        elif record.allocation is None:
            self._first_sight(record, uid, text, obj, out)
        elif text != record.allocation_text and text != record.reported_text:
            record.reported_text = text if isinstance(text, str) else None
            what = "removed" if text is None else "edited"
            out.notices.append(
                Notice(
                    "allocation_changed",
                    record.namespace,
                    record.name,
                    uid,
                    f"the {ALLOCATION_KEY} annotation was {what} on a bound pod; mpsched keeps "
                    "counting the allocation it first saw (allocations are immutable)",
                )
            )
        if record.shape is None:
            parsed = record.parsed
            if parsed is None and record.allocation is None:
                parsed = self.parser.parse(obj)
            request = parsed.demand.request if parsed and parsed.demand else None
            record.shape = observed_shape(request, cpu, record.allocation, self.settings.budgets)
        self.pods[uid] = record

    def _first_sight(
        self, record: PodRecord, uid: str, text: object, obj: Mapping[str, Any], out: Applied
    ) -> None:
        """A bound pod whose allocation this state has not seen yet."""
        node = record.node
        assert node is not None
        held = self.ledger.allocation(uid)
        written = self._written.pop(uid, None)
        if held is not None and written is not None and text == written and held.node == node:
            alloc: Allocation | None = held  # the very text the bind wrote for it
        else:
            alloc = self._decode(record, uid, node, text, out)
        if alloc is not None:
            record.allocation, record.allocation_text = alloc, str(text)
            if held is not None and held != alloc:
                self.ledger.release(uid)
                out.touched.add(held.node)
            self.ledger.record(alloc)
            out.touched.add(node)
        elif held is not None:
            if held.node == node:
                # Bound where we reserved, without a readable allocation: the pod runs there
                # and may use the GPUs; keep counting the reservation, now as fact.
                self.ledger.confirm(uid)
                record.allocation, record.allocation_text = held, None
            else:
                # Someone else placed the pod: the reservation for it here is void.
                self.ledger.release(uid)
                out.touched.add(held.node)

    def _decode(
        self, record: PodRecord, uid: str, node: str, text: object, out: Applied
    ) -> Allocation | None:
        if text is None:
            return None
        if not isinstance(text, str):
            text = repr(text)
        found = decode_allocation_on(
            text,
            node=node,
            pod_uid=uid,
            namespace=record.namespace,
            name=record.name,
            priority=record.priority,
        )
        if not isinstance(found, str):
            return found
        problem = found
        out.notices.append(
            Notice("allocation_unreadable", record.namespace, record.name, uid, problem)
        )
        return None

    def _forget_pod(self, uid: str, out: Applied) -> None:
        """The pod is gone or terminal: its share and its CPU return."""
        record = self.pods.pop(uid, None)
        self._written.pop(uid, None)
        self._ended[uid] = None
        if len(self._ended) > MAX_ENDED:
            del self._ended[next(iter(self._ended))]
        self._move_cpu(record, None, 0, out)
        self._move_plugin_gpus(record, None, 0, out)
        alloc = self.ledger.release(uid)
        if alloc is not None:
            out.touched.add(alloc.node)

    def _move_cpu(self, old: PodRecord | None, node: str | None, cpu: int, out: Applied) -> None:
        if old is not None and old.node is not None:
            left = self.cpu_used.get(old.node, 0) - old.cpu_milli
            self.cpu_used[old.node] = max(0, left)
            if old.node != node or old.cpu_milli != cpu:
                out.touched.add(old.node)
        if node is not None:
            self.cpu_used[node] = self.cpu_used.get(node, 0) + cpu
            if old is None or old.node != node or old.cpu_milli != cpu:
                out.touched.add(node)

    def _move_plugin_gpus(
        self, old: PodRecord | None, node: str | None, gpus: int, out: Applied
    ) -> None:
        changed: set[str] = set()
        if old is not None and old.node is not None and old.plugin_gpus:
            self.plugin_gpus[old.node] = self.plugin_gpus.get(old.node, 0) - old.plugin_gpus
            changed.add(old.node)
        if node is not None and gpus:
            self.plugin_gpus[node] = self.plugin_gpus.get(node, 0) + gpus
            changed.add(node)
        for name in changed:
            held = self.plugin_gpus.get(name, 0)
            if not held:
                self.plugin_gpus.pop(name, None)
            if self.ledger.hold_elsewhere(name, held):
                out.touched.add(name)

    # -- decisions --------------------------------------------------------------------------

    def reserve(self, demand: Demand, node: str) -> Allocation | str:
        """Re-check the fit of `demand` on `node` and reserve it (assumed): the allocation, or
        the reason it does not fit. The caller holds the bind lock."""
        entry = self.evaluator.entry(demand, node)
        if entry is None:
            return self.unknown_reason(node)
        fit, _, gpu = entry
        if not isinstance(fit, Fit):
            return f"does not fit node {node}: {fit.reason}"
        usage = self.ledger.node(node)
        alloc = allocate(usage, demand.request, fit, gpu, self.settings.budgets)
        try:
            self.ledger.assume(alloc)
        except LedgerError as exc:  # the fit said yes: a bug, but never over-allocate
            return f"does not fit node {node}: {exc}"
        self.evaluator.touch(node)
        return alloc

    def annotations(self, alloc: Allocation) -> dict[str, str]:
        """The annotations a bind of `alloc`, reserved in this state, writes on the pod (see
        `extender.packing.codec.allocation_annotations`); remembered until the watch shows the
        pod bound, so that its allocation is not decoded back."""
        out = allocation_annotations(alloc)
        self._written[alloc.pod_uid] = out[ALLOCATION_KEY]
        return out

    def release_reservation(self, alloc: Allocation) -> bool:
        """Give back `alloc` if it is still this very reservation and the cluster never showed
        it (a bind that definitely failed)."""
        if self.ledger.allocation(alloc.pod_uid) != alloc:
            return False
        if self.ledger.state(alloc.pod_uid) == "confirmed":
            return False
        self._written.pop(alloc.pod_uid, None)
        self.ledger.release(alloc.pod_uid)
        self.evaluator.touch(alloc.node)
        return True

    def carry_allocations(self, older: DecisionState) -> None:
        """Take over what `older` counts and this state has not seen yet — binds in flight or
        in doubt, and binds `older`'s watch confirmed before this state's watch delivered them
        — so that a swap to this state cannot give their GPUs out twice (rule 7). Pods this
        state saw end are not carried. They count as they are; this state's own watch confirms
        or ends them like any other."""
        for alloc in list(older.ledger.allocations()):
            uid = alloc.pod_uid
            if uid in self._ended or self.ledger.allocation(uid) is not None:
                continue
            self.ledger.record(alloc, state=older.ledger.state(uid) or "assumed")
            self.evaluator.touch(alloc.node)

    def unknown_reason(self, name: str) -> str:
        return self.excluded.get(name) or "node unknown to mpsched (no such node seen)"

    def pending(self, uid: str) -> PodRecord | None:
        """The record of a pending pod (one the watch shows unbound), or None."""
        record = self.pods.get(uid)
        return record if record is not None and record.node is None else None

    def may_be_on(self, uid: str, node: str) -> bool:
        record = self.pods.get(uid)
        return record is None or record.node == node

    # -- views ------------------------------------------------------------------------------

    def cpu_free(self, node: str) -> int:
        allocatable = self.cpu_allocatable.get(node)
        return UNKNOWN_CPU_FREE if allocatable is None else allocatable - self.cpu_used.get(node, 0)

    def gpu_limits(self) -> tuple[int | None, int | None]:
        """The largest GPU memory (MiB) and units per GPU in the ledger, for parse_pod."""
        if self._inventory_version != self._limits_version:
            self._limits_version = self._inventory_version
            memory = units = 0
            for name in self.ledger.node_names():
                for g in self.ledger.node(name).gpus:
                    memory = max(memory, g.info.memory_mib)
                    units = max(units, g.info.units)
            self._limits = (memory or None), (units or None)
        return self._limits

    def over_budget(self) -> Iterator[tuple[str, GpuUsage, str]]:
        return self.ledger.over_budget()

    def node_states(self) -> dict[str, NodeState]:
        ev = self.evaluator
        ev.refresh()
        return {n: s for n in self.ledger.node_names() if (s := ev.node_state(n)) is not None}

    # -- the learned workload ---------------------------------------------------------------

    def learn_workload(self) -> Learned | None:
        """The typical-pod workload of the pods now known and every shape among them (pure,
        may take a while: callers run it off the event loop), or None when no pod is known."""
        shapes = [r.shape for r in list(self.pods.values()) if r.shape is not None]
        typical = typical_workload(shapes, coverage=self.settings.policy.workload_coverage)
        return Learned(typical, all_shapes(shapes)) if typical else None

    def node_types(self) -> NodeTypes:
        """The cluster's GPU node types now (model, GPU count, allocatable CPU)."""
        ledger = self.ledger
        return node_types(
            (u.gpus[0].info.model, len(u.gpus), self.cpu_allocatable.get(name))
            for name in ledger.node_names()
            if (u := ledger.node(name)).gpus
        )

    def use_workload(self, learned: Learned | None) -> bool:
        """Score against `learned` (or the default) and the node types now, if either differs
        materially from the ones in force; whether it changed (the score caches are then
        empty)."""
        workload = learned.typical if learned else DEFAULT_WORKLOAD
        demand = learned.demand if learned else ()
        types = self.node_types()
        if not (
            materially_different(self.workload, workload)
            or materially_different(self.demand, demand)
            or types_materially_different(self.types, types)
        ):
            return False
        self.workload = workload
        self.demand = demand
        self.types = types
        self.frag = Fragmentation(workload, compiled=self.native)
        policy = self.settings.policy
        self.evaluator.set_policy(
            make_policy(policy.name, workload=workload, settings=policy, types=types, demand=demand)
        )
        return True

    # -- internals --------------------------------------------------------------------------

    def _pod_cpu(self, spec: Mapping[str, Any]) -> int:
        return pod_cpu_milli(spec, self._memo)
