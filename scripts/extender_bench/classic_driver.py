"""The classic mode's traffic (issue #3's bench): serial filter+prioritize pairs over random
candidate samples, the servers alternating in blocks of pods, then pods of never-seen shapes,
then concurrent binds of every pod placed; and what each server's phases add up to."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from extender.http.wire import field as wire_field
from extender_bench.measuring import Client, Target, binding_body, pct, post_filter
from extender_bench.processes import cpu_seconds

Json = dict[str, Any]


BIND_CONCURRENCY = 16
#: Pods of never-seen shapes sent after the serial phases (reported, no target).
NEW_SHAPES = 20
#: Pairs sent before measuring: connection set-up and first-call caches are not what a
#: scheduler that has been running for hours sees.
WARMUP_PAIRS = 20


@dataclass
class PhaseResult:
    candidates: int
    pods: int
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    #: CPU seconds the server process used over the measured pods (user + system).
    server_cpu_s: float | None = None
    feasible: int = 0
    unschedulable: int = 0
    picks: list[tuple[Json, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def stats(v: list[float]) -> dict[str, float]:
            return {"p50": round(pct(v, 0.5), 3), "p99": round(pct(v, 0.99), 3), "n": len(v)}

        return {
            "candidates": self.candidates,
            "pods": self.pods,
            "filter_ms": stats(self.filter_ms),
            "prioritize_ms": stats(self.prioritize_ms),
            "pair_ms": stats(self.pair_ms),
            # What the extender caps a serial scheduler at: pods over
            # the time spent inside filter+prioritize calls. The harness's own wall-clock rate
            # also pays for Python-side JSON encoding that kube-scheduler does in Go.
            "pods_per_s": round(self.pods / (sum(self.pair_ms) / 1000), 1)
            if self.pair_ms
            else None,
            "harness_pods_per_s": round(self.pods / self.wall_s, 1) if self.wall_s else None,
            # The server's own CPU per pod, filter and prioritize together: on a shared, noisy
            # machine the steadiest figure of what a server costs (latency adds the wake-ups
            # and the loopback, which both servers pay alike).
            "server_cpu_ms_per_pod": round(self.server_cpu_s * 1000 / self.pods, 3)
            if self.server_cpu_s is not None and self.pods
            else None,
            "placed": self.feasible,
            "unschedulable": self.unschedulable,
        }


def schedule_one(
    client: Client, pod: Json, names: list[str], result: PhaseResult | None
) -> str | None:
    """One scheduling cycle as kube-scheduler runs it against a nodeCacheCapable extender:
    filter; prioritize only if more than one node is left; highest score, ties to the first
    name. Returns the chosen node (None: unschedulable)."""
    f_ms, feasible = post_filter(client, pod, names)
    p_ms = 0.0
    chosen: str | None = feasible[0] if feasible else None
    if len(feasible) > 1:
        p_ms, raw = client.post(
            "prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": feasible})
        )
        scores = {wire_field(h, "Host"): int(wire_field(h, "Score")) for h in orjson.loads(raw)}
        chosen = min(feasible, key=lambda n: (-scores.get(n, 0), n))
    if result is not None:
        result.filter_ms.append(f_ms)
        if len(feasible) > 1:
            result.prioritize_ms.append(p_ms)
        result.pair_ms.append(f_ms + p_ms)
        if chosen is None:
            result.unschedulable += 1
        else:
            result.feasible += 1
            result.picks.append((pod, chosen))
    return chosen


def run_phase(
    targets: Sequence[Target],
    pods: list[Json],
    node_names: list[str],
    candidates: int,
    seed: int,
    *,
    block: int = 1,
) -> dict[str, PhaseResult]:
    """Every pod's cycle against every target, interleaved in blocks of `block` pods (in
    alternating order), so that load from elsewhere on a shared machine falls on all alike."""
    rng = random.Random(seed)
    results = {t.name: PhaseResult(candidates, len(pods)) for t in targets}
    clients = [Client(t.port, t.prefix) for t in targets]
    try:
        for pod in pods[:WARMUP_PAIRS]:
            names = rng.sample(node_names, min(candidates, len(node_names)))
            for client in clients:
                schedule_one(client, pod, names, None)
        # Candidate lists are drawn before the clock starts: the scheduler's own filtering is
        # not what is measured here.
        lists = [
            node_names if candidates >= len(node_names) else rng.sample(node_names, candidates)
            for _ in pods
        ]
        cpu_before = {t.name: cpu_seconds(t.pid) if t.pid else None for t in targets}
        work = list(zip(pods, lists, strict=True))
        order = list(zip(targets, clients, strict=True))
        for i, start in enumerate(range(0, len(work), block)):
            for target, client in order if i % 2 == 0 else reversed(order):
                result = results[target.name]
                for pod, names in work[start : start + block]:
                    t0 = time.perf_counter()
                    schedule_one(client, pod, names, result)
                    result.wall_s += time.perf_counter() - t0
        for t in targets:
            before, after = cpu_before[t.name], cpu_seconds(t.pid) if t.pid else None
            if before is not None and after is not None:
                results[t.name].server_cpu_s = after - before
    finally:
        for client in clients:
            client.close()
    return results


def run_new_shapes(
    target: Target, pods: list[Json], node_names: list[str], candidates: int, seed: int
) -> PhaseResult:
    """One cycle per pod, no warm-up: each pod's shape is new to the server."""
    rng = random.Random(seed)
    result = PhaseResult(candidates, len(pods))
    client = Client(target.port, target.prefix)
    try:
        for pod in pods:
            names = rng.sample(node_names, min(candidates, len(node_names)))
            t0 = time.perf_counter()
            schedule_one(client, pod, names, result)
            result.wall_s += time.perf_counter() - t0
    finally:
        client.close()
    return result


