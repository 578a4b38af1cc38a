"""`serve` and `simulate` rank the same cluster dump alike (docs/design.md, Architecture).

One dump with variety (H100/A100/T4 nodes from the `mpsched.io/gpus` annotation and from GPU
Feature Discovery labels, different CPU; pods asking threads and memory, memory only, units,
whole GPUs, two MPS clients, with sidecars, init containers and overhead, CPU only, CPU in
fractions of a millicore) goes through both:

- `serve`: the extender over the embedded cluster. kube-scheduler's own NodeResourcesFit
  (CPU and memory requests against allocatable, by Kubernetes' rounding) chooses the
  candidates; the extender's filter and scores rank them; the pod is then bound;
- `simulate --cluster`: `read_cluster` and the replay engine's scores on its cluster state.

Pod by pod, in dump order, both must find the same nodes feasible and the same best-scored
nodes; the engine then places the pod (ties by node order) and the extender binds it to that
node, and both must book the same GPUs and budgets, so that every later pod is ranked on a
cluster both see alike, GPUs shared and memory taken included.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.codec import INVENTORY_KEY
from extender.packing.objects import pod_requests, read_node
from extender.packing.policies import make_policy, typical_workload
from extender.service import ExtenderService, normalise
from extender.simulate.dump import read_cluster
from extender.simulate.engine import Engine
from extender.simulate.replay import cluster_node_types
from extender.simulate.types import SimPod

Json = dict[str, Any]


def _annotated(name: str, model: str, memory_mib: int, cc: str, gpus: int, cpu: str) -> Json:
    inventory = [
        {
            "index": i,
            "uuid": f"GPU-{name}-{i}",
            "model": model,
            "memoryMiB": memory_mib,
            "computeCapability": cc,
            "units": 4,
            "mps": "ready",
        }
        for i in range(gpus)
    ]
    return {
        "kind": "Node",
        "metadata": {"name": name, "annotations": {INVENTORY_KEY: json.dumps(inventory)}},
        "status": {"allocatable": {"cpu": cpu, "memory": "256Gi"}},
    }


def _gfd(name: str, gpus: int, cpu: str, memory: str = "64Gi") -> Json:
    labels = {
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "15360",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.compute.major": "7",
        "nvidia.com/gpu.compute.minor": "5",
        "nvidia.com/mps.capable": "true",
    }
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }


def _container(name: str, limits: Json, requests: Json | None = None, **extra: Any) -> Json:
    resources: Json = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "x", "resources": resources, **extra}


def _pod(name: str, containers: Sequence[Json], **spec: Any) -> Json:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"containers": list(containers), **spec},
        "status": {"phase": "Pending"},
    }


def _ask(name: str, cpu: str = "1", **mpsched: str) -> Json:
    limits = {"cpu": cpu, **{f"mpsched.io/{k}": v for k, v in mpsched.items()}}
    return _pod(name, [_container("main", limits)])


def _dump() -> list[Json]:
    nodes = [
        _annotated("h100", "H100", 81559, "9.0", 2, "32"),
        _annotated("a100", "A100", 40960, "8.0", 4, "64"),
        _annotated("a100-small", "A100", 40960, "8.0", 2, "6"),
        _gfd("t4", 2, "16"),
        _gfd("t4-tight", 1, "1500m"),
    ]
    sidecar = _container("proxy", {"cpu": "2"}, restartPolicy="Always")
    pods = [
        # CPU by Kubernetes' rule: a request of 1500.5m rounds up to 1501m, which "t4-tight"
        # (1500m) lacks.
        _pod(
            "fraction",
            [_container("main", {"cpu": "2", "mpsched.io/threads": "10"}, {"cpu": "1500.5m"})],
        ),
        # Memory only: its thread share is its demand on each node's GPU (8 % of an H100,
        # 16 % of an A100, 43 % of a T4), not on the cluster's largest one.
        _ask("mem-only", memory="6Gi"),
        # Few threads, much memory: the GPU it lands on has threads left but little memory for
        # them; both sides must read its free share alike.
        _ask("mem-heavy", threads="5", memory="30Gi"),
        _ask("threads-mem", cpu="2", threads="30", memory="12Gi"),
        _ask("units", cpu="3", units="2"),
        _ask("whole", cpu="4", gpus="1"),
        _ask("clients2", threads="20", clients="2"),
        # A sidecar runs beside the app: 2 + 1 CPUs, more than "a100-small" has left by then.
        _pod(
            "sidecar",
            [_container("main", {"cpu": "1", "mpsched.io/threads": "25"})],
            initContainers=[sidecar],
        ),
        # An init container runs alone first; overhead comes on top.
        _pod(
            "init-overhead",
            [_container("main", {"cpu": "1", "mpsched.io/memory": "4Gi"})],
            initContainers=[_container("setup", {"cpu": "3"})],
            overhead={"cpu": "500m"},
        ),
        # Requests given, limits larger: the request counts.
        _pod(
            "requested",
            [_container("main", {"cpu": "8", "mpsched.io/threads": "40"}, {"cpu": "1"})],
        ),
        _ask("cpu-only", cpu="4"),
        _ask("mem-big", cpu="1", memory="10Gi"),
        _ask("threads-mem-2", cpu="1", threads="15", memory="9Gi"),
        _ask("whole2", cpu="2", gpus="2"),
        _ask("small-share", threads="10"),
        _ask("small-share-2", threads="20"),
        _ask("full-share", cpu="2", threads="100"),
        _ask("mem-only-2", memory="3Gi"),
        _ask("cpu-only-2", cpu="2"),
    ]
    return [*nodes, *pods]


def _candidates(
    pod: Json, nodes: Sequence[Json], used: dict[str, tuple[int, int]], config: Config
) -> list[str]:
    """kube-scheduler's NodeResourcesFit: CPU and memory requests within what is left."""
    want = pod_requests(pod["spec"])
    out = []
    for node in nodes:
        reading = read_node(node, config.budgets, config.node_selection())
        assert reading is not None
        cpu, memory = used.get(reading.name, (0, 0))
        if reading.cpu_milli is not None and reading.cpu_milli - cpu < want.cpu_milli:
            continue
        if reading.memory_mib is not None and reading.memory_mib - memory < want.memory_mib:
            continue
        out.append(reading.name)
    return out


