"""What the bench copies of kube-scheduler's node selection: the adaptive candidate count
(numFeasibleNodesToFind), the zone-interleaved node order (its node tree) and the windows that
rotate over it (nextStartNodeIndex), one `Scheduler` per server under test."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


def adaptive_candidates(num_nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with percentageOfNodesToScore unset (§4.3)."""
    if num_nodes < 100:
        return num_nodes
    pct = max(5, 50 - num_nodes // 125)
    return max(100, num_nodes * pct // 100)


def zone_interleaved(nodes: list[Json]) -> list[str]:
    """kube-scheduler's node order (its node tree): one node of each zone in turn."""
    zones: dict[str, list[str]] = {}
    for n in nodes:
        meta = n["metadata"]
        zones.setdefault(meta["labels"].get("topology.kubernetes.io/zone", ""), []).append(
            meta["name"]
        )
    lists = list(zones.values())
    out: list[str] = []
    for i in range(max(map(len, lists), default=0)):
        out.extend(z[i] for z in lists if i < len(z))
    return out


@dataclass
class Scheduler:
    """One kube-scheduler's view of the nodes for one target: the zone-interleaved node list,
    each node's labels, and nextStartNodeIndex."""

    order: list[str]
    labels: dict[str, dict[str, str]]
    to_find: int
    start: int = 0
    _hits: dict[tuple[tuple[str, str], ...], list[int]] = field(default_factory=dict, repr=False)

    def window(self, pod: Json) -> list[str]:
        """findNodesThatPassFilters: from nextStartNodeIndex, the first `to_find` nodes that
        pass the scheduler's own filters (here nodeSelector; the GPU check is the extender's),
        and the start index moves past every node looked at."""
        selector = pod["spec"].get("nodeSelector") or {}
        hits = self._passing(selector)
        n, start = len(self.order), self.start
        at = bisect.bisect_left(hits, start)
        taken = hits[at : at + self.to_find]
        taken += hits[: min(at, self.to_find - len(taken))]
        # Looked at: every node up to the last one taken, or all of them when too few pass.
        looked = n if len(taken) < self.to_find else (taken[-1] - start) % n + 1
        self.start = (start + looked) % n
        return [self.order[i] for i in taken]

    def _passing(self, selector: dict[str, str]) -> list[int]:
        """The positions in `order` of the nodes whose labels match `selector`, computed once
        per selector: kube-scheduler's filter loop is Go on cores of its own, and this driver
        shares the machine with the servers it measures."""
        key = tuple(sorted(selector.items()))
        hits = self._hits.get(key)
        if hits is None:
            hits = self._hits[key] = [
                i
                for i, name in enumerate(self.order)
                if all(self.labels[name].get(k) == v for k, v in key)
            ]
        return hits