@dataclass
class BindResult:
    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    refused: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "binds": len(self.latencies_ms),
            "ok": self.ok,
            "refused": self.refused,
            "concurrency": BIND_CONCURRENCY,
            "p50_ms": round(pct(self.latencies_ms, 0.5), 3),
            "p99_ms": round(pct(self.latencies_ms, 0.99), 3),
            "binds_per_s": round(len(self.latencies_ms) / self.wall_s, 1) if self.wall_s else None,
            "sample_errors": self.errors[:3],
        }


async def bind_all(port: int, prefix: str, picks: list[tuple[Json, str]]) -> BindResult:
    """Bind every pod to its picked node, BIND_CONCURRENCY in flight, as the scheduler's
    per-pod binding goroutines do. A refusal (the node filled up since filter) is counted."""
    result = BindResult()
    sem = asyncio.Semaphore(BIND_CONCURRENCY)
    url = f"http://127.0.0.1:{port}{prefix.rstrip('/')}/bind"
    connector = aiohttp.TCPConnector(limit=BIND_CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(pod: Json, node: str) -> None:
            body = binding_body(pod, node)
            async with sem:
                t0 = time.perf_counter()
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    raw = await resp.read()
                result.latencies_ms.append((time.perf_counter() - t0) * 1000)
            error = wire_field(orjson.loads(raw), "Error") if resp.status == 200 else raw[:200]
            if error:
                result.refused += 1
                result.errors.append(str(error))
            else:
                result.ok += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p, n) for p, n in picks))
        result.wall_s = time.perf_counter() - t0
    return result


def measure(
    targets: Sequence[Target],
    node_names: list[str],
    pods_a: list[Json],
    pods_b: list[Json],
    candidates: int,
    seed: int,
    *,
    block: int = 1,
    new_shapes: Sequence[Json] = (),
) -> dict[str, dict[str, Any]]:
    """Both serial phases, the pods of never-seen shapes, then, target by target, the binds of
    every pod that found a node."""
    adaptive = run_phase(targets, pods_a, node_names, candidates, seed, block=block)
    everything = run_phase(targets, pods_b, node_names, len(node_names), seed + 1, block=block)
    out = {}
    for t in targets:
        fresh = run_new_shapes(t, list(new_shapes), node_names, candidates, seed + 2)
        picks = adaptive[t.name].picks + everything[t.name].picks
        binds = asyncio.run(bind_all(t.port, t.prefix, picks))
        out[t.name] = {
            "adaptive": adaptive[t.name].summary(),
            "all": everything[t.name].summary(),
            "new_shapes": fresh.summary(),
            "bind": binds.summary(),
        }
    return out
