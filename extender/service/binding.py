"""Bind (docs/design.md: the life of a GPU pod, truth rules 4 and 5): decide the allocation from the
pod as the API server knows it, re-check the fit under the bind lock in the state in force, reserve,
create the Binding with the allocation annotations, and settle the reservation by what the API says.

Owns the bind protocol's edge cases, each decided from data, never from an error's text:

- the pod's request comes from the watch (the decision state's record of the pending pod) or,
  when the watch has not shown it, from a read of the pod — never from a /filter body;
- a 409 is classified by reading the pod back: bound to this node with this very allocation is
  a success (kube-scheduler retries after a lost answer); another UID is `uid_mismatch`. A 409
  whose Status says the pod is already assigned to the node this bind chose is a success even
  when the pod cannot be read (`assigned_node`): the bind happened, and its reservation stays;
- no answer (timeout, connection lost, API down) leaves the bind *in doubt*: the reservation
  stays counted, the scheduler is told Error, and a resolver reads the pod back until the API
  answers, then confirms or releases it;
- a definite refusal releases the reservation if it is still the one this call made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from extender.cluster import (
    Cluster,
    ClusterError,
    Conflict,
    NotFound,
    TooManyRequests,
    Unavailable,
)
from extender.packing.codec import ALLOCATION_KEY, allocation_annotations, encode_allocation
from extender.packing.ledger import Allocation
from extender.packing.parsing import ParsedPod
from extender.packing.results import Demand
from extender.packing.state import DecisionState
from extender.service.errors import BindError, BindReason
from extender.service.events import EventSink, PodEvent

log = logging.getLogger(__name__)

#: Seconds between read-backs of an in-doubt bind, at first and at most: the reservation is
#: settled within this long of the API answering again.
RESOLVE_FIRST_S: Final = 0.5
RESOLVE_MAX_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class _Seen:
    """A pod as read back from the API: where it is bound and with which annotation."""

    uid: str
    node: str | None
    text: str | None


def _may_have_happened(exc: ClusterError) -> bool:
    """Whether a failed Binding may still have been applied: no answer, or an answer that does
    not say it was refused (a 429 is a refusal before any work)."""
    return isinstance(exc, Unavailable) and not isinstance(exc, TooManyRequests)


#: The end of the message of the API server's 409 for a Binding of a pod that has a node
#: (assignPod: `pod %v is already assigned to node %q`); the node is group 2.
_ASSIGNED = re.compile(r'pod (\S+) is already assigned to node "([^"\\]+)"\Z')


def assigned_node(exc: ClusterError, name: str) -> str | None:
    """The node a 409 to a Binding of pod `name` says the pod is already assigned to, or None
    for any other answer.

    The Status is read as data first: a Conflict (reason and code) about `pods/binding` of this
    very pod (details.kind and details.name). The node itself is only in the message: the API
    server builds this Conflict from `fmt.Errorf("pod %v is already assigned to node %q")` and
    puts nothing else in `details`. So the message is read narrowly, only its end, only for
    that Status, and only where the quoted node has no escape in it (node names are DNS
    subdomains, so Go's %q writes them as they are)."""
    details = exc.details
    if not (
        isinstance(exc, Conflict)
        and exc.code == 409
        and exc.reason == "Conflict"
        and details.kind == "pods/binding"
        and details.name == name
    ):
        return None
    found = _ASSIGNED.search(exc.message)
    return None if found is None or found.group(1) != name else found.group(2)


def _seen(pod: Mapping[str, Any]) -> _Seen:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    annotations = meta.get("annotations")
    text = annotations.get(ALLOCATION_KEY) if isinstance(annotations, Mapping) else None
    node = spec.get("nodeName")
    uid = meta.get("uid")
    return _Seen(
        uid if isinstance(uid, str) else "",
        node if isinstance(node, str) and node else None,
        text if isinstance(text, str) else None,
    )


class Decisions(Protocol):
    """Where the decision state in force is found, and the lock its swaps run under."""

    @property
    def state(self) -> DecisionState: ...
    @property
    def lock(self) -> asyncio.Lock: ...


class Binder:
    """Binds pods. Every check-and-reserve runs under the decisions' lock, in the state in
    force at that moment; the API call runs outside the lock, so binds proceed concurrently."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        decisions: Decisions,
        deadline_s: float = 8.0,
        doubt_window_s: float = 25.0,
        events: EventSink | None = None,
    ) -> None:
        self._cluster = cluster
        #: Where a GpuShareAllocated Event per fresh allocation goes; None records none (config
        #: `api.allocationEvents`).
        self._events = events
        #: Seconds after an unanswered Binding during which a pod still unbound may yet be
        #: bound by it (config `api.inDoubtSeconds`).
        self._doubt_window_s = doubt_window_s
        self._decisions = decisions
        #: Seconds one bind may take, API calls included (config `api.bindTimeoutSeconds`).
        self._deadline_s = deadline_s
        #: uids whose bind is in doubt, with the resolver's task running.
        self.in_doubt: set[str] = set()
        #: Resolvers in flight (the service cancels them on close).
        self.tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def bind(self, *, name: str, namespace: str, uid: str, node: str) -> Allocation | None:
        """Bind the pod; its allocation (None for a pod that asks for no GPU). Raises
        BindError; a definitely failed bind releases its reservation. Bounded: every API call
        runs inside the bind's deadline, past which the outcome is decided as for no answer."""
        deadline = asyncio.get_running_loop().time() + self._deadline_s
        try:
            async with asyncio.timeout_at(deadline):
                demand = await self._demand(namespace=namespace, name=name, uid=uid)
        except TimeoutError:
            raise BindError(
                "cluster_error", f"cannot read pod {namespace}/{name}: no answer in time"
            ) from None
        async with self._decisions.lock:
            state = self._decisions.state
            held = state.ledger.allocation(uid)
            fresh = False
            alloc: Allocation | None
            if held is not None:
                if held.node != node:
                    raise BindError(
                        "conflict",
                        f"pod {namespace}/{name} already holds GPUs on node {held.node!r}",
                    )
                alloc = held
            elif demand.request.kind == "none":
                alloc = None
            else:
                reserved = state.reserve(demand, node)
                if isinstance(reserved, str):
                    raise BindError(
                        "unknown_node" if state.ledger.get_node(node) is None else "no_fit",
                        reserved,
                    )
                alloc, fresh = reserved, True
        annotations: dict[str, str] = {}
        if alloc is not None:
            # A fresh reservation's state remembers the text, so that the watch's first sight
            # of the bound pod need not decode it back.
            annotations = state.annotations(alloc) if fresh else allocation_annotations(alloc)
        try:
            async with asyncio.timeout_at(deadline):
                await self._cluster.bind(
                    namespace=namespace, name=name, uid=uid, node=node, annotations=annotations
                )
        except (ClusterError, TimeoutError) as exc:
            failure = exc if isinstance(exc, ClusterError) else Unavailable("no answer in time")
            await self._failed(
                failure,
                namespace=namespace,
                name=name,
                uid=uid,
                node=node,
                alloc=alloc,
                fresh=fresh,
                deadline=deadline,
            )
        if alloc is not None and fresh and self._events is not None:
            self._events.record(allocated_event(alloc))
        return alloc

    async def _failed(
        self,
        exc: ClusterError,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        alloc: Allocation | None,
        fresh: bool,
        deadline: float,
    ) -> None:
        """Settle a Binding the API refused or did not answer; returns only if it happened."""
        doubtful = _may_have_happened(exc)
        if doubtful or isinstance(exc, Conflict):
            # Either it may have been applied (no answer) or the pod changed under us (409):
            # the pod itself says which.
            pod: Mapping[str, Any] | None = None
            with contextlib.suppress(ClusterError, TimeoutError):
                # A moment to read back even when the Binding used up the deadline.
                async with asyncio.timeout_at(max(deadline, asyncio.get_running_loop().time() + 1)):
                    pod = await self._cluster.get_pod(namespace, name)
            seen = _seen(pod) if pod is not None else None
            if (
                seen is not None
                and seen.uid == uid
                and seen.node == node
                and self._carries(seen, alloc)
            ):
                return
            if seen is not None and seen.uid and seen.uid != uid:
                if alloc is not None and fresh:
                    self._release(alloc)
                raise BindError(
                    "uid_mismatch", f"pod {namespace}/{name} has uid {seen.uid}, not {uid}"
                ) from exc
            if assigned_node(exc, name) == node:
                # The pod is bound to the node this bind chose: by this Binding (its first
                # answer lost) or by an earlier one. It runs there: the reservation stays, and
                # the watch confirms it (or reads the allocation the pod carries).
                log.info(
                    "bind of %s/%s to %s: the API server says it is bound there already",
                    namespace,
                    name,
                    node,
                    extra={
                        "pod": f"{namespace}/{name}",
                        "node": node,
                        "verb": "bind",
                        "outcome": "already_bound",
                    },
                )
                return
            if doubtful and (seen is None or seen.node is None):
                # Unbound *now* does not mean it will not be: a request the API server has
                # not finished may still be applied. Hold the reservation until it says.
                if alloc is not None and fresh:
                    self._hold_in_doubt(alloc, namespace=namespace, name=name)
                raise BindError(
                    "in_doubt",
                    f"binding {namespace}/{name} to {node}: no answer from the API server "
                    f"({exc.message}); the reservation is held until the API says",
                ) from exc
        if alloc is not None and fresh:
            self._release(alloc)
        reason: BindReason = "cluster_error"
        if isinstance(exc, NotFound):
            reason = "not_found"
        elif isinstance(exc, Conflict):
            reason = "conflict"
        raise BindError(reason, f"binding failed: {exc.message}") from exc

    @staticmethod
    def _carries(seen: _Seen, alloc: Allocation | None) -> bool:
        if alloc is None:
            return seen.text is None
        return seen.text == encode_allocation(alloc)

    async def _demand(self, *, namespace: str, name: str, uid: str) -> Demand:
        """The pod's request as the API server has it: the watch's record of the pending pod,
        else a read (never a request body: truth rule 4 of docs/design.md)."""
        record = self._decisions.state.pending(uid)
        parsed: ParsedPod | None = None
        if record is not None and (record.namespace, record.name) == (namespace, name):
            parsed = record.parsed
        if parsed is None:
            try:
                pod = await self._cluster.get_pod(namespace, name)
            except ClusterError as exc:
                raise BindError("cluster_error", f"cannot read pod: {exc.message}") from exc
            if pod is None:
                raise BindError("not_found", f'pods "{name}" not found')
            parsed = self._decisions.state.parser.parse(pod)
            if parsed.uid != uid:
                raise BindError(
                    "uid_mismatch", f"pod {namespace}/{name} has uid {parsed.uid}, not {uid}"
                )
        if parsed.demand is None:
            raise BindError("invalid_request", parsed.error or "invalid request")
        return parsed.demand

    def _release(self, alloc: Allocation) -> None:
        self._decisions.state.release_reservation(alloc)

    # -- in-doubt binds ---------------------------------------------------------------------

    def _hold_in_doubt(self, alloc: Allocation, *, namespace: str, name: str) -> None:
        self._decisions.state.ledger.doubt(alloc.pod_uid)
        if alloc.pod_uid not in self.in_doubt:
            self.in_doubt.add(alloc.pod_uid)
            self._spawn(self._resolve(alloc, namespace=namespace, name=name))
        log.warning(
            "bind of %s/%s to %s is in doubt (no answer); holding its reservation",
            namespace,
            name,
            alloc.node,
            extra={
                "pod": f"{namespace}/{name}",
                "node": alloc.node,
                "verb": "bind",
                "outcome": "in_doubt",
            },
        )

    async def _resolve(self, alloc: Allocation, *, namespace: str, name: str) -> None:
        """Read the pod back until the API says what became of the Binding: bound with this
        allocation (confirm), bound elsewhere or gone (release), or still unbound once no
        request can still be pending at the API server (release)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._doubt_window_s
        delay = RESOLVE_FIRST_S
        try:
            while True:
                state = self._decisions.state
                if state.ledger.state(alloc.pod_uid) in (None, "confirmed"):
                    return  # the watch settled it meanwhile
                try:
                    pod = await self._cluster.get_pod(namespace, name)
                except ClusterError:
                    pod, answered = None, False
                else:
                    answered = True
                seen = _seen(pod) if pod is not None else None
                applied = (
                    seen is not None
                    and seen.uid == alloc.pod_uid
                    and seen.node == alloc.node
                    and self._carries(seen, alloc)
                )
                pending = answered and seen is not None and seen.uid == alloc.pod_uid
                pending = pending and seen is not None and seen.node is None
                if answered and (applied or not pending or loop.time() > give_up):
                    async with self._decisions.lock:
                        state = self._decisions.state
                        if applied and state.ledger.allocation(alloc.pod_uid) == alloc:
                            state.ledger.confirm(alloc.pod_uid)
                        elif not applied:
                            state.release_reservation(alloc)
                    outcome = "applied" if applied else "not applied"
                    log.info(
                        "in-doubt bind of %s to %s: %s",
                        alloc.key,
                        alloc.node,
                        outcome,
                        extra={
                            "pod": alloc.key,
                            "node": alloc.node,
                            "verb": "bind",
                            "outcome": "applied" if applied else "not_applied",
                        },
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(RESOLVE_MAX_S, delay * 2)
        finally:
            self.in_doubt.discard(alloc.pod_uid)


def allocated_event(alloc: Allocation) -> PodEvent:
    """The GpuShareAllocated Event of a fresh allocation: which GPUs, and what of them."""
    gpus = ",".join(f"{g.index}" for g in alloc.gpus)
    if alloc.kind == "whole":
        message = f"GPUs {gpus} on {alloc.node}, whole"
    else:
        message = (
            f"GPU {gpus} on {alloc.node}: {alloc.threads}% threads, "
            f"{alloc.memory_mib} MiB pinned, {alloc.clients} MPS clients"
        )
    return PodEvent(alloc.namespace, alloc.name, alloc.pod_uid, "GpuShareAllocated", message)
