"""What a capacity plan reports: the column definitions (one text for `--help`, the table, the
JSON and the HTML report), the JSON document, and the terminal table."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from extender.simulate.plan_columns import COLUMNS
from extender.simulate.planner import Comparison, StrategyAnswer
from extender.simulate.timed import LowerBound
from extender.simulate.timeline import Outcome


@dataclass(frozen=True, slots=True)
class Saving:
    """One mpsched strategy against another, paired by seed (None: one side found no size)."""

    ours: str
    other: str
    per_seed: dict[int, int | None]

    @property
    def found(self) -> list[int]:
        return [v for v in self.per_seed.values() if v is not None]

    def mean(self) -> float | None:
        found = self.found
        return statistics.fmean(found) if found and len(found) == len(self.per_seed) else None


def savings(answers: Sequence[StrategyAnswer]) -> list[Saving]:
    """Every mpsched strategy against every alternative (whole, equal:N)."""
    out = []
    for ours in answers:
        if not ours.strategy.is_mpsched:
            continue
        for other in answers:
            if other.strategy.is_mpsched:
                continue
            per_seed: dict[int, int | None] = {}
            for a, b in zip(ours.seeds, other.seeds, strict=True):
                per_seed[a.seed] = None if a.gpus is None or b.gpus is None else b.gpus - a.gpus
            out.append(Saving(ours.strategy.name, other.strategy.name, per_seed))
    return out


def _pct(needed: float | None, bound: int) -> float | None:
    return None if needed is None or bound <= 0 else 100.0 * (needed / bound - 1)


#: Upper edges (s) of the wait bins after "no wait"; the last bin is open.
WAIT_EDGES = (1.0, 10.0, 60.0, 600.0, 3600.0, 36000.0, 86400.0)


def wait_histogram(waits: Sequence[float]) -> list[dict[str, float | int | None]]:
    """Pods by wait: none, then up to each edge of WAIT_EDGES, then longer."""
    counts = [0] * (len(WAIT_EDGES) + 2)
    for w in waits:
        counts[0 if w <= 0 else 1 + bisect.bisect_right(WAIT_EDGES, w)] += 1
    lows = (0.0, 0.0, *WAIT_EDGES)
    highs: tuple[float | None, ...] = (0.0, *WAIT_EDGES, None)
    return [
        {"from": lo, "to": hi, "pods": n} for lo, hi, n in zip(lows, highs, counts, strict=True)
    ]


def outcome_json(o: Outcome) -> dict[str, Any]:
    doc: dict[str, Any] = asdict(o.summary())
    doc["paper_alloc_pct"] = 100.0 * o.peak_booked_gpus / o.gpus if o.gpus else None
    doc["wait_histogram"] = wait_histogram(o.waits)
    if o.curves is not None:
        c = o.curves
        doc["curves"] = {
            "end_s": c.end,
            "waiting": c.waiting,
            "demand_gpus": [round(v, 2) for v in c.demand_gpus],
            "busy_gpus": c.busy_gpus,
            "frag_gpus": [round(v, 2) for v in c.frag_gpus],
        }
    return doc


def plan_json(
    *,
    inputs: Mapping[str, Any],
    bound: LowerBound,
    floor: tuple[int, int],
    answers: Sequence[StrategyAnswer],
    comparison: Comparison | None,
) -> dict[str, Any]:
    """The whole plan as one JSON-ready object (keys described in docs/capacity-planning.md)."""
    strategies: dict[str, Any] = {}
    for a in answers:
        found = [g for g in a.gpus if g is not None]
        strategies[a.strategy.name] = {
            "kind": a.strategy.kind,
            "policy": a.strategy.policy,
            "units": a.strategy.units or None,
            "gpus_needed": {
                "per_seed": {str(s.seed): s.gpus for s in a.seeds},
                "mean": a.mean,
                "min": min(found) if found else None,
                "max": max(found) if found else None,
            },
            "nodes_needed": {str(s.seed): s.nodes for s in a.seeds},
            "gpus_by_model": {str(s.seed): s.gpus_by_model for s in a.seeds},
            "vs_bound_pct": _pct(a.mean, bound.gpus),
            "replays": {str(s.seed): s.replays for s in a.seeds},
            "blocked_by": {
                str(s.seed): None
                if s.blocker is None
                else {"pod": s.blocker, "at_gpus": s.blocked_gpus}
                for s in a.seeds
            },
            "sizes_tried": {str(s.seed): {str(k): v for k, v in s.tried.items()} for s in a.seeds},
            "at_answer": {
                str(s.seed): None if s.at_answer is None else asdict(s.at_answer) for s in a.seeds
            },
        }
    doc: dict[str, Any] = {
        "inputs": dict(inputs),
        "lower_bound_gpus": bound.gpus,
        "lower_bound": {
            "peak_demand_gpus": bound.peak_demand_gpus,
            "peak_at_s": bound.peak_at,
            "per_model": bound.per_model,
            "cluster_nodes": floor[0],
            "cluster_gpus": floor[1],
            "vs_cluster_pct": {a.strategy.name: _pct(a.mean, floor[1]) for a in answers},
        },
        "strategies": strategies,
        "savings": [
            {
                "mpsched": s.ours,
                "against": s.other,
                "per_seed": {str(k): v for k, v in s.per_seed.items()},
                "mean": s.mean(),
                "min": min(s.found) if s.found else None,
                "max": max(s.found) if s.found else None,
            }
            for s in savings(answers)
        ],
        "columns": dict(COLUMNS),
    }
    if comparison is not None:
        doc["comparison"] = {
            "nodes": comparison.nodes,
            "gpus": comparison.gpus,
            "seed": comparison.seed,
            "strategies": {k: outcome_json(o) for k, o in comparison.outcomes.items()},
        }
    return doc


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def table(doc: Mapping[str, Any]) -> str:
    """The terminal table of a plan document (`plan_json`)."""
    bound = doc["lower_bound_gpus"]
    low = doc["lower_bound"]
    pinned = ", ".join(f"{m} {k}" for m, k in low["per_model"].items())
    lines = [
        f"lower bound: {bound} GPUs (peak concurrent GPU demand {low['peak_demand_gpus']:.2f}"
        + (f"; pinned to one model: {pinned}" if pinned else "")
        + f"); the smallest cluster of this shape meeting it: {low['cluster_gpus']} GPUs "
        f"({low['cluster_nodes']} nodes)",
        "",
    ]
    head = ("strategy", "GPUs needed", "min-max", "nodes", "vs bound", "peak busy", "waited",
            "wait p95", "wait max")  # fmt: skip
    rows = [head]
    for name, s in doc["strategies"].items():
        need = s["gpus_needed"]
        first = next(iter(s["at_answer"].values()), None)
        nodes = next(iter(s["nodes_needed"].values()), None)
        found = need["min"] is not None and need["mean"] is not None
        rows.append(
            (
                name,
                _num(need["mean"], 1) if found else "not found",
                f"{need['min']}-{need['max']}" if found else "-",
                _num(nodes),
                "-" if s["vs_bound_pct"] is None else f"{s['vs_bound_pct']:+.1f}%",
                "-" if first is None else str(first["peak_busy_gpus"]),
                "-" if first is None else str(first["waited"]),
                "-" if first is None else _duration(first["wait_p95"]),
                "-" if first is None else _duration(first["wait_max"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    saved = doc["savings"]
    if saved:
        lines.append("")
        for s in saved:
            if s["mean"] is None:
                lines.append(f"{s['mpsched']} vs {s['against']}: not comparable (a size not found)")
                continue
            lines.append(
                f"{s['mpsched']} saves {s['mean']:.1f} GPUs vs {s['against']} "
                f"(seeds: {s['min']:+d} to {s['max']:+d}; negative: it needs more)"
            )
    for name, s in doc["strategies"].items():
        block = next(iter(s["blocked_by"].values()), None)
        if block is not None:
            lines.append(
                f"{name}: on {block['at_gpus']} GPUs this pod waited too long: {block['pod']}"
            )
    lines.append("(peak busy, waited, waits, blockers: first seed; see --help)")
    return "\n".join(lines)
