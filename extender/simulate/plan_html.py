"""The capacity plan as one self-contained HTML page: the answer first, then the curves over
time, the waits, the GPUs each seed needed, the inputs and every column's meaning. Charts are
inline SVG drawn here, styling inline CSS, and the one script (clicking a legend entry hides a
strategy's lines) inline too: the page loads nothing from anywhere."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT, PAD = 540, 200, 44

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{padding:4px 10px;border-bottom:1px solid #eee;
text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f6f6f6}
.answer{background:#f3f8ff;border:1px solid #bcd;border-radius:6px;padding:12px 16px}
.big{font-size:18px;margin:4px 0}.muted{color:#666;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:14px}.chart{border:1px solid #eee;padding:4px}
.legend span{cursor:pointer;margin-right:14px;user-select:none}.legend span.off{opacity:.35}
svg text{font-size:11px;fill:#444}dl dt{font-weight:600}dl dd{margin:0 0 6px 16px}
"""

SCRIPT = """
document.querySelectorAll('.legend span').forEach(function (item) {
  item.addEventListener('click', function () {
    var key = item.getAttribute('data-s');
    item.classList.toggle('off');
    document.querySelectorAll('[data-s="' + key + '"]').forEach(function (el) {
      if (el !== item && el.tagName !== 'SPAN') {
        el.style.display = item.classList.contains('off') ? 'none' : '';
      }
    });
  });
});
"""


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return escape(str(value))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for limit, unit, size in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / size:.0f} {unit}" if unit == "s" else f"{seconds / size:.1f} {unit}"
    return f"{seconds / 86400:.1f} d"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _color(k: int) -> str:
    return COLORS[k % len(COLORS)]


def _legend(names: Sequence[str]) -> str:
    items = "".join(
        f'<span data-s="{k}"><svg width="14" height="10"><rect width="14" height="10" '
        f'fill="{_color(k)}"/></svg> {escape(n)}</span>'
        for k, n in enumerate(names)
    )
    return f'<p class="legend">{items} <span class="muted">(click to hide)</span></p>'


