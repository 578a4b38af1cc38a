"""What a simulation prints and writes: the per-policy table (with paired differences against
the first policy), the JSON document, and the allocation-curve plot."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from extender.simulate.replay import SeedResult

#: GPU allocation % at arrived = 100 % on the default openb trace, mean of seeds 42-51
#: (FGD paper, authors' cached results; reference fgd-benchmark.md §4).
PAPER_AT_100: Mapping[str, float] = MappingProxyType(
    {
        "random": 86.30,
        "dotprod": 90.62,
        "clustering": 91.65,
        "packing": 91.78,
        "bestfit": 92.86,
        "fgd": 95.23,
    }
)
#: The same at the end of the run (arrived = 130 %).
PAPER_AT_130: Mapping[str, float] = MappingProxyType(
    {
        "random": 87.47,
        "dotprod": 90.85,
        "clustering": 91.88,
        "packing": 92.00,
        "bestfit": 93.08,
        "fgd": 95.39,
    }
)
PLOT_FROM_PCT = 75
#: The paper's figures are for this pod file only; other inputs get no reference column.
PAPER_POD_FILE = "openb_pod_list_default.csv"


def paper_figures(pods_file: str | None) -> Mapping[str, float]:
    """The paper's allocation at 100 % by policy, if `pods_file` is the trace it used."""
    return PAPER_AT_100 if pods_file and Path(pods_file).name == PAPER_POD_FILE else {}


JSON_VERSION = 1


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """Every seed of one policy."""

    policy: str
    results: tuple[SeedResult, ...]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.results]

    def values(self, attr: str) -> list[float]:
        return [float(getattr(r, attr)) for r in self.results]


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (the paper's ±)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.pstdev(values)


def paired(run: PolicyRun, base: PolicyRun) -> tuple[float, float, int] | None:
    """Mean of the per-seed differences in allocation at 100 % (run − base), its standard
    error, and the number of common seeds; None with fewer than two common seeds."""
    theirs = {r.seed: r.alloc_pct_at_100 for r in base.results}
    diffs = [r.alloc_pct_at_100 - theirs[r.seed] for r in run.results if r.seed in theirs]
    if len(diffs) < 2:
        return None
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs)


def table(runs: Sequence[PolicyRun], paper: Mapping[str, float]) -> str:
    """The readable summary: one row per policy, then paired differences against the first."""
    head = (
        f"{'policy':<10} {'alloc@100%':>15} {'alloc@130%':>15} {'unalloc@100%':>13} "
        f"{'placed':>8} {'s/seed':>7} {'paper@100%':>11}"
    )
    lines = [head, "-" * len(head)]
    for run in runs:
        m100, sd100 = mean_sd(run.values("alloc_pct_at_100"))
        m130, sd130 = mean_sd(run.values("alloc_pct_at_end"))
        placed = statistics.fmean(run.values("placed"))
        secs = statistics.fmean(run.values("seconds"))
        ref = paper.get(run.policy)
        lines.append(
            f"{run.policy:<10} {m100:>8.2f} ± {sd100:4.2f} {m130:>8.2f} ± {sd130:4.2f} "
            f"{100 - m100:>13.2f} {placed:>8.0f} {secs:>7.2f} "
            + (f"{ref:>11.2f}" if ref is not None else f"{'-':>11}")
        )
    for run in runs[1:]:
        p = paired(run, runs[0])
        if p is not None:
            lines.append(
                f"paired {run.policy} − {runs[0].policy}: {p[0]:+.3f} pp ± {p[1]:.3f} (s.e., "
                f"{p[2]} seeds)"
            )
    return "\n".join(lines)


def run_document(
    run: PolicyRun, sources: Mapping[str, Any], paper: Mapping[str, float]
) -> dict[str, Any]:
    """One policy's JSON object."""
    m100, sd100 = mean_sd(run.values("alloc_pct_at_100"))
    m130, sd130 = mean_sd(run.values("alloc_pct_at_end"))
    return {
        "version": JSON_VERSION,
        "policy": run.policy,
        "seeds": run.seeds,
        "input": dict(sources),
        "mean_alloc_pct_at_100": m100,
        "sd_alloc_pct_at_100": sd100,
        "mean_unallocated_pct_at_100": 100 - m100,
        "mean_alloc_pct_at_end": m130,
        "sd_alloc_pct_at_end": sd130,
        "mean_seconds_per_seed": statistics.fmean(run.values("seconds")),
        "paper_alloc_pct_at_100": paper.get(run.policy),
        "paper_alloc_pct_at_130": PAPER_AT_130.get(run.policy) if paper else None,
        "per_seed": [
            {
                "seed": r.seed,
                "alloc_pct_at_100": r.alloc_pct_at_100,
                "alloc_pct_at_end": r.alloc_pct_at_end,
                "arrived_pct_at_end": r.arrived_pct_at_end,
                "arrivals": r.arrivals,
                "placed": r.placed,
                "seconds": r.seconds,
                "failed_pct_by_class": r.failed_pct_by_class,
                "curve": list(r.curve),
            }
            for r in run.results
        ],
    }


def write_json(
    path: Path,
    runs: Sequence[PolicyRun],
    sources: Mapping[str, Any],
    paper: Mapping[str, float],
) -> None:
    """One policy: its object. Several: a list of such objects, in the order they ran."""
    docs = [run_document(run, sources, paper) for run in runs]
    payload: object = docs[0] if len(docs) == 1 else docs
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def write_plot(path: Path, runs: Sequence[PolicyRun], paper: Mapping[str, float]) -> None:
    """PNG of allocation % against arrived % (75-130), the mean over seeds per policy, with
    the paper's figures at arrived = 100 % marked (when `paper` has them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    xs = list(range(PLOT_FROM_PCT, len(runs[0].results[0].curve)))
    for run in runs:
        ys = [statistics.fmean(r.curve[x] for r in run.results) for x in xs]
        ax.plot(xs, ys, label=f"{run.policy} (mean of {len(run.results)} seeds)")
    ax.plot(xs, [min(x, 100) for x in xs], color="grey", linestyle=":", label="ideal")
    label_y = math.inf
    for name, value in sorted(paper.items(), key=lambda kv: -kv[1]):
        ax.scatter([100], [value], marker="x", color="black", zorder=3)
        # Keep the labels at least a point apart where the paper's figures are close.
        label_y = min(value, label_y - 1.0)
        ax.annotate(
            f"paper {name} {value:.2f}",
            (100, value),
            xytext=(101.5, label_y),
            fontsize=7,
            va="center",
            arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5},
        )
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.set_xlim(PLOT_FROM_PCT, xs[-1])
    ax.set_ylim(70, 100.5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
