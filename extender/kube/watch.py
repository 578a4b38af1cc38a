"""Watches that never lose an event: resume from the last resourceVersion after a broken
connection, and relist-and-reconcile after 410 Gone (the informer's "replace"), turning the
difference into ordinary events so the service needs only one code path."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from extender.cluster import ClusterError, ClusterEvent, JsonObject, ObjectKind

log = logging.getLogger(__name__)

#: Longest pause between attempts to reach an API server that does not answer.
MAX_RETRY_DELAY_S = 30.0


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JsonObject]
    resource_version: str


class WatchSource(Protocol):
    async def list_kind(self, kind: ObjectKind) -> ListResult: ...

    async def open_watch(self, kind: ObjectKind, resource_version: str) -> Any: ...


class Gone(Exception):
    """The resourceVersion we hold is too old: relist."""


def _key(kind: ObjectKind, obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    key = meta.get("name") if kind == "Node" else meta.get("uid")
    return key if isinstance(key, str) else None


def _stub(obj: Mapping[str, Any]) -> JsonObject:
    # Enough of a deleted object to identify it; keeps 60,000 pods' bodies out of memory.
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}}


class KindWatch:
    """Follows one kind. `listed()` hands it the list the service built its state from."""

    def __init__(
        self,
        kind: ObjectKind,
        source: WatchSource,
        queue: asyncio.Queue[ClusterEvent],
        *,
        retry_delay_s: float,
    ) -> None:
        self.kind = kind
        self._source = source
        self._queue = queue
        self._retry_delay_s = retry_delay_s
        self._known: dict[str, JsonObject] = {}
        self._version = ""
        self._start: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    def listed(self, result: ListResult) -> None:
        self._known = {k: _stub(o) for o in result.items if (k := _key(self.kind, o))}
        if not self._start.done():
            self._start.set_result(result.resource_version)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        # The version advances with every event delivered, so that a stream that breaks midway
        # resumes after the last event it handed on: nothing lost, nothing repeated.
        self._version = await self._start
        delay = self._retry_delay_s
        while True:
            try:
                await self._follow()
                delay = self._retry_delay_s
            except Gone:
                log.info(
                    "%s watch: resourceVersion %s expired, relisting", self.kind, self._version
                )
                self._version = await self._relist_until_done()
            except ClusterError as exc:
                log.warning("%s watch broke (%s); retrying in %.1fs", self.kind, exc, delay)
                await asyncio.sleep(delay)
                delay = min(MAX_RETRY_DELAY_S, delay * 2)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                log.warning("%s watch stream failed (%s); resuming", self.kind, exc)
                await asyncio.sleep(delay)
                delay = min(MAX_RETRY_DELAY_S, delay * 2)

    async def _follow(self) -> None:
        """One watch request, from the last resourceVersion seen, until the server ends it."""
        response = await self._source.open_watch(self.kind, self._version)
        try:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                raise ClusterError(f"watch {self.kind}s answered HTTP {response.status}")
            async for line in _lines(response.content):
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ClusterError(f"watch {self.kind}s: {obj.get('message', obj)}")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._emit(kind, obj)
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if isinstance(rv, str) and rv:
                    self._version = rv
        finally:
            response.release()

    def _emit(self, kind: Any, obj: JsonObject) -> None:
        key = _key(self.kind, obj)
        if key is not None:
            if kind == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = _stub(obj)
        self._queue.put_nowait(ClusterEvent(kind, self.kind, obj))

    async def _relist_until_done(self) -> str:
        delay = self._retry_delay_s
        while True:
            try:
                result = await self._source.list_kind(self.kind)
                break
            except ClusterError as exc:
                log.warning("%s relist failed (%s); retrying in %.1fs", self.kind, exc, delay)
                await asyncio.sleep(delay)
                delay = min(MAX_RETRY_DELAY_S, delay * 2)
        current = {k: o for o in result.items if (k := _key(self.kind, o))}
        for key in list(self._known):
            if key not in current:
                self._emit("DELETED", self._known[key])
        for obj in current.values():
            self._emit("MODIFIED", obj)
        return result.resource_version


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


class WatchStream:
    """Events of both kinds, in the order each kind's watch delivers them."""

    def __init__(self, source: WatchSource, *, retry_delay_s: float = 1.0) -> None:
        self._queue: asyncio.Queue[ClusterEvent] = asyncio.Queue()
        self.kinds: dict[ObjectKind, KindWatch] = {
            kind: KindWatch(kind, source, self._queue, retry_delay_s=retry_delay_s)
            for kind in ("Node", "Pod")
        }
        for watch in self.kinds.values():
            watch.start()

    def __aiter__(self) -> AsyncIterator[ClusterEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ClusterEvent]:
        while True:
            yield await self._queue.get()

    def close(self) -> None:
        for watch in self.kinds.values():
            watch.stop()


__all__ = ["KindWatch", "ListResult", "WatchStream"]
