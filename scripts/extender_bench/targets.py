"""The targets the report grades PASS or MISS: issue #3's in the classic mode (pair p99 at the
adaptive count and at every node, pods/s, pair p50 against the floor's, serve's peak RSS), and
issue #11's in the realistic mode (filter+prioritize and bind p50 against the floor's, pods/s,
serve's peak RSS)."""

from __future__ import annotations

import math
from typing import Any

# Issue #3's targets; the realistic mode's (issue #11) share the pods/s and RSS ones.
TARGET_PAIR_P99_MS_ADAPTIVE = 3.0
TARGET_PAIR_P99_MS_ALL = 15.0
TARGET_PODS_PER_S = 700.0
TARGET_FLOOR_RATIO = 2.0
TARGET_RSS_MB = 600.0


def realistic_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    ext, floor = report["extender"], report["floor"]

    def ratio(key: str) -> float:
        a, b = ext[key]["p50"], floor[key]["p50"]
        return round(a / b, 2) if b else math.nan

    rows = [
        ("filter+prioritize p50 vs floor", ratio("pair_ms"), "<=", 1.5, "x"),
        ("bind p50 vs floor", ratio("bind_ms"), "<=", 1.5, "x"),
        ("pods/s sequential", ext["pods_per_s"], ">=", TARGET_PODS_PER_S, "pods/s"),
        ("peak RSS of serve", report["serve"]["peak_rss_mb"], "<=", TARGET_RSS_MB, "MB"),
    ]
    return _verdicts(rows)


def _ratio(ext: dict[str, Any], floor: dict[str, Any], phase: str, q: str) -> float:
    a, b = ext[phase]["pair_ms"][q], floor[phase]["pair_ms"][q]
    return round(a / b, 2) if b else math.nan


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    ext, floor = report["extender"], report["floor"]
    rows = [
        (
            f"pair p99 @{ext['adaptive']['candidates']} candidates",
            ext["adaptive"]["pair_ms"]["p99"],
            "<=",
            TARGET_PAIR_P99_MS_ADAPTIVE,
            "ms",
        ),
        (
            f"pair p99 @{ext['all']['candidates']} candidates (all)",
            ext["all"]["pair_ms"]["p99"],
            "<=",
            TARGET_PAIR_P99_MS_ALL,
            "ms",
        ),
        (
            f"pods/s sequential @{ext['adaptive']['candidates']}",
            ext["adaptive"]["pods_per_s"],
            ">=",
            TARGET_PODS_PER_S,
            "pods/s",
        ),
        (
            f"pair p50 vs floor @{ext['adaptive']['candidates']}",
            _ratio(ext, floor, "adaptive", "p50"),
            "<=",
            TARGET_FLOOR_RATIO,
            "x",
        ),
        ("pair p50 vs floor @all", _ratio(ext, floor, "all", "p50"), "<=", TARGET_FLOOR_RATIO, "x"),
        ("peak RSS of serve", report["serve"]["peak_rss_mb"], "<=", TARGET_RSS_MB, "MB"),
    ]
    return _verdicts(rows)


def _verdicts(rows: list[tuple[str, Any, str, float, str]]) -> list[dict[str, Any]]:
    """Each target row (name, value, "<=" or ">=", limit, unit) with PASS or MISS."""
    out = []
    for name, value, op, limit, unit in rows:
        ok = value is not None and not (isinstance(value, float) and math.isnan(value))
        ok = ok and (value <= limit if op == "<=" else value >= limit)
        out.append(
            {
                "target": name,
                "value": value,
                "op": op,
                "limit": limit,
                "unit": unit,
                "result": "PASS" if ok else "MISS",
            }
        )
    return out
