"""The per-node, per-GPU allocation table that `mpsched status` and `mpsched demo` print.

A pure function of the service's `GET /status` document (see `extender/service.py`): no I/O, so
both commands and the tests share exactly one rendering. It reads the document defensively
(missing keys print as "?") because the table is a diagnostic tool: it must still show what it
can when it talks to an extender of a slightly different version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Pods listed by name on one GPU row before "+N more": 48 MPS clients could otherwise turn one
#: row into a screenful.
DEFAULT_MAX_PODS_PER_GPU = 8

_HEADER = ("GPU", "MODEL", "CC", "MPS", "THREADS %", "MEMORY MiB", "CLIENTS", "PODS")


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else "?"


def _ratio(budget: Any, used_key: str, cap_key: str) -> str:
    if not isinstance(budget, Mapping):
        return "?"
    return f"{_num(budget.get(used_key))}/{_num(budget.get(cap_key))}"


def _pod_label(pod: Mapping[str, Any]) -> str:
    name = f"{pod.get('namespace', '?')}/{pod.get('name', '?')}"
    detail = f"{_num(pod.get('threads'))}%/{_num(pod.get('memoryMiB'))}Mi"
    clients = pod.get("clients")
    if isinstance(clients, int) and clients != 1:
        detail += f"/{clients}cl"
    # An assumed allocation is one the extender reserved but the cluster does not show yet:
    # worth flagging, because it is the state a crash or a lost bind would leave behind.
    mark = "*" if pod.get("state") == "assumed" else ""
    return f"{name}{mark} {detail}"


def _pods_cell(gpu: Mapping[str, Any], max_pods: int) -> str:
    owner = gpu.get("wholeOwner")
    if owner:
        return f"whole: {owner}"
    pods = gpu.get("pods") or []
    if not isinstance(pods, Sequence) or not pods:
        return "-"
    labels = [_pod_label(p) for p in pods if isinstance(p, Mapping)]
    shown = labels[:max_pods]
    more = len(labels) - len(shown)
    return ", ".join(shown) + (f" +{more} more" if more > 0 else "")


def _gpu_row(gpu: Mapping[str, Any], max_pods: int) -> tuple[str, ...]:
    return (
        _num(gpu.get("index")),
        str(gpu.get("model", "?")),
        str(gpu.get("computeCapability", "?")),
        str(gpu.get("mps", "?")),
        _ratio(gpu.get("threads"), "used", "capacity"),
        _ratio(gpu.get("memory"), "usedMiB", "capacityMiB"),
        _ratio(gpu.get("clients"), "used", "capacity"),
        _pods_cell(gpu, max_pods),
    )


def _align(rows: Sequence[tuple[str, ...]], indent: str) -> list[str]:
    # The last column (pods) is free text: pad every column but that one.
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)] + [r[-1]]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _count(value: Any, noun: str) -> str:
    return f"{_num(value)} {noun}{'' if value == 1 else 's'}"


def _summary(status: Mapping[str, Any], any_assumed: bool) -> list[str]:
    lines: list[str] = []
    if any_assumed:
        lines.append("* assumed: reserved by the extender, not yet seen in the cluster")
    summary = status.get("summary")
    if isinstance(summary, Mapping):
        threads = summary.get("threadsUsedPct")
        frag = summary.get("fragmentationPct")
        lines.append(
            f"{_count(summary.get('nodes'), 'node')}, {_count(summary.get('gpus'), 'GPU')}, "
            f"{_count(summary.get('pods'), 'pod')}; threads used "
            + (f"{threads:.1f}%" if isinstance(threads, int | float) else "?")
            + "; fragmentation "
            + (f"{frag:.1f}%" if isinstance(frag, int | float) else "?")
        )
        refused = summary.get("refusedNodes")
        for node in refused if isinstance(refused, Sequence) else ():
            if isinstance(node, Mapping):
                lines.append(
                    f"node {node.get('name', '?')} takes no GPU pods: {node.get('reason', '?')}"
                )
    config = status.get("config")
    if isinstance(config, Mapping):
        line = f"policy {config.get('policy', '?')}, config {config.get('source') or 'built-in'}"
        if config.get("error"):
            line += f" (last reload failed: {config['error']})"
        lines.append(line)
    return lines


def format_status(
    status: Mapping[str, Any], *, max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU
) -> str:
    """Render a `/status` document as text: one block per node, one row per GPU with the three
    budgets as used/capacity and the pods on it ("*" marks an assumed, unconfirmed
    allocation), then the cluster summary and the configuration in force."""
    lines: list[str] = []
    any_assumed = False
    nodes = status.get("nodes") or []
    for node in nodes if isinstance(nodes, Sequence) else []:
        if not isinstance(node, Mapping):
            continue
        gpus = [g for g in node.get("gpus") or [] if isinstance(g, Mapping)]
        lines.append(f"{node.get('name', '?')}  ({_count(len(gpus), 'GPU')})")
        any_assumed = any_assumed or any(
            isinstance(p, Mapping) and p.get("state") == "assumed"
            for g in gpus
            for p in g.get("pods") or []
        )
        if gpus:
            rows = [_HEADER, *(_gpu_row(g, max_pods_per_gpu) for g in gpus)]
            lines.extend(_align(rows, "  "))
        else:
            lines.append("  no GPU inventory")
        lines.append("")
    if not lines:
        lines = ["no nodes", ""]
    lines.extend(_summary(status, any_assumed))
    return "\n".join(lines).rstrip() + "\n"
