"""Notices: what the decision state tells the operator (a log line, a metric, an Event on the
pod) about reality the ledger counts as it is — a GPU over budget, a running pod whose GPU its
node's inventory does not show, an allocation edited or unreadable — and `Crossings`, which
reports each GPU over budget and each unplaced pod once per crossing, not on every event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from extender.packing.ledger import GpuUsage, Ledger

NoticeKind = Literal[
    "allocation_changed",
    "allocation_unreadable",
    "over_budget",
    "allocation_unplaced",
    "inventory_refused",
]


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the operator must hear about (a log line, a metric, an Event on the pod).
    An `inventory_refused` notice is about the node `name` (no namespace, no uid)."""

    kind: NoticeKind
    namespace: str
    name: str
    uid: str
    message: str


@dataclass(slots=True)
class Crossings:
    """What was last reported: GPUs (node, uuid) over a budget, and pods (uid → node) whose
    GPU their node's inventory does not show."""

    over: set[tuple[str, str]] = field(default_factory=set)
    unplaced: dict[str, str] = field(default_factory=dict)

    def note(self, ledger: Ledger, touched: Iterable[str], out: list[Notice]) -> None:
        """Report each GPU of a touched node that went over budget, and each pod there its
        inventory does not show, once per crossing."""
        isolation = ledger.budgets.uid_isolation
        for name in touched:
            usage = ledger.get_node(name)
            if usage is None:
                self.over = {k for k in self.over if k[0] != name}
                self.unplaced = {u: n for u, n in self.unplaced.items() if n != name}
                continue
            self._note_unplaced(ledger, name, usage.unplaced, out)
            self.over = {k for k in self.over if k[0] != name or k[1] in usage.uuids}
            for g in usage.gpus:
                key = (name, g.info.uuid)
                why = g.over_budget(multi_user=usage.inventory.multi_user, uid_isolation=isolation)
                if why is None:
                    self.over.discard(key)
                elif key not in self.over:
                    self.over.add(key)
                    out.append(_over_notice(ledger, name, g, why))

    def _note_unplaced(
        self, ledger: Ledger, name: str, unplaced: set[str], out: list[Notice]
    ) -> None:
        noted = self.unplaced
        for uid in [u for u, node in noted.items() if node == name and u not in unplaced]:
            del noted[uid]
        for uid in unplaced - noted.keys():
            noted[uid] = name
            alloc = ledger.allocation(uid)
            if alloc is None:
                continue
            gpus = ", ".join(g.uuid for g in alloc.gpus)
            out.append(
                Notice(
                    "allocation_unplaced",
                    alloc.namespace,
                    alloc.name,
                    uid,
                    f"the pod's GPU(s) {gpus} are not in the inventory {name} publishes: it "
                    f"stays counted, and mpsched places nothing new on {name} until the node "
                    "shows them again or the pod ends",
                )
            )


def _over_notice(ledger: Ledger, node: str, g: GpuUsage, why: str) -> Notice:
    holder = next(iter(g.shares.values()), None) or ledger.allocation(g.owner or "")
    namespace, name, uid = (
        (holder.namespace, holder.name, holder.pod_uid) if holder else ("", "", "")
    )
    return Notice(
        "over_budget",
        namespace,
        name,
        uid,
        f"GPU {g.info.index} ({g.info.uuid}) on {node} is over budget ({why}): what runs there "
        "stays counted and mpsched places nothing new on it until it is back within budget",
    )
