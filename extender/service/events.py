"""Events about pods (and nodes), recorded in the background by one sender of their own.

Owns the event queue and its sender.

An Event is best effort; a Binding is what a pod waits for, and both go through the same
writes client to the same API server. An Event per bind sent from a task of its own, as
before, meant that an API server slow to answer held one connection of the writes client per
Event in flight: thousands of tasks at a few hundred binds a second, and Bindings waiting
behind them for a connection. kube-scheduler's own Events go through client-go's broadcaster,
which queues at most 1,000, drops what does not fit and sends them one at a time; the
extender's follow the same rules, so that Events use one connection at most and their backlog
is bounded.

Nothing here raises for a lost Event: `Cluster.record_event` never does by contract, and a
queue that is full drops the new Event and counts it (`dropped`, exported as
mpsched_events_dropped_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from extender.cluster import Cluster, ClusterError

log = logging.getLogger(__name__)

#: Events queued at most (client-go's broadcaster keeps 1,000): beyond, new ones are dropped.
QUEUE_CAPACITY: Final = 1000
#: Seconds `flush` (at shutdown) may spend sending what is still queued.
FLUSH_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One core/v1 Event about a pod, as `Cluster.record_event` takes it."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One core/v1 Event about a Node (a refused GPU inventory), for a cluster that records
    them (`RecordsNodeEvents`); dropped, as Events are, by one that does not."""

    node: str
    reason: str
    message: str
    warning: bool = False


@runtime_checkable
class RecordsNodeEvents(Protocol):
    """A cluster that records Events about Nodes (the Kubernetes adapter, the embedded one)."""

    async def record_node_event(
        self, *, node: str, reason: str, message: str, warning: bool = False, component: str
    ) -> None: ...


#: The Events' source component for the extender's node Events.
COMPONENT: Final = "mpsched"


class EventSink:
    """The queue of Events to record and its sender (`run`, one task for the service's life)."""

    def __init__(self, cluster: Cluster, *, capacity: int = QUEUE_CAPACITY) -> None:
        self._cluster = cluster
        self._capacity = capacity
        #: Oldest first.
        self._queue: deque[PodEvent | NodeEvent] = deque()
        self._wake = asyncio.Event()
        #: Events dropped because the queue was full, and Events handed to the cluster.
        self.dropped = 0
        self.sent = 0

    def __len__(self) -> int:
        """Events queued."""
        return len(self._queue)

    def record(self, event: PodEvent | NodeEvent) -> None:
        """Queue `event`; dropped (and counted) when the queue is full."""
        if len(self._queue) >= self._capacity:
            self.dropped += 1
            if self.dropped == 1 or not self.dropped % self._capacity:
                log.warning(
                    "%d Event(s) dropped so far: %d queued, the API server does not take "
                    "them as fast as they come (latest: %s for %s)",
                    self.dropped,
                    len(self._queue),
                    event.reason,
                    _about(event),
                )
            return
        self._queue.append(event)
        self._wake.set()

    async def run(self) -> None:
        """Send queued Events one at a time, oldest first; until cancelled."""
        queue = self._queue
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._send(queue.popleft())

    async def flush(self, timeout_s: float = FLUSH_S) -> None:
        """Send what is still queued (at shutdown, once the sender is stopped); what is left
        after `timeout_s` is lost, as Events are."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._queue:
                    await self._send(self._queue.popleft())
        except TimeoutError:
            log.warning("%d Event(s) not recorded at shutdown", len(self._queue))

    async def _send(self, event: PodEvent | NodeEvent) -> None:
        self.sent += 1
        cluster = self._cluster
        try:
            with contextlib.suppress(ClusterError):  # an Event is best effort
                if isinstance(event, PodEvent):
                    await cluster.record_event(
                        namespace=event.namespace,
                        name=event.name,
                        uid=event.uid,
                        reason=event.reason,
                        message=event.message,
                        warning=event.warning,
                    )
                elif isinstance(cluster, RecordsNodeEvents):
                    await cluster.record_node_event(
                        node=event.node,
                        reason=event.reason,
                        message=event.message,
                        warning=event.warning,
                        component=COMPONENT,
                    )
        except Exception:
            # The sender outlives any one Event: a bug here must not silence every later one.
            log.exception("recording Event %s for %s failed", event.reason, _about(event))


def _about(event: PodEvent | NodeEvent) -> str:
    if isinstance(event, NodeEvent):
        return f"node {event.node}"
    return f"{event.namespace}/{event.name}"
