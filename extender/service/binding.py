"""Bind (DESIGN §5 step 3): re-check the fit under the ledger's lock, reserve, create the
Binding with the allocation annotations, and give the reservation back if the API refuses.

Owns the bind protocol's edge cases: a retry for a pod already bound to that node with the same
allocation is a success (kube-scheduler retries after a lost answer); a pod already holding GPUs
elsewhere is refused; the reservation of a failed bind is released only if it is still the one
this call made and still merely assumed (the watch may have confirmed it meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from extender.cluster import Cluster, ClusterError, Conflict, NotFound, Unavailable
from extender.packing.codec import ALLOCATION_KEY, allocation_annotations, encode_allocation
from extender.packing.errors import LedgerError
from extender.packing.evaluate import Evaluator
from extender.packing.fit import Fit, allocate
from extender.packing.ledger import Allocation, Ledger
from extender.packing.parsing import ParsedPod, PodParser
from extender.packing.settings import BudgetSettings
from extender.service.errors import BindError, BindReason

log = logging.getLogger(__name__)


class Binder:
    """Binds pods for one ledger. Every check-and-assume runs under `lock`; the API call runs
    outside it, so binds to the API server proceed concurrently."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        ledger: Ledger,
        evaluator: Evaluator,
        parser: PodParser,
        budgets: BudgetSettings,
        lock: asyncio.Lock,
        unknown_reason: Callable[[str], str],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.evaluator = evaluator
        self.parser = parser
        self.budgets = budgets
        self.lock = lock
        self._unknown_reason = unknown_reason
        self._spawn = spawn

    async def bind(self, *, name: str, namespace: str, uid: str, node: str) -> Allocation | None:
        """Re-check the fit under the lock, reserve, and create the Binding with the allocation
        annotations. Returns the allocation (None for a pod that asks for no GPU). A pod already
        bound to `node` with the same allocation is a success. Raises BindError; a failed bind
        releases its reservation."""
        parsed = await self._parsed_for_bind(namespace=namespace, name=name, uid=uid)
        if parsed.demand is None:
            raise BindError("invalid_request", parsed.error or "invalid request")
        request = parsed.demand.request
        async with self.lock:
            held = self.ledger.allocation(uid)
            fresh = False
            alloc: Allocation | None
            if held is not None:
                if held.node != node:
                    raise BindError(
                        "conflict",
                        f"pod {namespace}/{name} already holds GPUs on node {held.node!r}",
                    )
                alloc = held
            elif request.kind == "none":
                alloc = None
            else:
                alloc = self._reserve(parsed, node)
                fresh = True
        annotations = allocation_annotations(alloc) if alloc is not None else {}
        try:
            await self.cluster.bind(
                namespace=namespace, name=name, uid=uid, node=node, annotations=annotations
            )
        except ClusterError as exc:
            if await self._already_bound(exc, namespace, name, node, alloc):
                return alloc
            if fresh and alloc is not None:
                self._release_assumed(alloc)
            raise BindError(_bind_reason(exc), f"binding failed: {exc.message}") from exc
        if alloc is not None and fresh:
            self._spawn(self._record_allocated(alloc))
        return alloc

    async def _parsed_for_bind(self, *, namespace: str, name: str, uid: str) -> ParsedPod:
        parsed = self.parser.latest(uid)
        if parsed is not None and (parsed.namespace, parsed.name) == (namespace, name):
            return parsed
        # Not seen by filter (a restart in between): read the pod from the cluster.
        try:
            pod = await self.cluster.get_pod(namespace, name)
        except ClusterError as exc:
            raise BindError("cluster_error", f"cannot read pod: {exc.message}") from exc
        if pod is None:
            raise BindError("not_found", f'pods "{name}" not found')
        parsed = self.parser.parse(pod)
        if parsed.uid != uid:
            raise BindError(
                "uid_mismatch", f"pod {namespace}/{name} has uid {parsed.uid}, not {uid}"
            )
        return parsed

    def _reserve(self, parsed: ParsedPod, node: str) -> Allocation:
        assert parsed.demand is not None
        entry = self.evaluator.entry(parsed.demand, node)
        if entry is None:
            raise BindError("unknown_node", self._unknown_reason(node))
        fit, _, gpu = entry
        if not isinstance(fit, Fit):
            raise BindError("no_fit", f"does not fit node {node}: {fit.reason}")
        usage = self.ledger.node(node)
        alloc = allocate(usage, parsed.demand.request, fit, gpu, self.budgets)
        try:
            self.ledger.assume(alloc)
        except LedgerError as exc:  # the fit said yes: a bug, but never over-allocate
            log.error("ledger refused a fitting allocation for %s: %s", alloc.key, exc)
            raise BindError("no_fit", f"does not fit node {node}: {exc}") from exc
        self.evaluator.touch(node)
        return alloc

    def _release_assumed(self, alloc: Allocation) -> None:
        if self.ledger.allocation(alloc.pod_uid) == alloc and (
            self.ledger.state(alloc.pod_uid) == "assumed"
        ):
            self.ledger.release(alloc.pod_uid)
            self.evaluator.touch(alloc.node)

    async def _already_bound(
        self, exc: ClusterError, namespace: str, name: str, node: str, alloc: Allocation | None
    ) -> bool:
        """The pod is on `node` already, carrying this very allocation: a retried bind (a 409,
        classified by reading the pod back, not by the answer's text), or a bind whose answer
        was lost (no answer: it may have been applied, and releasing its reservation then would
        let the GPU be given out twice)."""
        if not isinstance(exc, Conflict | Unavailable):
            return False
        try:
            pod = await self.cluster.get_pod(namespace, name)
        except ClusterError:
            return False
        meta = pod.get("metadata") if pod is not None else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        text = annotations.get(ALLOCATION_KEY) if isinstance(annotations, Mapping) else None
        spec = pod.get("spec") if pod is not None else None
        if not isinstance(spec, Mapping) or spec.get("nodeName") != node:
            return False
        if alloc is None:
            return text is None
        return text == encode_allocation(alloc)

    async def _record_allocated(self, alloc: Allocation) -> None:
        gpus = ",".join(f"{g.index}" for g in alloc.gpus)
        if alloc.kind == "whole":
            message = f"GPUs {gpus} on {alloc.node}, whole"
        else:
            message = (
                f"GPU {gpus} on {alloc.node}: {alloc.threads}% threads, "
                f"{alloc.memory_mib} MiB pinned, {alloc.clients} MPS clients"
            )
        with contextlib.suppress(ClusterError):
            await self.cluster.record_event(
                namespace=alloc.namespace,
                name=alloc.name,
                uid=alloc.pod_uid,
                reason="GpuShareAllocated",
                message=message,
            )


def _bind_reason(exc: ClusterError) -> BindReason:
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, Conflict):
        return "uid_mismatch" if "Precondition failed: UID" in exc.message else "conflict"
    return "cluster_error"
