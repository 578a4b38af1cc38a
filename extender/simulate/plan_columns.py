"""The figures a capacity plan reports and what each means: one text for `mpsched plan --help`,
the terminal table, the JSON document and the HTML report (no numpy here: `--help` reads it)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

#: Every figure a plan reports, and what it means.
COLUMNS: Mapping[str, str] = {
    "gpus_needed": "GPUs of the smallest cluster the search found that runs every pod with "
    "none waiting longer than --max-wait (per seed; mean, min and max over the seeds)",
    "nodes_needed": "nodes of that cluster",
    "lower_bound_gpus": "no cluster with fewer GPUs runs the workload without a pod waiting: "
    "the peak of the GPU share asked by the pods alive at once (each starting on arrival), "
    "rounded up, or the sum over GPU models of that peak for the pods only one model can "
    "host, if larger",
    "bound_cluster_gpus": "GPUs of the smallest cluster of the shape searched (the pool "
    "scaled, or nodes of one type) that meets the lower bound, in total and per pinned model: "
    "where the search starts",
    "vs_bound": "gpus_needed over lower_bound_gpus, minus 1 (0 % is the bound itself)",
    "saved": "GPUs an mpsched policy needs fewer than an alternative (whole, equal:N), "
    "paired seed by seed (mean, min and max); negative where it needs more",
    "placed": "pods placed (all of them, where the cluster hosts the workload)",
    "never_placed": "pods still waiting when the workload ends (or when the search stopped)",
    "waited": "pods that waited at all before being placed",
    "wait_p50 / wait_p95 / wait_max": "seconds from arrival to placement over the placed "
    "pods (a pod placed on arrival waited 0): median, 95th percentile (nearest rank), largest",
    "demand_placed": "GPU demand placed: the GPU share the running pods asked for, in GPUs, "
    "as the trace states it (a share a strategy rounds up counts as asked); peak and mean "
    "over time",
    "booked": "GPU booked: the running pods' GPUs as the strategy books them (a share taken "
    "whole counts 1); peak",
    "busy_gpus": "GPUs holding at least one pod; peak and mean over time",
    "waiting": "pods waiting at once; peak",
    "fragmentation": "the FGD paper's fragmentation measure (idle GPU share the trace's "
    "typical pods could not use, summed over nodes), in GPUs; peak",
    "paper_alloc_pct": "for comparison with the FGD paper only: its allocation ratio, GPU "
    "booked over the cluster's GPUs, at the peak (it counts a rounded-up share as used, so "
    "it rewards rounding up)",
}


def column_help() -> str:
    """The definitions as the epilog of `--help`."""
    return "\n".join(
        textwrap.fill(f"{name}: {text}", width=92, initial_indent="  ", subsequent_indent="    ")
        for name, text in COLUMNS.items()
    )
