"""Following the cluster without losing an event (client-go's ListAndWatch): list every Node,
then every Pod, hand them on as ADDED, say `Synced`, then watch each kind from its list's
resourceVersion; resume from the last resourceVersion after a broken connection, and after
410 Gone relist and turn the difference into ordinary events (the informer's "replace"), so the
service needs only one code path.

Owns the stream's guarantees: nothing raises into the consumer (an unreachable API server is
retried behind the stream with capped backoff, and counted in `restarts`), and an event is
handed on only for a well-formed object (a mapping with `metadata.name`, and a `metadata.uid`
for a Pod: what the service keys on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp
import orjson

from extender.cluster import (
    ClusterError,
    ClusterEvent,
    EventType,
    FollowItem,
    Gone,
    JsonObject,
    ObjectKind,
    Synced,
    error_from_status,
)

log = logging.getLogger(__name__)

#: Longest pause between attempts to reach an API server that does not answer.
MAX_RETRY_DELAY_S: Final = 30.0
#: What a broken watch or list may raise on the way: retried, never handed to the consumer.
_TRANSIENT: Final = (ClusterError, aiohttp.ClientError, OSError, TimeoutError, ValueError)


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JsonObject]
    resource_version: str


class WatchSource(Protocol):
    async def list_kind(self, kind: ObjectKind) -> ListResult:
        """Every object of `kind` (paged), with the list's resourceVersion. Raises
        ClusterError."""
        ...

    async def open_watch(self, kind: ObjectKind, resource_version: str) -> Any:
        """One watch request: the raw streaming response, answered 200. Raises ClusterError
        (Gone when `resource_version` is too old)."""
        ...


def _key(kind: ObjectKind, obj: object) -> str | None:
    """The object's identity, or None when it is not well-formed enough to hand on."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    # Pods by UID: a pod recreated under the same name is another pod.
    key = meta.get("name") if kind == "Node" else meta.get("uid")
    return key if isinstance(key, str) and key else None


def _version(obj: Mapping[str, Any]) -> str:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _stub(obj: Mapping[str, Any]) -> JsonObject:
    # Enough of an object to identify it when it is found deleted, and to see whether it
    # changed: keeps 60,000 pods' bodies out of memory.
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion")
    return {"metadata": {k: meta[k] for k in keep if k in meta}}


@dataclass(slots=True)
class _Kind:
    """What the stream knows of one kind: the resourceVersion to resume from, and every object
    it has handed on and not seen deleted (for the difference after a relist)."""

    kind: ObjectKind
    version: str = ""
    known: dict[str, JsonObject] = field(default_factory=dict)


class FollowStream:
    """One follower of both kinds (see the module docstring). Starts at once; `close()` ends
    it. Iterating again continues where the last iteration stopped."""

    def __init__(self, source: WatchSource, *, retry_delay_s: float = 1.0) -> None:
        self._source = source
        self._retry_delay_s = retry_delay_s
        self._queue: asyncio.Queue[FollowItem | None] = asyncio.Queue()
        self._closed = False
        #: Watch reconnects after a failure, relists after 410, and failed lists retried.
        self.restarts = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    def __aiter__(self) -> FollowStream:
        return self

    async def __anext__(self) -> FollowItem:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # the end stays the end for the next iteration
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._task.cancel()
            self._queue.put_nowait(None)

    # -- the work behind the stream -------------------------------------------------------------

    async def _run(self) -> None:
        kinds = [_Kind("Node"), _Kind("Pod")]
        for state in kinds:
            result = await self._list_until_done(state.kind)
            state.version = result.resource_version
            for obj in result.items:
                self._emit(state, "ADDED", obj)
        self._queue.put_nowait(Synced())
        async with asyncio.TaskGroup() as group:
            for state in kinds:
                group.create_task(self._watch_forever(state))

    async def _list_until_done(self, kind: ObjectKind) -> ListResult:
        delay = self._retry_delay_s
        while True:
            try:
                return await self._source.list_kind(kind)
            except _TRANSIENT as exc:
                log.warning("%s list failed (%s); retrying in %.1fs", kind, exc, delay)
            except Exception:  # as in _watch_forever: the stream outlives a bug
                log.exception("%s list failed; retrying in %.1fs", kind, delay)
            self.restarts += 1
            await asyncio.sleep(delay)
            delay = min(MAX_RETRY_DELAY_S, delay * 2)

    async def _watch_forever(self, state: _Kind) -> None:
        delay = self._retry_delay_s
        while True:
            try:
                await self._watch_once(state)
                delay = self._retry_delay_s
                continue  # the server ended the request after its timeout: resume
            except Gone:
                log.info(
                    "%s watch: resourceVersion %s expired, relisting", state.kind, state.version
                )
                self.restarts += 1
                await self._relist(state)
                continue
            except _TRANSIENT as exc:
                log.warning("%s watch broke (%s); resuming in %.1fs", state.kind, exc, delay)
            except Exception:  # a bug must not end the stream: the service would go stale
                log.exception("%s watch failed; resuming in %.1fs", state.kind, delay)
            self.restarts += 1
            await asyncio.sleep(delay)
            delay = min(MAX_RETRY_DELAY_S, delay * 2)

    async def _watch_once(self, state: _Kind) -> None:
        """One watch request, from the last resourceVersion seen, until the server ends it. The
        version advances with every event handed on, so a stream that breaks midway resumes
        after the last one: nothing lost, nothing repeated."""
        response = await self._source.open_watch(state.kind, state.version)
        what = f"watch {state.kind}s"
        try:
            async for line in _lines(response.content):
                event = orjson.loads(line)
                if not isinstance(event, Mapping):
                    continue
                type_, obj = event.get("type"), event.get("object")
                if not isinstance(obj, Mapping):
                    continue
                if type_ == "ERROR":
                    code = obj.get("code")
                    raise error_from_status(code if isinstance(code, int) else 0, obj, what=what)
                if type_ in ("ADDED", "MODIFIED", "DELETED"):
                    self._emit(state, type_, obj)
                # BOOKMARK events carry only a resourceVersion: resume from there.
                if rv := _version(obj):
                    state.version = rv
        finally:
            response.release()

    async def _relist(self, state: _Kind) -> None:
        result = await self._list_until_done(state.kind)
        current = {k: o for o in result.items if (k := _key(state.kind, o)) is not None}
        for key in list(state.known):
            if key not in current:
                self._emit(state, "DELETED", state.known[key])
        for key, obj in current.items():
            known = state.known.get(key)
            if known is None:
                self._emit(state, "ADDED", obj)
            elif _version(known) != _version(obj):
                self._emit(state, "MODIFIED", obj)
        state.version = result.resource_version

    def _emit(self, state: _Kind, type_: EventType, obj: Mapping[str, Any]) -> None:
        key = _key(state.kind, obj)
        if key is None:
            log.warning("%s %s event for a malformed object ignored", state.kind, type_)
            return
        if type_ == "DELETED":
            state.known.pop(key, None)
        else:
            state.known[key] = _stub(obj)
        self._queue.put_nowait(ClusterEvent(type_, state.kind, obj))

    async def wait_closed(self) -> None:
        """Return once the work behind a closed stream has stopped."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _lines(content: Any) -> AsyncIterator[bytes]:
    """Newline-separated JSON events of any length (aiohttp's readline caps lines at 64 KiB,
    and a pod with large annotations can exceed that)."""
    pending = b""
    async for chunk in content.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


__all__ = ["FollowStream", "ListResult", "WatchSource"]
