"""Issue 33 item 5: every pod manifest in docs/ (a Pod, or the pod template of a workload) runs
as documented. Each is sent through the webhook's /mutate over HTTP and its patch applied, then
admitted by the ValidatingAdmissionPolicy and Pod Security `baseline`, then scheduled onto the
built-in sample cluster (extender/samples/cluster.yaml, whose GPU nodes carry the taint
nvidia.com/gpu=present:NoSchedule): kube-scheduler's taint and node-selector filters, then
mpsched's filter, prioritize and bind on the embedded cluster."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.cluster.embedded import EmbeddedCluster
from extender.commands import demo
from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY
from extender.service import ExtenderService
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app
from tests.webhook.cel_policy import policy
from tests.webhook.pod_security import baseline_problems
from tests.webhook.reviews import Json, apply_patch, created, patch_of, review

Client = TestClient[web.Request, web.Application]
DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG = Config.default()
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def _manifests() -> dict[str, Json]:
    """Every pod manifest in a yaml block of docs/, by "file: name"."""
    found: dict[str, Json] = {}
    for path in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), flags=re.S):
            for doc in yaml.safe_load_all(block):
                if not isinstance(doc, dict):
                    continue
                if doc.get("kind") == "Pod":
                    pod = doc
                elif doc.get("kind") in WORKLOADS:
                    template = doc["spec"]["template"]
                    pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
                    pod["metadata"] = {
                        "name": doc["metadata"]["name"],
                        **template.get("metadata", {}),
                    }
                else:
                    continue
                found[f"{path.name}: {pod['metadata']['name']}"] = pod
    return found


MANIFESTS = _manifests()


def _tolerates(pod: Json, taint: Json) -> bool:
    """Kubernetes' ToleratesTaint: the effect matches (or is empty), the key matches (or is
    empty, with Exists), and Exists, or Equal with the taint's value."""
    for t in pod["spec"].get("tolerations") or ():
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if t.get("operator") == "Exists":
            return True
        if t.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _kube_scheduler_fits(pod: Json, node: Json) -> bool:
    """kube-scheduler's TaintToleration and NodeAffinity (nodeSelector) filters."""
    taints = [t for t in node["spec"].get("taints") or () if t["effect"] != "PreferNoSchedule"]
    if not all(_tolerates(pod, t) for t in taints):
        return False
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (pod["spec"].get("nodeSelector") or {}).items())


def test_the_docs_hold_pod_manifests() -> None:
    assert "requesting-gpu-shares.md: infer" in MANIFESTS


@pytest.mark.parametrize("name", MANIFESTS)
async def test_a_docs_manifest_is_admitted_and_scheduled(aiohttp_client: Any, name: str) -> None:
    manifest = MANIFESTS[name]
    client: Client = await aiohttp_client(make_app(AdmissionSettings.from_config(CONFIG)))
    async with client.post("/mutate", data=orjson.dumps(review(manifest))) as r:
        answer = orjson.loads(await r.read())
    assert answer["response"]["allowed"], answer
    mutated = apply_patch(manifest, patch_of(answer))
    assert policy().admit("CREATE", mutated).allowed
    assert baseline_problems(mutated) == []

    pod = created(mutated, name=manifest["metadata"]["name"], namespace="team-a")
    nodes = [n for n in _sample_nodes() if _kube_scheduler_fits(pod, n)]
    assert nodes, "no node's taints are tolerated"
    # Without the webhook's toleration the documented pod would fit no GPU node.
    assert not [
        n
        for n in _sample_nodes()
        if n["spec"].get("taints") and _kube_scheduler_fits(created(manifest, name="raw"), n)
    ]
    cluster = EmbeddedCluster.from_objects([*_sample_objects(), pod])
    service = ExtenderService(cluster=cluster, config=CONFIG)
    await service.start()
    try:
        candidates = [n["metadata"]["name"] for n in nodes]
        passed = service.filter(pod, candidates).passed
        assert passed, service.filter(pod, candidates)
        scores = service.scores(pod, passed)
        node = max(zip(scores, passed, strict=True))[1]
        meta = pod["metadata"]
        await service.bind(name=meta["name"], namespace="team-a", uid=meta["uid"], node=node)
        bound = cluster.pod("team-a", meta["name"])
        assert bound is not None and bound["spec"]["nodeName"] == node
        assert ALLOCATION_KEY in bound["metadata"]["annotations"]
    finally:
        await service.close()


def _sample_objects() -> list[Json]:
    doc = yaml.safe_load(demo.sample_cluster_text())
    items: list[Json] = doc["items"]
    return items


def _sample_nodes() -> list[Json]:
    return [o for o in _sample_objects() if o["kind"] == "Node"]
