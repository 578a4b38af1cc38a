"""`StatusFeed`: the ledger's nodes for the `/ui` page, whole once and then as changes, so that
a browser showing 5,000 nodes stays live without fetching the whole `/status` document again.

Owns the change journal. A page first reads every node (`stream_nodes`, built a few nodes at a
time like `/status`) with a token, then asks for what changed since that token (`changes`),
about twice a second. The journal is brought up to date only when a page asks (`sync`): no page
open, no work. It learns which nodes changed from the evaluator's touch log (every change the
decision state makes to a node touches it); when that log no longer reaches back to the last
sync, it compares every node's ledger generation instead (one pass over the nodes; a change
that leaves a node's usage as it was, a bind confirmed, then shows with that node's next
change). A new decision state (reconfiguration), a token from another process or one older than the
journal answers `reset`: the page reads every node again.

A node's document is `/status`'s (`node_document`) plus its fragmentation, in percent of its
GPUs' capacity, as the `summary` of `/status` counts it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import AsyncIterator, Iterable, Set
from typing import Any, Final

import orjson

from extender.packing.ledger import Allocation
from extender.packing.state import DecisionState
from extender.service.status import STATUS_BATCH, node_document

#: Journal entries kept: a page that fell further behind reads every node again.
JOURNAL: Final = 65536


def ui_node(state: DecisionState, name: str) -> dict[str, Any] | None:
    """One node's document for the page (module docstring); None for a node the ledger does not
    hold (any more)."""
    usage = state.ledger.get_node(name)
    if usage is None:
        return None
    doc = node_document(name, usage, state.ledger)
    node_state = state.evaluator.node_state(name)
    gpus = len(usage.gpus)
    frag = state.frag(node_state) / gpus if node_state is not None and gpus else 0.0
    doc["fragmentationPct"] = round(frag, 3)
    return doc


class StatusFeed:
    """The change journal behind the page's live view (module docstring). One per application;
    every page shares it."""

    def __init__(self, *, journal: int = JOURNAL) -> None:
        #: Tells this process's tokens from another's (a restarted extender's).
        self._boot = secrets.token_hex(4)
        self._state: DecisionState | None = None
        self._epoch = 0
        #: Ledger generation of every node at the last sync.
        self._generations: dict[str, int] = {}
        self._seq = 0
        #: Tokens below this number are of an older decision state: reset.
        self._floor = 0
        self._journal: deque[tuple[int, str]] = deque(maxlen=journal)

    def token(self) -> str:
        return f"{self._boot}.{self._seq}"

    def _since(self, token: str) -> int | None:
        boot, _, seq = token.partition(".")
        if boot != self._boot or not seq.isdigit():
            return None
        since = int(seq)
        journal = self._journal
        if since < self._floor or since > self._seq:
            return None
        if journal and since < journal[0][0] - 1:
            return None  # the entries right after `since` were pushed out
        return since

    def sync(self, state: DecisionState) -> None:
        """Bring the journal up to date with `state`."""
        ev = state.evaluator
        ledger = state.ledger
        if state is not self._state:
            self._state = state
            self._floor = self._seq = self._seq + 1
            self._journal.clear()
            self._epoch = ev.epoch
            self._generations = {n: ledger.node(n).generation for n in ledger.node_names()}
            return
        touched: Iterable[str] | None = ev.touched_since(self._epoch)
        self._epoch = ev.epoch
        generations = self._generations
        if touched is None:
            touched = self._changed_generations(state)
        for name in touched:
            usage = ledger.get_node(name)
            if usage is None:
                generations.pop(name, None)
            else:
                generations[name] = usage.generation
            self._seq += 1
            self._journal.append((self._seq, name))

    def _changed_generations(self, state: DecisionState) -> Set[str]:
        ledger = state.ledger
        generations = self._generations
        changed = {
            name
            for name in ledger.node_names()
            if generations.get(name) != ledger.node(name).generation
        }
        changed.update(name for name in generations if ledger.get_node(name) is None)
        return changed

    def changed_since(self, token: str) -> list[str] | None:
        """Nodes changed since `token` (None: reset), after `sync`."""
        since = self._since(token)
        if since is None:
            return None
        names: dict[str, None] = {}
        for seq, name in reversed(self._journal):
            if seq <= since:
                break
            names[name] = None
        return sorted(names)

    async def changes(
        self, state: DecisionState, token: str, *, in_doubt: Set[str], batch: int = STATUS_BATCH
    ) -> dict[str, Any]:
        """What changed since `token`: `{"token", "reset", "nodes": [doc], "removed": [name],
        "inDoubt": [uid]}`; with `reset` true, nodes and removed are empty and the page reads
        every node again."""
        self.sync(state)
        token_now = self.token()
        names = self.changed_since(token)
        out: dict[str, Any] = {"token": token_now, "reset": names is None, "nodes": []}
        out["removed"] = []
        out["inDoubt"] = sorted(in_doubt)
        for i, name in enumerate(names or ()):
            if i and not i % batch:
                await asyncio.sleep(0)
            state.evaluator.refresh()
            doc = ui_node(state, name)
            if doc is None:
                out["removed"].append(name)
            else:
                out["nodes"].append(doc)
        return out


async def stream_nodes(
    state: DecisionState,
    feed: StatusFeed,
    *,
    config: dict[str, Any],
    limit: int | None = None,
    batch: int = STATUS_BATCH,
) -> AsyncIterator[bytes]:
    """Every node's document (the first `limit` by name, when given) as `{"token": str,
    "total": int, "config": {...}, "nodes": [...]}`, in pieces, yielding to the loop every
    `batch` nodes. Changes made while it is written come again in the changes after its
    token."""
    feed.sync(state)
    names = sorted(state.ledger.node_names())
    head = {"token": feed.token(), "total": len(names), "config": config}
    yield orjson.dumps(head)[:-1] + b',"nodes":['
    names = names[:limit]
    first = True
    for i in range(0, len(names), batch):
        state.evaluator.refresh()
        docs = [d for d in (ui_node(state, n) for n in names[i : i + batch]) if d is not None]
        if docs:
            piece = b",".join(map(orjson.dumps, docs))
            yield piece if first else b"," + piece
            first = False
        await asyncio.sleep(0)
    yield b"]}"


def pod_document(state: DecisionState, uid: str) -> dict[str, Any] | None:
    """A pod's allocation as the ledger holds it, with its containers' parts (the limits the
    webhook sets in each container: thread percentage, pinned memory, clients); None when the
    ledger holds none for `uid`."""
    alloc = state.ledger.allocation(uid)
    if alloc is None:
        return None
    return allocation_document(alloc, state.ledger.state(uid) or "assumed")


def allocation_document(alloc: Allocation, state: str) -> dict[str, Any]:
    return {
        "namespace": alloc.namespace,
        "name": alloc.name,
        "uid": alloc.pod_uid,
        "node": alloc.node,
        "kind": alloc.kind,
        "state": state,
        "gpus": [{"index": g.index, "uuid": g.uuid} for g in alloc.gpus],
        "threads": alloc.threads,
        "memoryMiB": alloc.memory_mib,
        "clients": alloc.clients,
        "runAsUser": alloc.run_as_user,
        "priority": alloc.priority,
        "containers": [
            {"name": c.name, "threads": c.threads, "memoryMiB": c.memory_mib, "clients": c.clients}
            for c in alloc.containers
        ],
    }
