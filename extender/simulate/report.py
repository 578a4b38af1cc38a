"""What a simulation prints and writes: the per-policy table (with paired differences against
the first policy), the JSON document (one shape for one policy or many), and the plot of
allocation and fragmentation over arrived demand, titled with what was replayed."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from extender.simulate.replay import SeedResult

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.figure import Figure

#: GPU allocation % at arrived = 100 % on the default openb trace, mean of seeds 42-51
#: (FGD paper, authors' cached results).
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


#: 2: one top-level object (trace, seeds, config, tune, policies by name) for any number of
#: policies, and fragmentation; 1 was one object per policy, a list of them for several.
JSON_VERSION = 2


@dataclass(frozen=True, slots=True)
class Setup:
    """What a simulation replayed, for the JSON document and the plot's title."""

    #: The input files ({"nodes", "pods"} or {"cluster"}), and the GPU and pod counts.
    trace: Mapping[str, str | int]
    seeds: tuple[int, ...]
    #: The --config file as given, or "defaults".
    config: str
    tune: float

    def title(self, policies: Sequence[str]) -> str:
        """Two lines: the input file names; the seeds, policies and configuration file name."""
        files = [f"{k} {Path(str(v)).name}" for k, v in self.trace.items() if isinstance(v, str)]
        config = self.config if self.config == "defaults" else Path(self.config).name
        return (
            f"{', '.join(files)}\n{seed_text(self.seeds)} · "
            f"polic{'ies' if len(policies) > 1 else 'y'} {', '.join(policies)} · config {config}"
        )


def seed_text(seeds: Sequence[int]) -> str:
    """ "seed 42", "seeds 42–51" (consecutive), "seeds 5, 9", "seeds 1, 3, 7, … (12 seeds)"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    if len(seeds) <= 6:
        return f"seeds {', '.join(map(str, seeds))}"
    return f"seeds {', '.join(map(str, seeds[:3]))}, … ({len(seeds)} seeds)"


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


def run_document(run: PolicyRun, paper: Mapping[str, float]) -> dict[str, Any]:
    """One policy's figures: means and population sd over seeds, and every seed's."""
    m100, sd100 = mean_sd(run.values("alloc_pct_at_100"))
    m130, sd130 = mean_sd(run.values("alloc_pct_at_end"))
    f100, fsd100 = mean_sd(run.values("frag_pct_at_100"))
    return {
        "mean_alloc_pct_at_100": m100,
        "sd_alloc_pct_at_100": sd100,
        "mean_unallocated_pct_at_100": 100 - m100,
        "mean_alloc_pct_at_end": m130,
        "sd_alloc_pct_at_end": sd130,
        "mean_frag_pct_at_100": f100,
        "sd_frag_pct_at_100": fsd100,
        "mean_seconds_per_seed": statistics.fmean(run.values("seconds")),
        "paper_alloc_pct_at_100": paper.get(run.policy),
        "paper_alloc_pct_at_130": PAPER_AT_130.get(run.policy) if paper else None,
        "per_seed": [
            {
                "seed": r.seed,
                "alloc_pct_at_100": r.alloc_pct_at_100,
                "alloc_pct_at_end": r.alloc_pct_at_end,
                "arrived_pct_at_end": r.arrived_pct_at_end,
                "frag_pct_at_100": r.frag_pct_at_100,
                "arrivals": r.arrivals,
                "placed": r.placed,
                "seconds": r.seconds,
                "failed_pct_by_class": r.failed_pct_by_class,
                "curve": list(r.curve),
                "frag_curve": list(r.frag_curve),
            }
            for r in run.results
        ],
    }


def document(runs: Sequence[PolicyRun], setup: Setup, paper: Mapping[str, float]) -> dict[str, Any]:
    """The JSON document: one object, whatever the number of policies. `curve[x]` and
    `frag_curve[x]` are the allocation and the fragmentation (FGD's measure of the trace's
    typical workload), % of GPU capacity, at arrived = x % (x = 0..130)."""
    return {
        "version": JSON_VERSION,
        "trace": dict(setup.trace),
        "seeds": list(setup.seeds),
        "config": setup.config,
        "tune": setup.tune,
        "policies": {run.policy: run_document(run, paper) for run in runs},
    }


def write_json(
    path: Path, runs: Sequence[PolicyRun], setup: Setup, paper: Mapping[str, float]
) -> None:
    path.write_text(json.dumps(document(runs, setup, paper), indent=1) + "\n", encoding="utf-8")


def _band(runs: Sequence[SeedResult], attr: str, xs: Sequence[int]) -> tuple[list[float], ...]:
    """Mean, min and max over seeds of the curve `attr` at each x."""
    at = [[getattr(r, attr)[x] for r in runs] for x in xs]
    return [statistics.fmean(v) for v in at], [min(v) for v in at], [max(v) for v in at]


def write_plot(
    path: Path, runs: Sequence[PolicyRun], setup: Setup, paper: Mapping[str, float]
) -> None:
    """PNG of `figure`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(runs, setup, paper)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def figure(runs: Sequence[PolicyRun], setup: Setup, paper: Mapping[str, float]) -> Figure:
    """A matplotlib Figure of two panels over arrived demand: allocation % (75-130, the paper's
    view, with the paper's figures at arrived = 100 % marked when `paper` has them) and
    fragmentation % (0-130). Each policy: the mean over seeds, and a band from the lowest to
    the highest seed. The caller closes it (pyplot keeps every figure open until then)."""
    import matplotlib.pyplot as plt

    fig, (ax, fx) = plt.subplots(
        2, 1, figsize=(8, 8.5), dpi=110, gridspec_kw={"height_ratios": [3, 2]}
    )
    last = len(runs[0].results[0].curve) - 1
    xs = list(range(PLOT_FROM_PCT, last + 1))
    all_xs = list(range(last + 1))
    for run in runs:
        n = len(run.results)
        spread = "" if n == 1 else ", band: min–max"
        mean, lo, hi = _band(run.results, "curve", xs)
        (line,) = ax.plot(xs, mean, label=f"{run.policy} (mean of {n} seed{'s' * (n > 1)}{spread})")
        if n > 1:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        mean, lo, hi = _band(run.results, "frag_curve", all_xs)
        fx.plot(all_xs, mean, color=line.get_color(), label=run.policy)
        if n > 1:
            fx.fill_between(all_xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
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
    ax.set_title(setup.title([run.policy for run in runs]), fontsize=9)
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.set_xlim(PLOT_FROM_PCT, last)
    ax.set_ylim(70, 100.5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fx.axvline(100, color="grey", linestyle=":", linewidth=0.8)
    fx.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    fx.set_ylabel("fragmented GPU (% of capacity)")
    fx.set_title(
        "fragmentation (FGD's measure for the trace's typical pods): mean over seeds, "
        "band: min–max",
        fontsize=8,
    )
    fx.set_xlim(0, last)
    fx.set_ylim(bottom=0)
    fx.grid(alpha=0.3)
    fx.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig
