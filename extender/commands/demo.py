"""`mpsched demo`: the real extender on the built-in sample cluster, driven through its HTTP API
exactly as kube-scheduler drives it, then the resulting allocation table.

Owns the demo's pod stream and its report. It starts the real service (`make_app` on an
embedded cluster: the sample's nodes and running pods plus the demo's pending pods, as a
`kubectl get nodes,pods -A -o json` dump would hold them) on a free loopback port, then, one pod
at a time: POST /filter with every node name (`nodeCacheCapable: true`), POST /prioritize when
more than one node is left, pick the highest score (ties: first by name), POST /bind. Like
kube-scheduler's in-tree NodeAffinity filter, it drops nodes whose labels do not match a pod's
`nodeSelector` before calling the extender: the extender never sees them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from extender import logs
from extender.cluster.embedded import EmbeddedCluster
from extender.cluster.loader import parse_document
from extender.commands.demo_pods import SPECIAL, PodTemplate, demo_templates, make_pod
from extender.commands.status_table import format_status
from extender.config import Config
from extender.http import wire
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.service import ExtenderService

#: Where the sample cluster lives inside the package (package data `samples/*`).
SAMPLE_CLUSTER = "samples/cluster.yaml"
DEFAULT_PODS = 32
Json = dict[str, Any]


def matches_selector(node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """kube-scheduler's NodeAffinity filter for `nodeSelector` (exact label match)."""
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


# -- driving the extender ----------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to one pod."""

    pod: Json
    template: PodTemplate
    candidates: list[str]
    feasible: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
    node: str | None = None
    bind_error: str = ""

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    @property
    def placed(self) -> bool:
        return self.node is not None and not self.bind_error


class DemoError(Exception):
    """The extender failed in a way kube-scheduler would treat as an error, not a misfit."""


async def _post(session: aiohttp.ClientSession, url: str, body: Json) -> Any:
    headers = {"Content-Type": "application/json"}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise DemoError(f"POST {url} answered HTTP {resp.status}: {raw[:200]!r}")
    return orjson.loads(raw)


