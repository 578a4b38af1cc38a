"""The realistic mode's traffic: each pod's scheduling cycle over kube-scheduler's rotating
windows, its bind handed to a worker that runs while the next pod's cycle does, the servers
alternating in blocks of pods; and what each server's run adds up to.

What the classic mode leaves out, each of which makes it easier than production:
  - its pending pods are in the cluster dump under the very resourceVersion the filter bodies
    carry, so serve parsed every one of them (and warmed every shape) before the clock started:
    a filter never pays for parsing its pod;
  - its pods come in ten shapes: the result arrays of every shape are warm for every node;
  - its candidate lists are random samples, never kube-scheduler's rotating windows;
  - its binds all run after every filter, so no filter ever sees a node changed by a bind
    (every node state is one the caches hold), and binds never overlap a filter;
  - its pods are ~2.3 KB, a production pod with a ReplicaSet owner, env and volumes ~3.3 KB.
The realistic mode drives serve as kube-scheduler drives an extender in a busy cluster.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.http.wire import field as wire_field
from extender_bench.kube_scheduler import Scheduler, zone_interleaved
from extender_bench.measuring import Client, Target, binding_body, pct, post_filter
from extender_bench.processes import cpu_seconds

Json = dict[str, Any]


BIND_WORKERS = 4
#: Pods each server schedules before the measured ones (connections, first-call caches).
REAL_WARMUP = 20


@dataclass
class RealResult:
    pods: int = 0
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    #: Wall-clock seconds of the scheduling loop (filter, prioritize, pick, bind handed off),
    #: binds of the block's last pods waited for: what a serial scheduler's rate is made of.
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    placed: int = 0
    unschedulable: int = 0
    bind_ok: int = 0
    bind_refused: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def stats(v: list[float]) -> dict[str, float]:
            return {"p50": round(pct(v, 0.5), 3), "p99": round(pct(v, 0.99), 3), "n": len(v)}

        return {
            "pods": self.pods,
            "filter_ms": stats(self.filter_ms),
            "prioritize_ms": stats(self.prioritize_ms),
            "pair_ms": stats(self.pair_ms),
            "bind_ms": stats(self.bind_ms),
            "pods_per_s": round(self.pods / self.wall_s, 1) if self.wall_s else None,
            "pods_per_s_in_calls": round(self.pods / (sum(self.pair_ms) / 1000), 1)
            if self.pair_ms
            else None,
            "server_cpu_ms_per_pod": round(self.server_cpu_s * 1000 / self.pods, 3)
            if self.pods
            else None,
            "placed": self.placed,
            "unschedulable": self.unschedulable,
            "bind_ok": self.bind_ok,
            "bind_refused": self.bind_refused,
            "sample_errors": self.errors[:3],
        }


class Binder:
    """kube-scheduler's binding cycles: each chosen pod's bind is handed to a worker thread and
    runs while the next pod's scheduling cycle does (its own keep-alive connections)."""

    def __init__(self, port: int, prefix: str, workers: int = BIND_WORKERS) -> None:
        import queue
        import threading

        self._queue: queue.Queue[tuple[bytes, RealResult | None] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(Client(port, prefix),), daemon=True)
            for _ in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, pod: Json, node: str, result: RealResult | None) -> None:
        body = binding_body(pod, node)
        self._queue.put((body, result))

    def drain(self) -> None:
        self._queue.join()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)

    def _work(self, client: Client) -> None:
        try:
            while (item := self._queue.get()) is not None:
                body, result = item
                try:
                    ms, raw = client.post("bind", body)
                    error = wire_field(orjson.loads(raw), "Error")
                except (RuntimeError, OSError) as exc:
                    ms, error = math.nan, str(exc)
                if result is not None:
                    with self._lock:
                        if not math.isnan(ms):
                            result.bind_ms.append(ms)
                        if error:
                            result.bind_refused += 1
                            result.errors.append(str(error))
                        else:
                            result.bind_ok += 1
                self._queue.task_done()
            self._queue.task_done()
        finally:
            client.close()


def schedule_real(
    client: Client,
    binder: Binder,
    sched: Scheduler,
    pod: Json,
    rng: random.Random,
    result: RealResult | None,
    *,
    score_pause_s: float = 0.0,
) -> None:
    """One scheduling cycle: the window, filter, prioritize if more than one node is left, the
    highest score with ties broken at random (selectHost), then the bind handed off.
    `score_pause_s`: the scheduler's own PreScore and Score plugins, which run between the
    extender's filter and its prioritize (kube-scheduler's order of calls); counted in no
    latency."""
    names = sched.window(pod)
    f_ms, feasible = post_filter(client, pod, names)
    p_ms = 0.0
    chosen = feasible[0] if feasible else None
    if len(feasible) > 1:
        if score_pause_s > 0:
            time.sleep(score_pause_s)
        p_ms, raw = client.post(
            "prioritize", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": feasible})
        )
        best, ties = -1, []
        for h in orjson.loads(raw):
            score = int(wire_field(h, "Score"))
            if score > best:
                best, ties = score, [wire_field(h, "Host")]
            elif score == best:
                ties.append(wire_field(h, "Host"))
        chosen = rng.choice(ties)
    if result is not None:
        result.filter_ms.append(f_ms)
        if len(feasible) > 1:
            result.prioritize_ms.append(p_ms)
        result.pair_ms.append(f_ms + p_ms)
        result.pods += 1
        if chosen is None:
            result.unschedulable += 1
        else:
            result.placed += 1
    if chosen is not None:
        binder.submit(pod, chosen, result)


def measure_realistic(
    targets: Sequence[Target],
    nodes: list[Json],
    warmup: list[Json],
    pods: list[Json],
    candidates: int,
    seed: int,
    *,
    block: int,
    score_pause_s: float = 0.0,
) -> dict[str, dict[str, Any]]:
    """Every pod through every target, the targets alternating in blocks of `block` pods (in
    alternating order); a target's binds are waited for before the other's block starts."""
    order = zone_interleaved(nodes)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    results = {t.name: RealResult() for t in targets}
    runs = []
    for i, t in enumerate(targets):
        client = Client(t.port, t.prefix)
        binder = Binder(t.port, t.prefix)
        runs.append(
            (t, client, binder, Scheduler(order, labels, candidates), random.Random(seed + i))
        )
    try:
        for _, client, binder, sched, rng in runs:
            for pod in warmup:
                schedule_real(client, binder, sched, pod, rng, None, score_pause_s=score_pause_s)
            binder.drain()
        for i, start in enumerate(range(0, len(pods), block)):
            for t, client, binder, sched, rng in runs if i % 2 == 0 else reversed(runs):
                result = results[t.name]
                cpu0 = cpu_seconds(t.pid) if t.pid else None
                t0 = time.perf_counter()
                for pod in pods[start : start + block]:
                    schedule_real(
                        client, binder, sched, pod, rng, result, score_pause_s=score_pause_s
                    )
                binder.drain()
                result.wall_s += time.perf_counter() - t0
                cpu1 = cpu_seconds(t.pid) if t.pid else None
                if cpu0 is not None and cpu1 is not None:
                    result.server_cpu_s += cpu1 - cpu0
    finally:
        for _, client, binder, _, _ in runs:
            binder.close()
            client.close()
    return {name: r.summary() for name, r in results.items()}
