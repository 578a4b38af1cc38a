"""A workload in time: when each pod arrives and how long it runs once started, read from the
openb pod CSV's `creation_time` and `deletion_time`, or drawn (arrivals at a rate, lifetimes
from a distribution) for a trace without times; the load factor; and the lower bound on GPUs.

Times are seconds. A pod's lifetime is `deletion_time - creation_time` as the trace records it:
a pod that waits in the replay starts later and still runs that long. `--load K` divides every
arrival time by K and keeps lifetimes, so K times as many pods are alive at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.packing.policies import WHOLE
from extender.simulate.trace import Row, rows
from extender.simulate.types import SimNode, SimPod, TraceError

#: Lifetime distributions `draw_times` knows.
DISTRIBUTIONS = ("exp", "fixed", "lognormal")


@dataclass(frozen=True, slots=True)
class TimedPod:
    """One pod of the workload: arrival (s from the start), lifetime once started (s)."""

    pod: SimPod
    arrival: float
    lifetime: float


@dataclass(frozen=True, slots=True)
class Synthetic:
    """Arrivals and lifetimes for a trace without times: Poisson arrivals at `rate` pods per
    second; lifetimes of mean `mean_lifetime` s, exponential, fixed, or lognormal (sigma 1)."""

    rate: float
    mean_lifetime: float
    distribution: str = "exp"


def read_times(path: Path) -> dict[str, tuple[float, float]] | None:
    """name → (creation, deletion) from a pod CSV, or None where the file has no times (no
    time columns, or both cells empty on every row). A row without times in a file with them,
    or a deletion before its creation, is an error."""
    times: dict[str, tuple[float, float]] = {}
    untimed: int | None = None
    for row in rows(path, ("name",)):
        if "creation_time" not in row.index or "deletion_time" not in row.index:
            return None
        created, deleted = row.text("creation_time"), row.text("deletion_time")
        if not created and not deleted and not times:
            untimed = row.line if untimed is None else untimed
            continue
        if untimed is not None:
            raise TraceError(f"{row.where('creation_time')}: line {untimed} has no times")
        start = _seconds(row, "creation_time")
        end = _seconds(row, "deletion_time")
        if end < start:
            raise TraceError(
                f"{row.where('deletion_time')}: {end:g} is before creation_time {start:g}"
            )
        times[row.text("name")] = (start, end)
    return times or None


def _seconds(row: Row, column: str) -> float:
    text = row.text(column)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{row.where(column)}: {text!r} is not a time in seconds (>= 0)")
    return value


def from_trace(pods: Sequence[SimPod], times: dict[str, tuple[float, float]]) -> list[TimedPod]:
    """The pods with their recorded times (every pod must have them)."""
    return [TimedPod(pod, start, end - start) for pod in pods for start, end in [times[pod.name]]]


def draw_times(pods: Sequence[SimPod], synthetic: Synthetic, seed: int) -> list[TimedPod]:
    """The pods in file order, arriving as a Poisson process, lifetimes drawn (seeded)."""
    if not synthetic.rate > 0 or not synthetic.mean_lifetime > 0:
        raise ValueError("arrival rate and mean lifetime must be positive")
    rng = random.Random(seed)
    now = 0.0
    out = []
    for pod in pods:
        out.append(TimedPod(pod, now, _lifetime(rng, synthetic)))
        now += rng.expovariate(synthetic.rate)
    return out


def _lifetime(rng: random.Random, synthetic: Synthetic) -> float:
    mean = synthetic.mean_lifetime
    if synthetic.distribution == "fixed":
        return mean
    if synthetic.distribution == "lognormal":
        # sigma 1: mean = exp(mu + 1/2).
        return rng.lognormvariate(math.log(mean) - 0.5, 1.0)
    if synthetic.distribution == "exp":
        return rng.expovariate(1.0 / mean)
    raise ValueError(f"unknown distribution {synthetic.distribution!r}; known: {DISTRIBUTIONS}")


def with_load(pods: Iterable[TimedPod], load: float) -> list[TimedPod]:
    """Arrival times divided by `load`, lifetimes kept; sorted by arrival, then name."""
    if not load > 0:
        raise ValueError(f"load must be positive, got {load}")
    out = [TimedPod(t.pod, t.arrival / load, t.lifetime) for t in pods]
    out.sort(key=lambda t: (t.arrival, t.pod.name))
    return out


@dataclass(frozen=True, slots=True)
class LowerBound:
    """No cluster with fewer GPUs hosts the workload without a pod waiting: `gpus`, the largest
    of the peak concurrent GPU demand (rounded up) and the sum over GPU models of the peak
    demand of the pods that may run on that model only (each rounded up)."""

    gpus: int
    peak_demand_gpus: float
    peak_at: float
    per_model: dict[str, int]


def host_models(pod: SimPod, pool: Sequence[SimNode]) -> frozenset[str]:
    """The GPU models of the pool's nodes that could take the pod were they empty (GPU count,
    model, CPU, memory); empty for a CPU-only pod."""
    shape = pod.shape
    if shape.gpus == 0:
        return frozenset()
    return frozenset(
        n.model
        for n in pool
        if len(n.inventory.gpus) >= shape.gpus
        and shape.allows(n.model)
        and n.cpu_milli >= pod.cpu_milli
        and n.memory_mib >= pod.memory_mib
    )


def lower_bound(pods: Sequence[TimedPod], pool: Sequence[SimNode] = ()) -> LowerBound:
    """The peak of Σ demand over pods alive at once, if each started at its arrival.

    A pod is alive on [arrival, arrival + lifetime); at one instant departures come before
    arrivals (the order the replay takes them in). Demand is the share asked (a 2-GPU pod 2).
    A pod pins a model when its `gpu_spec` names one, or when only nodes of one model in
    `pool` (of several models) could take it."""
    total = _peak((t.arrival, t.lifetime, t.pod.shape.gpu_demand) for t in pods)
    hosts: dict[tuple[object, ...], frozenset[str]] = {}
    pinned: dict[str, list[TimedPod]] = {}
    # In a pool of one model every GPU pod is "pinned" to it: nothing to add to the total.
    pool = pool if len({n.model for n in pool if n.inventory.gpus}) > 1 else ()
    for t in pods:
        pod = t.pod
        if not pod.shape.gpus:
            continue
        if pool:
            key = (pod.shape, pod.cpu_milli, pod.memory_mib)
            if key not in hosts:
                hosts[key] = host_models(pod, pool)
            models = hosts[key]
        else:
            models = pod.shape.models
        if len(models) == 1:
            pinned.setdefault(next(iter(models)), []).append(t)
    per_model = {}
    for model in sorted(pinned):
        peak = _peak((t.arrival, t.lifetime, t.pod.shape.gpu_demand) for t in pinned[model])
        per_model[model] = math.ceil(peak[0] / WHOLE - 1e-9)
    gpus = max(math.ceil(total[0] / WHOLE - 1e-9), sum(per_model.values()))
    return LowerBound(gpus, total[0] / WHOLE, total[1], per_model)


def _peak(items: Iterable[tuple[float, float, int]]) -> tuple[int, float]:
    events: list[tuple[float, int, int]] = []
    for arrival, lifetime, demand in items:
        if demand:
            events.append((arrival, 1, demand))
            # A pod of no lifetime still holds its share for an instant: it leaves after it came.
            events.append((arrival + lifetime, 0 if lifetime > 0 else 2, -demand))
    events.sort()
    now = peak = 0
    at = 0.0
    for when, _, delta in events:
        now += delta
        if now > peak:
            peak, at = now, when
    return peak, at
