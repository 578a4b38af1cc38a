"""The report as text, one renderer a mode: the machine and runtime, the cluster, p50/p99 per
verb for each server (and phase), the binds, serve's memory and a PASS/MISS line per target; and
the rounding of the report's memory figures."""

from __future__ import annotations

import math
from typing import Any

from extender_bench.catalog import GPUS_PER_NODE
from extender_bench.realistic_driver import BIND_WORKERS


def _runtime_line(r: dict[str, str]) -> str:
    return (
        f"serve and floor: Python {r['python']}, mpsched build {r['build']}, loop {r['loop']} "
        f"({r['interpreter']})"
    )


def _target_lines(targets: list[dict[str, Any]]) -> list[str]:
    """One PASS/MISS line per target, as both modes print them."""
    lines = []
    for t in targets:
        v = t["value"]
        shown = "n/a" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
        lines.append(
            f"{t['result']:4}  {t['target']}: {shown} {t['unit']} (target {t['op']} "
            f"{t['limit']:g} {t['unit']})"
        )
    return lines


_API_LINES = {
    "process": "cluster: an API server in its own process per server (serve watches it and "
    "POSTs its Bindings there; the floor POSTs its Bindings to its own)",
    "embedded": "cluster: embedded in serve's process (--cluster-file); the floor's bind only "
    "answers",
}


def _pause_text(pause_ms: float) -> str:
    if not pause_ms:
        return ""
    return f"; {pause_ms:g} ms between filter and prioritize (the scheduler's Score plugins)"


