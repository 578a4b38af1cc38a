"""What the bench copies of kube-scheduler's node selection: the adaptive candidate count
(numFeasibleNodesToFind), the zone-interleaved node order (its node tree) and the windows that
rotate over it (nextStartNodeIndex), one `Scheduler` per server under test."""

from __future__ import annotations

from dataclasses import dataclass
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

    def window(self, pod: Json) -> list[str]:
        """findNodesThatPassFilters: from nextStartNodeIndex, the first `to_find` nodes that
        pass the scheduler's own filters (here nodeSelector; the GPU check is the extender's),
        and the start index moves past every node looked at."""
        selector = pod["spec"].get("nodeSelector") or {}
        n = len(self.order)
        found: list[str] = []
        looked = 0
        while looked < n and len(found) < self.to_find:
            name = self.order[(self.start + looked) % n]
            looked += 1
            labels = self.labels[name]
            if all(labels.get(k) == v for k, v in selector.items()):
                found.append(name)
        self.start = (self.start + looked) % n
        return found