async def schedule(
    session: aiohttp.ClientSession, base: str, pod: Json, template: PodTemplate, names: list[str]
) -> Outcome:
    """One scheduling cycle: filter → prioritize (if >1 node left) → highest score → bind."""
    out = Outcome(pod, template, names)
    reply = await _post(session, f"{base}/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    if wire.field(reply, "Error"):
        raise DemoError(f"filter of {out.key} returned Error: {wire.field(reply, 'Error')}")
    out.feasible = list(wire.field(reply, "NodeNames") or [])
    out.failed = dict(wire.field(reply, "FailedNodes") or {})
    out.unresolvable = dict(wire.field(reply, "FailedAndUnresolvableNodes") or {})
    if not out.feasible:
        return out
    if len(out.feasible) > 1:
        body = {"Pod": pod, "Nodes": None, "NodeNames": out.feasible}
        ranked = await _post(session, f"{base}/prioritize", body)
        out.scores = {str(wire.field(h, "Host")): int(wire.field(h, "Score")) for h in ranked}
    out.node = min(out.feasible, key=lambda n: (-out.scores.get(n, 0), n))
    meta = pod["metadata"]
    bind = {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": out.node,
    }
    out.bind_error = str(wire.field(await _post(session, f"{base}/bind", bind), "Error") or "")
    return out


async def drive(
    base: str, pods: Sequence[tuple[Json, PodTemplate]], nodes: Sequence[Json]
) -> tuple[list[Outcome], Json]:
    """Schedule every pod in turn, then fetch /status."""
    outcomes = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for pod, template in pods:
            names = sorted(n["metadata"]["name"] for n in nodes if matches_selector(n, pod))
            outcomes.append(await schedule(session, base, pod, template, names))
        async with session.get(f"{base}/status") as resp:
            if resp.status != 200:
                raise DemoError(f"GET {base}/status answered HTTP {resp.status}")
            status = orjson.loads(await resp.read())
    return outcomes, status


# -- the report ----------------------------------------------------------------------------------


def placements(status: Mapping[str, Any]) -> dict[str, str]:
    """Pod uid (or "namespace/name" for a whole-GPU owner) → "node GPU i[,j]", from /status."""
    where: dict[str, tuple[str, list[str]]] = {}
    for node in status.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            holders = [p.get("uid") for p in gpu.get("pods") or []]
            if gpu.get("wholeOwner"):
                holders.append(gpu["wholeOwner"])
            for holder in holders:
                where.setdefault(holder, (node.get("name"), []))[1].append(str(gpu.get("index")))
    return {h: f"{node} GPU {','.join(indices)}" for h, (node, indices) in where.items()}


def _where(outcome: Outcome, placed_at: Mapping[str, str]) -> str:
    uid = outcome.pod["metadata"]["uid"]
    return placed_at.get(uid) or placed_at.get(outcome.key) or str(outcome.node)


def _reasons(outcome: Outcome) -> list[str]:
    """Per-node reasons, grouped: nodes that failed for the same reason share one line."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for unresolvable, failures in ((False, outcome.failed), (True, outcome.unresolvable)):
        for node, reason in failures.items():
            if unresolvable or node not in outcome.unresolvable:
                groups.setdefault((reason, unresolvable), []).append(node)
    lines = []
    for (reason, unresolvable), nodes in sorted(groups.items(), key=lambda g: sorted(g[1])):
        tag = " [unresolvable]" if unresolvable else ""
        lines.append(f"      {', '.join(sorted(nodes))}: {reason}{tag}")
    return lines


def render(outcomes: Sequence[Outcome], status: Mapping[str, Any], header: str) -> str:
    placed_at = placements(status)
    width = max((len(o.key) for o in outcomes), default=10)
    asks_width = max((len(o.template.asks) for o in outcomes), default=10)
    lines = [header, ""]
    for o in outcomes:
        if o.placed:
            detail = _where(o, placed_at)
            if o.scores:
                detail += f"  (score {o.scores.get(str(o.node), 0)}, {len(o.feasible)} nodes fit)"
        elif o.bind_error:
            detail = f"bind refused on {o.node}: {o.bind_error}"
        else:
            detail = "did not fit"
        lines.append(f"  {o.key:<{width}}  {o.template.asks:<{asks_width}}  -> {detail}")
    lines += ["", format_status(status).rstrip(), ""]
    unplaced = [o for o in outcomes if not o.placed]
    lines.append(f"{len(outcomes) - len(unplaced)} of {len(outcomes)} pods placed.")
    if unplaced:
        lines.append(f"Not placed ({len(unplaced)}), with the extender's reasons per node:")
        for o in unplaced:
            lines.append(f"  {o.key} ({o.template.asks}):")
            if o.bind_error:
                lines.append(f"      bind on {o.node} refused: {o.bind_error}")
            skipped = len(o.candidates) - len(o.failed.keys() | o.unresolvable.keys())
            lines += _reasons(o)
            if o.template.node_selector:
                selector = ", ".join(f"{k}={v}" for k, v in o.template.node_selector)
                n = len(o.candidates)
                lines.append(f"      (nodeSelector {selector}: {n} candidate{'s' * (n != 1)})")
            elif skipped > 0 and not o.bind_error:
                lines.append(f"      ({skipped} nodes dropped without a reason)")
    return "\n".join(lines) + "\n"


def report_json(outcomes: Sequence[Outcome], status: Mapping[str, Any]) -> Json:
    placed_at = placements(status)
    return {
        "pods": [
            {
                "namespace": o.pod["metadata"]["namespace"],
                "name": o.pod["metadata"]["name"],
                "uid": o.pod["metadata"]["uid"],
                "asks": o.template.asks,
                "candidates": o.candidates,
                "feasible": o.feasible,
                "failedNodes": o.failed,
                "failedAndUnresolvableNodes": o.unresolvable,
                "scores": o.scores,
                "node": o.node if o.placed else None,
                "placement": _where(o, placed_at) if o.placed else None,
                "bindError": o.bind_error,
            }
            for o in outcomes
        ],
        "placed": sum(o.placed for o in outcomes),
        "status": status,
    }


# -- running it ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed", type=int, default=1, help="orders and picks the sample pods (default 1)"
    )
    parser.add_argument(
        "--pods",
        type=int,
        default=DEFAULT_PODS,
        help=f"how many pods to schedule (default {DEFAULT_PODS}; the first {len(SPECIAL)} "
        "are one of each special kind, the rest everyday shares)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable report instead of text"
    )
    logs.add_level_argument(
        parser,
        help="the service's log level on stderr (default warning: the report is the output)",
    )


def sample_cluster_text() -> str:
    """The built-in sample cluster (package data)."""
    return resources.files("extender").joinpath(SAMPLE_CLUSTER).read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class DemoPlan:
    nodes: list[Json]
    cluster_items: list[Json]
    pods: list[tuple[Json, PodTemplate]]


def plan(count: int, seed: int) -> DemoPlan:
    """The sample cluster's objects plus the demo's pending pods (they exist in the cluster
    before they are scheduled, as pods do: bind refuses a pod the cluster does not hold)."""
    items = list(parse_document(sample_cluster_text(), source=SAMPLE_CLUSTER))
    rng = random.Random(seed)
    pods = [(make_pod(t, i, rng), t) for i, t in enumerate(demo_templates(count, seed), 1)]
    nodes = [i for i in items if i["kind"] == "Node"]
    return DemoPlan(nodes, items + [p for p, _ in pods], pods)


async def wait_ready(session: aiohttp.ClientSession, base: str, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            async with session.get(f"{base}/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if loop.time() > deadline:
            raise DemoError(f"the extender at {base} was not ready within {timeout_s:g}s")
        await asyncio.sleep(0.05)


async def run_demo(demo: DemoPlan) -> tuple[str, list[Outcome], Json]:
    """Start the real service in this process on a free loopback port, drive it, stop it.
    Returns the base URL it was served at, the outcomes and the final /status document."""
    cluster = EmbeddedCluster.from_objects(
        demo.cluster_items, description="the built-in sample cluster"
    )
    service = ExtenderService(cluster=cluster, config=Config.default())
    runner = web.AppRunner(make_app(service, HttpSettings()), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await wait_ready(session, base, 30)
        outcomes, status = await drive(base, demo.pods, demo.nodes)
    finally:
        await runner.cleanup()
        await cluster.close()
    return base, outcomes, status


def run(args: argparse.Namespace) -> int:
    if args.pods < 1:
        print("mpsched demo: --pods must be at least 1", file=sys.stderr)
        return 2
    # The service logs as `serve` would (the default configuration's `logging` format); its
    # info lines (ledger built, caches warmed) would only interleave with the report.
    logs.configure(Config.default().logging, level=args.log_level or "warning")
    demo = plan(args.pods, args.seed)
    try:
        base, outcomes, status = asyncio.run(run_demo(demo))
    except (DemoError, aiohttp.ClientError, OSError) as exc:
        print(f"mpsched demo: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(report_json(outcomes, status)).decode() + "\n")
        return 0
    header = (
        f"mpsched demo: the extender served at {base} on the built-in sample cluster "
        f"({len(demo.nodes)} nodes); {len(outcomes)} pods (seed {args.seed}), each through "
        "POST /filter, /prioritize (when more than one node fits), /bind"
    )
    sys.stdout.write(render(outcomes, status, header))
    return 0
