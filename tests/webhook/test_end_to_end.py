"""From manifest to container env: a pod goes through `/mutate` (over HTTP, the patch applied)
and `/validate`, then through the extender on an embedded cluster (filter, prioritize, bind);
resolving each injected env var by the downward-API rules from the bound pod's annotations
gives exactly its allocation — for a share pod, a units pod, a whole-GPU pod and a
two-container pod."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY, decode_allocation, visible_device
from extender.packing.podspec import MPS_DELIVERY
from extender.service import ExtenderService
from extender.webhook.admission import (
    CONNECTIONS_ENV,
    GUARDED_ENV,
    MEM_LIMIT_ENV,
    PIPE_ENV,
    THREADS_ENV,
    VISIBLE_DEVICES_ENV,
    AdmissionSettings,
)
from extender.webhook.app import make_app
from tests.http.kube_objects import gpu_node
from tests.webhook.reviews import (
    Json,
    apply_patch,
    container,
    created,
    patch_of,
    pod_object,
    resolve_env,
    review,
)

Client = TestClient[web.Request, web.Application]
CONFIG = Config.default()
USER_DOCS = Path(__file__).resolve().parents[2] / "docs" / "requesting-gpu-shares.md"

MANIFESTS: dict[str, Json] = {
    "share": pod_object(container(limits={"mpsched.io/threads": "25", "mpsched.io/memory": "4Gi"})),
    "units": pod_object(container(limits={"mpsched.io/units": "2"})),
    "whole": pod_object(container(limits={"mpsched.io/gpus": "2"})),
    "two": pod_object(
        container("trainer", limits={"mpsched.io/threads": "30"}),
        container("server", limits={"mpsched.io/threads": "10", "mpsched.io/memory": "2Gi"}),
        container("logs"),
    ),
}
#: What each container must see, from the ask alone (GPUs of 40960 MiB, 256 MiB reserve, U = 4).
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "share": {"main": ("25", "0=4096M")},
    "units": {"main": ("50", f"0={(40960 - 256) * 2 // 4}M")},
    "two": {"trainer": ("30", f"0={(40960 - 256) * 30 // 100}M"), "server": ("10", "0=2048M")},
}


async def _admit(client: Client, path: str, body: Json) -> Json:
    async with client.post(path, data=orjson.dumps(body)) as r:
        assert r.status == 200
        answer: Json = orjson.loads(await r.read())
    assert answer["response"]["allowed"], answer
    return answer


async def test_the_env_a_container_sees_is_its_allocation(aiohttp_client: Any) -> None:
    client: Client = await aiohttp_client(make_app(AdmissionSettings.from_config(CONFIG)))
    pods = []
    for name, manifest in MANIFESTS.items():
        answer = await _admit(client, "/mutate", review(manifest))
        mutated = apply_patch(manifest, patch_of(answer))
        await _admit(client, "/validate", review(mutated))
        pods.append(created(mutated, name=name, namespace="team-a"))

    cluster = EmbeddedCluster.from_objects(
        [gpu_node("a", gpus=2, units=4), gpu_node("b", gpus=2, units=4), *pods]
    )
    service = ExtenderService(cluster=cluster, config=CONFIG)
    await service.start()
    try:
        for pod in pods:
            meta = pod["metadata"]
            passed = service.filter(pod, ["a", "b"]).passed
            assert passed, meta["name"]
            scores = service.scores(pod, passed)
            node = max(zip(scores, passed, strict=True))[1]
            await service.bind(
                name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], node=node
            )
            bound = cluster.pod(meta["namespace"], meta["name"])
            assert bound is not None and bound["spec"]["nodeName"] == node
            _check(bound)
    finally:
        await service.close()


def _check(bound: Json) -> None:
    meta = bound["metadata"]
    alloc = decode_allocation(
        meta["annotations"][ALLOCATION_KEY],
        pod_uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
    )
    devices = ",".join(visible_device(g) for g in alloc.gpus)
    name = meta["name"]
    if name == "whole":
        assert alloc.kind == "whole" and len(alloc.gpus) == 2
        assert resolve_env(bound, "main") == {VISIBLE_DEVICES_ENV: devices}
        assert devices == ",".join(f"GPU-{alloc.node}-{g.index}" for g in alloc.gpus)
        return
    assert alloc.kind == "share" and len(alloc.gpus) == 1
    by_name = {c.name: c for c in alloc.containers}
    assert set(by_name) == set(EXPECTED[name])
    for cname, (threads, memory) in EXPECTED[name].items():
        c = by_name[cname]
        env = resolve_env(bound, cname)
        # The pipe directory comes from the device plugin's Allocate, through mpsched.io/mps.
        assert env == {
            VISIBLE_DEVICES_ENV: devices,
            THREADS_ENV: str(c.threads),
            MEM_LIMIT_ENV: f"0={c.memory_mib}M",
            CONNECTIONS_ENV: "2",
        }
        assert _container(bound, cname)["resources"]["limits"][MPS_DELIVERY] == "1"
        # ...and that allocation is what the container asked for.
        assert (env[THREADS_ENV], env[MEM_LIMIT_ENV]) == (threads, memory)
    if name == "two":
        assert not set(resolve_env(bound, "logs")) & set(GUARDED_ENV)
        assert MPS_DELIVERY not in str(_container(bound, "logs"))


def _container(pod: Json, name: str) -> Json:
    found: Json
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def _docs_pod() -> Json:
    """The pod of docs/requesting-gpu-shares.md, as a user would copy it."""
    blocks = re.findall(r"```yaml\n(.*?)```", USER_DOCS.read_text(), flags=re.S)
    found: Json = next(d for d in map(yaml.safe_load, blocks) if d.get("kind") == "Pod")
    return found


async def test_the_manifest_in_the_user_docs_gets_its_share(aiohttp_client: Any) -> None:
    manifest = _docs_pod()
    client: Client = await aiohttp_client(make_app(AdmissionSettings.from_config(CONFIG)))
    answer = await _admit(client, "/mutate", review(manifest))
    mutated = apply_patch(manifest, patch_of(answer))
    await _admit(client, "/validate", review(mutated))
    pod = created(mutated, name=manifest["metadata"]["name"], namespace="team-a")
    cluster = EmbeddedCluster.from_objects([gpu_node("a", gpus=2), pod])
    service = ExtenderService(cluster=cluster, config=CONFIG)
    await service.start()
    try:
        meta = pod["metadata"]
        assert service.filter(pod, ["a"]).passed == ["a"]
        await service.bind(name=meta["name"], namespace="team-a", uid=meta["uid"], node="a")
        bound = cluster.pod("team-a", meta["name"])
        assert bound is not None
        env = resolve_env(bound, "model")
        assert env[THREADS_ENV] == "30" and env[MEM_LIMIT_ENV] == "0=12288M"
        assert PIPE_ENV not in env and env[VISIBLE_DEVICES_ENV].startswith("GPU-a-")
    finally:
        await service.close()