def render_realistic(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["cluster"]
    ext, floor = report["extender"], report["floor"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']} ({m['platform']}); "
        f"1-minute load average {m['load_1m'][0]:.2f} before measuring, "
        f"{m['load_1m'][1]:.2f} after",
        _runtime_line(report["runtime"]),
        f"mode realistic: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs starting empty, "
        f"{c['pods']} distinct pending pods of {c['pod_kb']:.1f} KB on average "
        f"(each new to the extender), windows of {c['candidates']} nodes rotating over the "
        f"zone-interleaved node list, binds async ({BIND_WORKERS} workers) overlapping the next "
        f"pod; servers alternate every {report['block']} pods"
        + _pause_text(report.get("score_pause_ms", 0.0)),
        _API_LINES[report.get("api", "embedded")],
        *(
            [
                f"serve and the floor on CPU {','.join(map(str, report['server_cpus']))}, "
                "the driver and the API servers on the others"
            ]
            if report.get("server_cpus")
            else []
        ),
        *(
            [f"serve's accelerators switched off: {', '.join(report['accelerators_off'])}"]
            if report.get("accelerators_off")
            else []
        ),
        "",
        f"{'':10}{'filter p50/p99':>18}{'prioritize p50/p99':>22}{'pair p50/p99':>18}"
        f"{'bind p50/p99':>18}{'pods/s':>8}{'cpu/pod':>10}{'placed':>12}",
    ]
    for who, r in (("extender", ext), ("floor", floor)):
        lines.append(
            f"{who:10}{_pp(r['filter_ms']):>18}{_pp(r['prioritize_ms']):>22}"
            f"{_pp(r['pair_ms']):>18}{_pp(r['bind_ms']):>18}{r['pods_per_s'] or 0:>8.0f}"
            f"{r['server_cpu_ms_per_pod'] or 0:>7.2f} ms{r['placed']:>6}/{r['pods']}"
        )
    ratios = {
        k: (round(ext[k]["p50"] / floor[k]["p50"], 2) if floor[k]["p50"] else math.nan)
        for k in ("filter_ms", "prioritize_ms", "pair_ms", "bind_ms")
    }
    lines.append(
        "extender / floor, p50: "
        + ", ".join(f"{k[:-3]} {v:.2f}x" for k, v in ratios.items())
        + f"; pods/s {ext['pods_per_s'] or 0:.0f} vs {floor['pods_per_s'] or 0:.0f}"
    )
    lines.append(
        f"extender binds: {ext['bind_ok']} ok, {ext['bind_refused']} refused"
        + (f" (e.g. {ext['sample_errors'][0]})" if ext["bind_refused"] else "")
    )
    sv = report["serve"]
    if sv["peak_rss_mb"]:
        lines.append(f"serve memory: peak RSS (VmHWM) {sv['peak_rss_mb']:.0f} MB")
    ahead, in_calls = sv.get("results_ahead"), sv.get("results_in_calls")
    if ahead is not None and in_calls is not None:
        share = f" ({100 * ahead / (ahead + in_calls):.0f} % ahead)" if ahead + in_calls else ""
        lines.append(
            f"serve's fit-and-score results: {ahead:.0f} computed ahead for the filter calls "
            f"forecast, {in_calls:.0f} inside filter and prioritize calls{share}"
        )
    lines.append("")
    lines.extend(_target_lines(report["targets"]))
    return "\n".join(lines) + "\n"


def one_decimal(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _pp(s: dict[str, float]) -> str:
    return f"{s['p50']:.2f}/{s['p99']:.2f} ms"


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["cluster"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']} ({m['platform']}); "
        f"1-minute load average {m['load_1m'][0]:.2f} before measuring, "
        f"{m['load_1m'][1]:.2f} after",
        _runtime_line(report["runtime"]),
        f"cluster: {c['nodes']} nodes x {GPUS_PER_NODE} GPUs ({c['models']}), "
        f"{c['running_pods']} running pods ({c['whole_pods']} whole-GPU), "
        f"{c['threads_used_pct']:.1f}% of GPU threads in use; file {c['file_mb']:.1f} MB, "
        f"generated in {c['generate_s']:.1f}s; serve ready in {report['serve']['ready_s']:.1f}s, "
        f"idle {report['serve']['idle_after_s']:.1f}s later",
        f"servers alternate every {report['block']} pods; pods/s = pods / time inside "
        "filter+prioritize calls; cpu/pod = the server's own CPU time per pod",
        "",
        f"{'':28}{'filter p50/p99':>18}{'prioritize p50/p99':>22}{'pair p50/p99':>18}"
        f"{'pods/s':>9}{'cpu/pod':>10}{'placed':>8}",
    ]
    for who in ("extender", "floor"):
        for phase in ("adaptive", "all"):
            r = report[who][phase]
            label = f"{who} @{r['candidates']} candidates"
            lines.append(
                f"{label:28}{_pp(r['filter_ms']):>18}{_pp(r['prioritize_ms']):>22}"
                f"{_pp(r['pair_ms']):>18}{r['pods_per_s'] or 0:>9.0f}"
                f"{r['server_cpu_ms_per_pod'] or 0:>7.2f} ms"
                f"{r['placed']:>5}/{r['pods']}"
            )
    for who in ("extender", "floor"):
        r = report[who]["new_shapes"]
        lines.append(
            f"{who}, {r['pods']} pods of shapes never seen before @{r['candidates']} candidates: "
            f"filter p50/p99 {_pp(r['filter_ms'])}, pair p50/p99 {_pp(r['pair_ms'])} "
            "(no target: serve warms the shapes of pending pods ahead of the scheduler)"
        )
    for who in ("extender", "floor"):
        b = report[who]["bind"]
        lines.append(
            f"{who} bind x{b['binds']} ({b['concurrency']} in flight): p50 {b['p50_ms']:.2f} ms, "
            f"p99 {b['p99_ms']:.2f} ms, {b['binds_per_s'] or 0:.0f} binds/s, {b['ok']} ok, "
            f"{b['refused']} refused" + (f" (e.g. {b['sample_errors'][0]})" if b["refused"] else "")
        )
    if report["extender"]["bind"]["refused"]:
        lines.append(
            "  (refused binds are expected here: every pick was made before any bind, so picks of "
            "the same node collide once earlier binds fill it; kube-scheduler binds right after "
            "each cycle)"
        )
    sv = report["serve"]
    if sv["peak_rss_mb"]:
        lines.append(
            f"serve memory: peak RSS (VmHWM) {sv['peak_rss_mb']:.0f} MB, of which "
            f"{sv['peak_rss_at_ready_mb']:.0f} MB reached by the time /readyz said ready; "
            f"RSS at the end {sv['rss_at_end_mb']:.0f} MB"
        )
    else:
        lines.append("serve memory: unknown (no /proc)")
    lines.append("")
    lines.extend(_target_lines(report["targets"]))
    return "\n".join(lines) + "\n"