def _best(names: Sequence[str], scores: Sequence[int]) -> set[str]:
    top = max(scores, default=None)
    return {n for n, s in zip(names, scores, strict=True) if s == top}


@pytest.mark.parametrize("policy", ["fgd", "bestfit", "default"])
async def test_serve_and_simulate_rank_a_dump_alike(policy: str, tmp_path: Path) -> None:
    items = _dump()
    defaults = Config.default()
    config = replace(defaults, policy=replace(defaults.policy, name=policy))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    cluster = read_cluster(path, config.budgets)
    workload = typical_workload(
        (p.shape for p in cluster.pods), coverage=config.policy.workload_coverage
    )
    types = cluster_node_types(cluster.nodes)
    engine = Engine(
        cluster.nodes,
        make_policy(policy, workload=workload, settings=config.policy, types=types),
        config.budgets,
        list(range(len(cluster.nodes))),
    )
    service = ExtenderService(
        cluster=EmbeddedCluster.from_objects(items), config=config, workload_refresh_s=3600.0
    )
    await service.start()
    # The same node types (the default policy weighs task types by them) on both sides.
    assert service.state.types == types
    assert len(types) == 5
    # The same typical-pod workload on both sides: how each learns it is not under test here.
    service.state.evaluator.set_policy(
        make_policy(policy, workload=workload, settings=config.policy, types=types)
    )
    nodes = [o for o in items if o["kind"] == "Node"]
    sim_pods: dict[str, SimPod] = {p.request.name: p for p in cluster.pods}
    used: dict[str, tuple[int, int]] = {}
    try:
        for pod in (o for o in items if o["kind"] == "Pod"):
            name = pod["metadata"]["name"]
            sim = sim_pods[name]
            service.state.evaluator.refresh()
            for i, node_name in enumerate(engine.names):
                seen = service.state.evaluator.node_state(node_name)
                assert seen == engine.view(i), f"before {name}: views of {node_name} differ"
            candidates = _candidates(pod, nodes, used, config)
            passed = service.filter(pod, candidates).passed
            serve_best = _best(passed, service.scores(pod, passed))
            raw = engine.scores(sim)
            fit = [(engine.names[i], s) for i, s in enumerate(raw) if s is not None]
            sim_best = _best([n for n, _ in fit], normalise([s for _, s in fit]))
            assert {n for n, _ in fit} == set(passed), f"{name}: feasible nodes differ"
            assert sim_best == serve_best, f"{name}: best nodes differ"
            placed = engine.place(sim)
            if placed is None:
                continue
            node = engine.names[placed[0]]
            assert node in serve_best
            await service.bind(name=name, namespace="ml", uid=f"uid-{name}", node=node)
            ours = service.state.ledger.allocation(f"uid-{name}")
            theirs = engine.ledger.allocation(f"uid-{name}")
            if theirs is None:  # CPU only
                assert ours is None
            else:
                assert ours is not None
                booked = (ours.gpus, ours.threads, ours.memory_mib, ours.clients)
                assert booked == (theirs.gpus, theirs.threads, theirs.memory_mib, theirs.clients)
            want = pod_requests(pod["spec"])
            cpu, memory = used.get(node, (0, 0))
            used[node] = (cpu + want.cpu_milli, memory + want.memory_mib)
            for _ in range(5):  # let the service's watch apply the bind
                await asyncio.sleep(0)
    finally:
        await service.close()
