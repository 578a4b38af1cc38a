"""`FilterReasons`: the reasons the latest filter call gave each pod, per node, kept so that an
operator can ask why a pending pod is pending (`GET /status/why/{namespace}/{name}`, `kubectl
mpsched why POD`).

Owns the bound on what is kept. Filter already computed the reasons: `remember` stores the very
dicts it answered with (no copy, no walk over them), so the hot path pays one dict insert and an
estimate of the entry's size from the two dicts' lengths. Entries are kept least recently
filtered first; past `max_bytes` (estimated) or `max_pods`, the oldest go. A pod filtered again
replaces its entry, so what is kept is always the latest filter's answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from extender.packing.parsing import real_identity

#: Bytes per node reason kept, at most: the dict slot and the node name's string, as long as a
#: node's name can be (a DNS subdomain: the API server refuses longer ones, and kube-scheduler,
#: the verbs' one client, sends the names of nodes it has). The reason strings are shared: the
#: evaluator keeps one copy of each.
NODE_REASON_BYTES: Final = 96 + 253
#: Estimated bytes of an entry besides its reasons (the record, its strings, two dict slots).
ENTRY_BYTES: Final = 600
#: Defaults: a few thousand pending pods, or a few dozen refused on every node of a
#: 5,000-node cluster, whichever bound is met first.
DEFAULT_MAX_BYTES: Final = 64 << 20
DEFAULT_MAX_PODS: Final = 4096


_Entry = tuple[str, str, float, int, Mapping[str, str], Mapping[str, str], int]


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """One pod's latest filter answer: the nodes that passed (how many) and the reason of every
    node that did not (`failed`: evicting pods could help; `unresolvable`: nothing can)."""

    namespace: str
    name: str
    uid: str
    #: Unix time of the filter call.
    at: float
    passed: int
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]

    def document(self) -> dict[str, Any]:
        """The JSON answer of `/status/why`: nodes sorted by name, each with its reason."""
        rows = [(n, r, True) for n, r in self.failed.items()]
        rows += [(n, r, False) for n, r in self.unresolvable.items()]
        rows.sort()
        nodes = [{"node": n, "reason": r, "resolvable": ok} for n, r, ok in rows]
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "filteredAt": self.at,
            "passed": self.passed,
            "nodes": nodes,
        }


class FilterReasons:
    """The latest filter answer per pod UID, bounded (module docstring)."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pods: int = DEFAULT_MAX_PODS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_pods = max_pods
        self._clock = clock
        #: uid → (namespace, name, time, passed, failed, unresolvable, estimated bytes);
        #: insertion order is age order.
        self._by_uid: dict[str, _Entry] = {}
        #: (namespace, name) → the uid last filtered under that name.
        self._by_name: dict[tuple[str, str], str] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._by_uid)

    def remember(
        self,
        namespace: str,
        name: str,
        uid: str,
        passed: int,
        failed: Mapping[str, str],
        unresolvable: Mapping[str, str],
    ) -> None:
        """Keep this answer as the pod's latest. The mappings are kept as they are: the caller
        must not change them afterwards. An identity no real pod could have (a uid, name or
        namespace longer than the API server allows) is not kept, as the parser does not."""
        if not real_identity(namespace, name, uid):
            return
        # A plain tuple, made into a FilterAnswer only when asked for: the cheapest record.
        size = ENTRY_BYTES + len(uid) + len(name) + len(namespace)
        size += NODE_REASON_BYTES * (len(failed) + len(unresolvable))
        by_uid = self._by_uid
        old = by_uid.pop(uid, None)
        if old is not None:
            self.nbytes -= old[6]
        by_uid[uid] = (namespace, name, self._clock(), passed, failed, unresolvable, size)
        self._by_name[(namespace, name)] = uid
        self.nbytes += size
        while (self.nbytes > self.max_bytes or len(by_uid) > self.max_pods) and len(by_uid) > 1:
            self._drop(next(iter(by_uid)))

    def _drop(self, uid: str) -> None:
        namespace, name, *_, size = self._by_uid.pop(uid)
        self.nbytes -= size
        key = (namespace, name)
        if self._by_name.get(key) == uid:
            del self._by_name[key]

    def of_uid(self, uid: str) -> FilterAnswer | None:
        found = self._by_uid.get(uid)
        if found is None:
            return None
        namespace, name, at, passed, failed, unresolvable, _ = found
        return FilterAnswer(namespace, name, uid, at, passed, failed, unresolvable)

    def of_pod(self, namespace: str, name: str) -> FilterAnswer | None:
        """The latest answer for the pod last filtered under this name."""
        uid = self._by_name.get((namespace, name))
        return None if uid is None else self.of_uid(uid)
