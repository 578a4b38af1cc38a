"""What `kubectl mpsched` prints for `why` and `top`, from the documents it reads: the
extender's `/status/why` and `/status`, and the node agents' `/metrics` text.

Owns the two tables and the reading of the agents' per-pod series; pure (no I/O), so the
command (`extender.commands.kubectl`) only fetches. `mpsched status`'s table is
`extender.commands.status_table`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class AgentMetricsError(ValueError):
    """An agent's /metrics text does not parse."""


def format_why(doc: Mapping[str, Any], *, pod: Mapping[str, Any] | None) -> str:
    """The reasons, one line per node, after a line on the pod and a count per reason."""
    nodes = doc.get("nodes") or []
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(doc.get("filteredAt", 0))))
    key = f"{doc.get('namespace')}/{doc.get('name')}"
    lines = [
        f"{key}: the last filter call ({when}) passed {doc.get('passed', 0)} node(s) "
        f"and refused {len(nodes)}"
    ]
    uid = (pod or {}).get("metadata", {}).get("uid")
    if uid and uid != doc.get("uid"):
        lines.append(
            f"note: these reasons are for an earlier pod of that name (uid {doc.get('uid')}); "
            f"the extender has not filtered {uid} yet"
        )
    counts = Counter(n["reason"] for n in nodes)
    for reason, k in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"  {k} node(s): {reason}")
    if nodes:
        width = max(len("NODE"), *(len(n["node"]) for n in nodes))
        lines += ["", f"{'NODE':<{width}}  REASON"]
        for n in nodes:
            tail = "" if n.get("resolvable", True) else "  (no eviction can help)"
            lines.append(f"{n['node']:<{width}}  {n['reason']}{tail}")
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class Usage:
    """One pod's MPS clients on one GPU, as its node's agent published them."""

    used_mib: float | None = None
    allowed_mib: float | None = None
    clients: float | None = None
    over_share: bool = False


def parse_agent_metrics(text: str) -> dict[tuple[str, str, int], Usage]:
    """(node, pod uid, GPU index) → usage, from an agent's `/metrics` text."""
    # Imported here: only `top` needs the exposition parser.
    from prometheus_client.parser import text_string_to_metric_families

    fields = {
        "mpsched_agent_pod_memory_used_mib": "used_mib",
        "mpsched_agent_pod_memory_allowed_mib": "allowed_mib",
        "mpsched_agent_pod_mps_clients": "clients",
        "mpsched_agent_pod_over_share": "over_share",
    }
    out: dict[tuple[str, str, int], Usage] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise AgentMetricsError(f"an agent's /metrics does not parse: {exc}") from None
    for family in families:
        for sample in family.samples:
            field = fields.get(sample.name)
            labels = sample.labels
            if field is None or not labels.get("gpu", "").isdigit():
                continue
            key = (labels.get("node", ""), labels.get("uid", ""), int(labels["gpu"]))
            usage = out.setdefault(key, Usage())
            if field == "over_share":
                usage.over_share = sample.value >= 1
            else:
                setattr(usage, field, sample.value)
    return out


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def format_top(
    status: Mapping[str, Any], usage: Mapping[Any, Usage], *, namespace: str | None
) -> str:
    """One row per pod and GPU it holds: its share, and what the agent saw it use."""
    rows = []
    for node in status.get("nodes") or []:
        for g in node.get("gpus") or []:
            holders = [
                {"namespace": p["namespace"], "name": p["name"], "uid": p["uid"], "pod": p}
                for p in g.get("pods") or []
            ]
            owner = g.get("wholeOwner")
            if owner:
                ns, _, name = owner.partition("/")
                holders.append({"namespace": ns, "name": name, "uid": None, "pod": None})
            for h in holders:
                if namespace is not None and h["namespace"] != namespace:
                    continue
                p = h["pod"]
                seen = usage.get((node["name"], h["uid"], g["index"])) if h["uid"] else None
                if p is None:
                    share = ("whole", "whole", "-")
                else:
                    share = (f"{p['threads']}%", str(p["memoryMiB"]), str(p["clients"]))
                if seen is None:
                    used, clients, state = "-", "-", "no usage published"
                else:
                    used, clients = _mib(seen.used_mib), _mib(seen.clients)
                    state = "OVER SHARE" if seen.over_share else "ok"
                rows.append(
                    (
                        f"{h['namespace']}/{h['name']}",
                        node["name"],
                        str(g["index"]),
                        share[0],
                        f"{used}/{share[1]}",
                        f"{clients}/{share[2]}",
                        state,
                    )
                )
    head = ("POD", "NODE", "GPU", "THREADS", "MEMORY MiB used/share", "CLIENTS used/share", "")
    rows.sort()
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines) + "\n"
