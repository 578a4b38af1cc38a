"""Parsing a scheduler's Pod once per (uid, resourceVersion): the pod's request, its CPU and its
signature, or the reason it is invalid.

Owns the parse cache. kube-scheduler sends the same Pod object to /filter, /prioritize and
/preempt, and again on every retry; a pod's spec cannot change without its resourceVersion
changing, so one parse per version is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.packing.errors import InvalidRequest
from extender.packing.evaluate import Demand, make_demand
from extender.packing.podspec import parse_pod
from extender.packing.settings import BudgetSettings

#: Parsed pods kept; the oldest half is dropped past this (pods come and go in a stream).
MAX_PARSED: Final = 8192


@dataclass(frozen=True, slots=True)
class ParsedPod:
    """One version of one pod: `demand` when valid, else `error` (the reason for filter)."""

    key: tuple[str, str] | None
    namespace: str
    name: str
    uid: str
    demand: Demand | None
    error: str | None


def _identity(pod: object) -> tuple[str, str, str, str]:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", "", "", ""

    def text(key: str, default: str = "") -> str:
        value = meta.get(key, default)
        return value if isinstance(value, str) else default

    return text("namespace", "default"), text("name"), text("uid"), text("resourceVersion")


class PodParser:
    """Cached `parse_pod`. `limits()` gives the cluster's largest GPU memory and units, so that
    asks no GPU can hold are rejected with a reason; the cache is dropped when they change."""

    def __init__(
        self,
        budgets: BudgetSettings,
        *,
        cpu_milli: Callable[[Mapping[str, Any]], int],
        limits: Callable[[], tuple[int | None, int | None]],
    ) -> None:
        self._budgets = budgets
        self._cpu_milli = cpu_milli
        self._limits = limits
        self._seen_limits: tuple[int | None, int | None] | None = None
        self._by_version: dict[tuple[str, str], ParsedPod] = {}
        self._by_uid: dict[str, ParsedPod] = {}

    def parse(self, pod: object) -> ParsedPod:
        namespace, name, uid, version = _identity(pod)
        limits = self._limits()
        if limits != self._seen_limits:
            self._seen_limits = limits
            self._by_version.clear()
            self._by_uid.clear()
        # Without a uid there is no identity to cache under. Without a resourceVersion (the
        # scheduler always sends one; hand-made requests may not) the uid alone is used: a
        # pod's mpsched resources, priority and user are immutable once it exists.
        key = (uid, version) if uid else None
        if key is not None:
            hit = self._by_version.get(key) if version else self._by_uid.get(uid)
            if hit is not None:
                return hit
        parsed = self._parse(pod, key, namespace, name, uid, limits)
        if key is not None:
            if len(self._by_version) >= MAX_PARSED:
                for old in list(self._by_version)[: MAX_PARSED // 2]:
                    del self._by_version[old]
                for old_uid in list(self._by_uid)[: MAX_PARSED // 2]:
                    del self._by_uid[old_uid]
            self._by_version[key] = parsed
            self._by_uid[uid] = parsed
        return parsed

    def latest(self, uid: str) -> ParsedPod | None:
        """The last version of this pod that was parsed (bind has only the uid)."""
        return self._by_uid.get(uid)

    def _parse(
        self,
        pod: object,
        key: tuple[str, str] | None,
        namespace: str,
        name: str,
        uid: str,
        limits: tuple[int | None, int | None],
    ) -> ParsedPod:
        try:
            if not isinstance(pod, Mapping):
                raise InvalidRequest(f"pod is a {type(pod).__name__}, not an object")
            request = parse_pod(
                pod, self._budgets, max_gpu_memory_mib=limits[0], max_units=limits[1]
            )
            spec = pod.get("spec")
            cpu = self._cpu_milli(spec if isinstance(spec, Mapping) else {})
        except InvalidRequest as exc:
            return ParsedPod(key, namespace, name, uid, None, f"invalid mpsched request: {exc}")
        return ParsedPod(key, namespace, name, uid, make_demand(request, cpu), None)
