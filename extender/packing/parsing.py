"""Parsing a scheduler's Pod once per (uid, resourceVersion): the pod's request, its CPU and its
signature, or the reason it is invalid.

Owns the parse cache. kube-scheduler sends the same Pod object to /filter, /prioritize and
/preempt, and again on every retry; a pod's spec cannot change without its resourceVersion
changing, so one parse per version is enough. The cache is bounded in bytes, not entries (truth
rule 6 of docs/design.md): an entry keeps its identity strings alive, and a request may carry a 4
MiB uid. Pods whose identity no real pod has are parsed and answered, never cached.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.packing.errors import InvalidRequest
from extender.packing.podspec import is_object, parse_pod
from extender.packing.results import Demand, make_demand
from extender.packing.settings import BudgetSettings

#: Bytes the parse cache may hold, by its own estimate (`entry_bytes`). A typical entry is
#: ~0.9 KB, so 8 MiB holds ~9,000 pods, as many as the entry cap this replaces (8,192): the
#: pending pods of a large cluster, each retried.
DEFAULT_MAX_BYTES: Final = 8 << 20
#: Identity lengths past which a pod is not cached. Kubernetes UIDs are 36-character UUIDs,
#: names at most 253 characters (DNS subdomain), namespaces 63 (DNS label), resourceVersions
#: etcd revisions of at most 20 digits; hand-made uids get some slack.
MAX_UID: Final = 128
MAX_NAME: Final = 253
MAX_NAMESPACE: Final = 63
MAX_VERSION: Final = 64
#: Estimated bytes of one entry besides its strings (ParsedPod, key tuple, two dict slots, the
#: Demand, its ShareRequest and signature tuples), and of each container ask: measured with
#: tracemalloc (tests/packing/test_parse_cache.py checks the estimate against it).
ENTRY_OVERHEAD: Final = 450
CONTAINER_OVERHEAD: Final = 150
#: str objects cost their length plus this header (CPython, compact ASCII).
STR_OVERHEAD: Final = 49


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
    meta = pod.get("metadata") if is_object(pod) else None
    if not is_object(meta):
        return "", "", "", ""

    def text(key: str, default: str = "") -> str:
        value = meta.get(key, default)
        return value if isinstance(value, str) else default

    return text("namespace", "default"), text("name"), text("uid"), text("resourceVersion")


def entry_bytes(parsed: ParsedPod) -> int:
    """The parse cache's estimate of what keeping `parsed` costs, strings included."""
    size = ENTRY_OVERHEAD + 4 * STR_OVERHEAD + len(parsed.namespace) + len(parsed.name)
    if parsed.key is not None:
        size += len(parsed.key[0]) + len(parsed.key[1])
    if parsed.error is not None:
        size += STR_OVERHEAD + len(parsed.error)
    if parsed.demand is not None:
        for ask in parsed.demand.request.containers:
            size += CONTAINER_OVERHEAD + len(ask.name)
    return size


def real_identity(namespace: str, name: str, uid: str, version: str = "") -> bool:
    """Whether a real pod could have this identity (see MAX_UID and the others): what the
    parser, the filter answers kept for `/status/why` and the scheduling cycles keep."""
    return (
        len(uid) <= MAX_UID
        and len(name) <= MAX_NAME
        and len(namespace) <= MAX_NAMESPACE
        and len(version) <= MAX_VERSION
    )


class PodParser:
    """Cached `parse_pod`. `limits()` gives the cluster's largest GPU memory and units, so that
    asks no GPU can hold are rejected with a reason; the cache is dropped when they change.

    At most `max_bytes` (estimated, `entry_bytes`) are kept; past that the oldest entries go
    first (pods come and go in a stream, and a re-parse costs tens of microseconds). An entry
    larger than a sixteenth of the budget is not kept, so one request cannot flush the cache."""

    def __init__(
        self,
        budgets: BudgetSettings,
        *,
        cpu_milli: Callable[[Mapping[str, Any]], int],
        limits: Callable[[], tuple[int | None, int | None]],
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._budgets = budgets
        self._cpu_milli = cpu_milli
        self._limits = limits
        self._max_bytes = max_bytes
        self._seen_limits: tuple[int | None, int | None] | None = None
        #: Insertion order is age order: eviction takes the first entry.
        self._by_version: dict[tuple[str, str], ParsedPod] = {}
        #: The newest version of each uid; always also an entry of `_by_version`.
        self._by_uid: dict[str, ParsedPod] = {}
        #: Sum of `entry_bytes` over `_by_version` (the `_by_uid` entries are the same objects).
        self.nbytes = 0

    def parse(self, pod: object) -> ParsedPod:
        namespace, name, uid, version = _identity(pod)
        limits = self._limits()
        if limits != self._seen_limits:
            self._seen_limits = limits
            self._by_version.clear()
            self._by_uid.clear()
            self.nbytes = 0
        # Without a uid there is no identity to cache under. Without a resourceVersion (the
        # scheduler always sends one; hand-made requests may not) the uid alone is used: a
        # pod's mpsched resources, priority and user are immutable once it exists.
        key = (uid, version) if uid else None
        if key is not None:
            hit = self._by_version.get(key) if version else self._by_uid.get(uid)
            if hit is not None:
                return hit
        parsed = self._parse(pod, key, namespace, name, uid, limits)
        if key is not None and real_identity(namespace, name, uid, version):
            self._keep(key, parsed)
        return parsed

    def _keep(self, key: tuple[str, str], parsed: ParsedPod) -> None:
        size = entry_bytes(parsed)
        if size * 16 > self._max_bytes:
            return
        old = self._by_version.pop(key, None)
        if old is not None:
            self.nbytes -= entry_bytes(old)
        self._by_version[key] = parsed
        self._by_uid[parsed.uid] = parsed
        self.nbytes += size
        while self.nbytes > self._max_bytes:
            first = self._by_version.pop(next(iter(self._by_version)))
            self.nbytes -= entry_bytes(first)
            if self._by_uid.get(first.uid) is first:
                del self._by_uid[first.uid]

    def __len__(self) -> int:
        """Versions cached."""
        return len(self._by_version)

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
            if not is_object(pod):
                raise InvalidRequest(f"pod is a {type(pod).__name__}, not an object")
            request = parse_pod(
                pod, self._budgets, max_gpu_memory_mib=limits[0], max_units=limits[1]
            )
            spec = pod.get("spec")
            cpu = self._cpu_milli(spec if is_object(spec) else {})
        except InvalidRequest as exc:
            return ParsedPod(key, namespace, name, uid, None, f"invalid mpsched request: {exc}")
        return ParsedPod(key, namespace, name, uid, make_demand(request, cpu), None)