def line_chart(title: str, series: Sequence[Sequence[float]], end_s: float, unit: str) -> str:
    """One SVG chart: a line per strategy over the replay's span (hours or days on x)."""
    top = max((max(s, default=0) for s in series), default=0) or 1
    days = end_s > 3 * 86400
    scale_x = end_s / (86400 if days else 3600)
    inner_w, inner_h = WIDTH - PAD - 10, HEIGHT - 40
    parts = [f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">']
    parts.append(f'<text x="{PAD}" y="12">{escape(title)} ({escape(unit)})</text>')
    for tick in range(5):
        y = 20 + inner_h * (1 - tick / 4)
        parts.append(
            f'<line x1="{PAD}" x2="{WIDTH - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{PAD - 4}" y="{y + 4:.1f}" text-anchor="end">{top * tick / 4:,.0f}</text>'
        )
    for tick in range(5):
        x = PAD + inner_w * tick / 4
        label = f"{scale_x * tick / 4:,.1f}{'d' if days else 'h'}"
        anchor = "end" if tick == 4 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="{anchor}">{label}</text>')
    for k, values in enumerate(series):
        if not values:
            continue
        step = inner_w / max(1, len(values) - 1)
        points = " ".join(
            f"{PAD + i * step:.1f},{20 + inner_h * (1 - v / top):.1f}" for i, v in enumerate(values)
        )
        parts.append(
            f'<polyline data-s="{k}" fill="none" stroke="{_color(k)}" stroke-width="1.4" '
            f'points="{points}"/>'
        )
    parts.append("</svg>")
    return f'<div class="chart">{"".join(parts)}</div>'


def wait_chart(histograms: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    """Grouped bars: pods per wait bin (log scale of pods), one bar per strategy."""
    if not histograms:
        return ""
    bins = histograms[0]
    labels = ["none"] + [
        f"<{_duration(b['to'])}" if b["to"] is not None else f">={_duration(b['from'])}"
        for b in bins[1:]
    ]
    top = max((b["pods"] for h in histograms for b in h), default=1) or 1
    log_top = math.log10(top + 1)
    width = 2 * WIDTH
    inner_w, inner_h = width - PAD - 10, HEIGHT - 40
    group = inner_w / len(bins)
    bar = group * 0.8 / len(histograms)
    parts = [f'<svg width="{width}" height="{HEIGHT}" role="img" aria-label="wait times">']
    parts.append(f'<text x="{PAD}" y="12">pods by time waited (pods, log scale)</text>')
    for k, hist in enumerate(histograms):
        for i, b in enumerate(hist):
            h = inner_h * math.log10(b["pods"] + 1) / log_top
            x = PAD + i * group + group * 0.1 + k * bar
            parts.append(
                f'<rect data-s="{k}" x="{x:.1f}" y="{20 + inner_h - h:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}" fill="{_color(k)}"><title>{b["pods"]} pods</title></rect>'
            )
    for i, label in enumerate(labels):
        x = PAD + (i + 0.5) * group
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="middle">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return f'<div class="chart">{"".join(parts)}</div>'


def _saving(s: Mapping[str, Any]) -> str:
    ours, other = escape(s["mpsched"]), escape(s["against"])
    if s["mean"] is None:
        return f"<li>{ours} vs {other}: a size was not found</li>"
    more = s["mean"] < 0
    return (
        f"<li><b>{ours}</b> needs <b>{_fmt(abs(s['mean']))}</b> GPUs "
        f"{'more' if more else 'fewer'} than {other} on average "
        f"(per seed, saved: {s['min']} to {s['max']})</li>"
    )


def _answer(doc: Mapping[str, Any]) -> str:
    bound = doc["lower_bound_gpus"]
    rows = []
    for name, s in doc["strategies"].items():
        need = s["gpus_needed"]
        spread = "–" if need["min"] is None else f"{need['min']}–{need['max']}"
        vs = "–" if s["vs_bound_pct"] is None else f"{s['vs_bound_pct']:+.1f} %"
        rows.append(
            f"<tr><td>{escape(name)}</td><td><b>{_fmt(need['mean'])}</b></td><td>{spread}</td>"
            f"<td>{vs}</td></tr>"
        )
    saved = "".join(_saving(s) for s in doc["savings"])
    blocked = "".join(
        f"<li>{escape(name)}: on {b['at_gpus']} GPUs, this pod waited too long: "
        f"{escape(b['pod'])}</li>"
        for name, s in doc["strategies"].items()
        if (b := next(iter(s["blocked_by"].values()), None)) is not None
    )
    if blocked:
        saved += f"</ul><p>What stopped a smaller cluster (first seed):</p><ul>{blocked}"
    inputs = doc["inputs"]
    return (
        '<div class="answer"><p class="big">Smallest cluster that runs the workload with no pod '
        f"waiting longer than {_duration(inputs.get('max_wait_s'))}, at load "
        f"×{_fmt(inputs.get('load'), 2)}; lower bound <b>{bound}</b> GPUs (the smallest "
        f"cluster of this shape meeting it: {doc['lower_bound']['cluster_gpus']} GPUs).</p>"
        "<table><tr><th>strategy</th><th>GPUs needed (mean)</th><th>min–max over seeds</th>"
        f"<th>vs lower bound</th></tr>{''.join(rows)}</table><ul>{saved}</ul></div>"
    )


def _summary_table(comparison: Mapping[str, Any]) -> str:
    head = ("strategy", "placed", "never placed", "waited", "wait p50", "wait p95", "wait max",
            "demand placed peak", "GPUs busy peak", "GPUs busy mean", "fragmentation peak",
            "paper alloc % (comparison)")  # fmt: skip
    rows = ["<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for name, o in comparison["strategies"].items():
        cells = (
            escape(name), _fmt(o["placed"]), _fmt(o["never_placed"]), _fmt(o["waited"]),
            _duration(o["wait_p50"]), _duration(o["wait_p95"]), _duration(o["wait_max"]),
            _fmt(o["peak_demand_gpus"]), _fmt(o["peak_busy_gpus"]), _fmt(o["mean_busy_gpus"]),
            _fmt(o["peak_frag_gpus"]), _fmt(o["paper_alloc_pct"]),
        )  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table>{''.join(rows)}</table>"


def _seeds(doc: Mapping[str, Any]) -> str:
    seeds = doc["inputs"].get("seeds", [])
    head = "<tr><th>strategy</th>" + "".join(f"<th>seed {escape(str(s))}</th>" for s in seeds)
    rows = [head + "</tr>"]
    for name, s in doc["strategies"].items():
        per = s["gpus_needed"]["per_seed"]
        cells = "".join(f"<td>{_fmt(per.get(str(seed)))}</td>" for seed in seeds)
        rows.append(f"<tr><td>{escape(name)}</td>{cells}</tr>")
    return f"<table>{''.join(rows)}</table>"


def render(doc: Mapping[str, Any]) -> str:
    """The page for a plan document (`plan_report.plan_json`)."""
    names = list(doc["strategies"])
    version = escape(str(doc["inputs"].get("version")))
    body = [f'<h1>mpsched capacity plan</h1><p class="muted">mpsched {version}</p>']
    body.append(_answer(doc))
    comparison = doc.get("comparison")
    if comparison:
        outs = comparison["strategies"]
        curves = [outs[n].get("curves") or {} for n in names]
        end = max((c.get("end_s", 0.0) for c in curves), default=0.0)
        body.append(
            f"<h2>Over time, every strategy on one cluster ({comparison['nodes']} nodes, "
            f"{comparison['gpus']} GPUs, seed {comparison['seed']})</h2>"
            '<p class="muted">The cluster is the smallest any strategy needed: the others show '
            "how they fare on it. Each point is the largest value in its slice of time.</p>"
        )
        body.append(_legend(names))
        charts = [
            ("GPUs busy", "busy_gpus", "GPUs"),
            ("GPU demand placed", "demand_gpus", "GPUs"),
            ("pods waiting", "waiting", "pods"),
            ("fragmentation, FGD measure", "frag_gpus", "GPUs"),
        ]
        body.append(
            '<div class="charts">'
            + "".join(
                line_chart(t, [c.get(key, []) for c in curves], end, u) for t, key, u in charts
            )
            + "</div>"
        )
        body.append("<h2>Summary on that cluster</h2>" + _summary_table(comparison))
        body.append("<h2>Wait times on that cluster</h2>")
        body.append(_legend(names))
        body.append(wait_chart([outs[n]["wait_histogram"] for n in names]))
    body.append("<h2>GPUs needed, per seed</h2>" + _seeds(doc))
    inputs = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(_text(v))}</td></tr>"
        for k, v in doc["inputs"].items()
    )
    body.append(f"<h2>Inputs</h2><table>{inputs}</table>")
    columns = "".join(
        f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in doc["columns"].items()
    )
    body.append(f"<h2>What each figure means</h2><dl>{columns}</dl>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<title>mpsched capacity plan</title><link rel="icon" href="data:,">'
        f"<style>{STYLE}</style></head><body>{''.join(body)}<script>{SCRIPT}</script></body></html>"
    )
