"""The endpoints beside `/status` that the page and `kubectl mpsched` read, over a real extender
on an embedded cluster: `/status/why` (filter's reasons kept per pod, bounded), `/status/fit`
(the room for a made-up ask, the same as filter's answer), `/status/pod/{uid}`, and the page's
feed (`/ui/nodes`, `/ui/changes`) through binds, node changes, a log that overflowed and a
reconfiguration."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extender.cluster import Unavailable
from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http import ui
from extender.http.app import make_app
from extender.http.keys import SERVICE, HttpSettings
from extender.packing.state_index import TOUCH_LOG
from extender.service import BindError, ExtenderService
from extender.service.why import ENTRY_BYTES, NODE_REASON_BYTES, FilterReasons
from tests.http.kube_objects import gpu_node, pod
from tests.service.test_service import _faulty

Json = dict[str, Any]


def _objects(nodes: int = 12) -> list[Json]:
    """Nodes of 2 or 4 GPUs of two models, and pending pods: `run-*` are bound by the fixture,
    `wait-*` are left for the tests."""
    out = [
        gpu_node(
            f"node-{i:02d}",
            gpus=4 if i % 3 == 0 else 2,
            memory_mib=81920 if i % 3 == 0 else 40960,
            model="H100" if i % 3 == 0 else "A100",
        )
        for i in range(nodes)
    ]
    rng = random.Random(7)
    for k in range(20):
        ns = rng.choice(["a", "b"])
        threads, memory = rng.choice([10, 25, 40]), rng.choice(["4Gi", "10Gi"])
        out.append(pod(f"run-{k}", namespace=ns, threads=threads, memory=memory, user=1000))
    out += [pod(f"wait-{k}", namespace="a", threads=30, memory="8Gi", user=1000) for k in range(4)]
    return out


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    cluster = EmbeddedCluster.from_objects(_objects())
    service = ExtenderService(cluster=cluster, config=Config.default())
    async with TestClient(TestServer(make_app(service, HttpSettings()))) as c:
        await service.wait_ready()
        names = [f"node-{i:02d}" for i in range(12)]
        rng = random.Random(3)
        for p in cluster_pods(cluster, "run-"):
            passed = service.filter(p, names).passed
            meta = p["metadata"]
            await service.bind(
                name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                node=rng.choice(passed),
            )  # fmt: skip
        yield c
    await cluster.close()


def cluster_pods(cluster: EmbeddedCluster, prefix: str) -> list[Json]:
    return [
        p
        for p in (cluster.pod(ns, f"{prefix}{k}") for k in range(20) for ns in ("a", "b"))
        if p is not None
    ]


def _service(client: TestClient[Any, Any]) -> ExtenderService:
    app = client.app
    assert app is not None
    service: ExtenderService = app[SERVICE]
    return service


async def _json(client: TestClient[Any, Any], path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def _filter(client: TestClient[Any, Any], p: Json, names: list[str]) -> Json:
    resp = await client.post("/filter", data=orjson.dumps({"Pod": p, "NodeNames": names}))
    assert resp.status == 200
    answer: Json = await resp.json()
    return answer


# -- /status/why -------------------------------------------------------------------------------


async def test_why_serves_the_latest_filter_answer(client: TestClient[Any, Any]) -> None:
    names = [f"node-{i:02d}" for i in range(12)] + ["no-such-node"]
    big = pod("big", namespace="a", threads=90, memory="70Gi", uid="uid-big")
    answer = await _filter(client, big, names)
    doc = await _json(client, "/status/why/a/big")
    assert doc["uid"] == "uid-big" and doc["passed"] == len(answer["NodeNames"])
    failed = answer["FailedNodes"] or {}
    never = answer["FailedAndUnresolvableNodes"] or {}
    assert {n["node"]: n["reason"] for n in doc["nodes"]} == {**failed, **never}
    assert {n["node"] for n in doc["nodes"] if not n["resolvable"]} == set(never)
    assert "no-such-node" in never
    assert [n["node"] for n in doc["nodes"]] == sorted(n["node"] for n in doc["nodes"])
    assert await _json(client, "/status/why?uid=uid-big") == doc

    # Filtered again, on fewer nodes: the latest answer replaces the first.
    await _filter(client, big, names[:2])
    doc = await _json(client, "/status/why/a/big")
    assert {n["node"] for n in doc["nodes"]} <= set(names[:2])

    # An invalid ask is remembered with its reason on every node.
    bad = pod("bad", namespace="a", threads=300, uid="uid-bad")
    await _filter(client, bad, names[:3])
    doc = await _json(client, "/status/why/a/bad")
    assert len(doc["nodes"]) == 3
    assert all("above 100" in n["reason"] and not n["resolvable"] for n in doc["nodes"])

    missing = await _json(client, "/status/why/a/nope", 404)
    assert "no filter call remembered for pod a/nope" in missing["Error"]
    assert "name the pod" in (await _json(client, "/status/why", 400))["Error"]


def test_why_is_bounded_by_count_and_bytes() -> None:
    reasons = FilterReasons(max_pods=3, max_bytes=10**9)
    for k in range(5):
        reasons.remember(
            namespace="a", name=f"p{k}", uid=f"u{k}", passed=0, failed={"n": "r"}, unresolvable={}
        )
    assert len(reasons) == 3
    assert reasons.of_pod("a", "p0") is None and reasons.of_pod("a", "p4") is not None
    # A pod filtered again becomes the newest.
    reasons.remember(namespace="a", name="p2", uid="u2", passed=1, failed={}, unresolvable={})
    reasons.remember(namespace="a", name="p5", uid="u5", passed=0, failed={}, unresolvable={})
    assert reasons.of_uid("u3") is None and reasons.of_uid("u2") is not None

    identity = len("u0") + len("p0") + len("a")  # uid, name, namespace
    one = ENTRY_BYTES + identity + NODE_REASON_BYTES * 100
    reasons = FilterReasons(max_pods=1000, max_bytes=3 * one)
    many = {f"node-{i}": "no GPU has room" for i in range(100)}
    for k in range(10):
        reasons.remember(
            namespace="a", name=f"p{k}", uid=f"u{k}", passed=0, failed=many, unresolvable={}
        )
        assert reasons.nbytes <= 3 * one
    assert len(reasons) == 3
    # A pod recreated under its name: the name finds the new uid; the old entry may stay.
    reasons.remember(namespace="a", name="p9", uid="v9", passed=2, failed={}, unresolvable={})
    found = reasons.of_pod("a", "p9")
    assert found is not None and found.uid == "v9"
    # An identity no pod could have is not kept (a forged request's 4 MiB uid).
    before = (len(reasons), reasons.nbytes)
    reasons.remember("a", "huge", "u" * (4 << 20), 0, {}, {})
    assert (len(reasons), reasons.nbytes) == before and reasons.of_pod("a", "huge") is None


# -- /status/fit -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ask",
    [
        {"threads": "30", "memory": "8Gi"},
        {"threads": "60"},
        {"memory": "30Gi"},
        {"threads": "10", "memory": "1Gi", "clients": "4"},
        {"threads": "100", "memory": "70Gi"},
        # The running pods' user shares their GPUs; an unknown user (no `user`) shares none.
        {"threads": "30", "memory": "8Gi", "user": "1000"},
        {"threads": "10", "user": "1000"},
        {"threads": "10", "user": "2000"},
    ],
)
async def test_fit_lists_where_filter_passes(client: TestClient[Any, Any], ask: Json) -> None:
    names = [f"node-{i:02d}" for i in range(12)]
    room = await _json(client, "/status/fit?" + "&".join(f"{k}={v}" for k, v in ask.items()))
    user = int(ask["user"]) if "user" in ask else None
    keys = {"threads": "threads", "memory": "memory", "clients": "clients"}
    probe = pod(
        "probe", namespace="default", user=user, **{keys[k]: v for k, v in ask.items() if k in keys}
    )
    answer = await _filter(client, probe, names)
    assert [n["node"] for n in room["nodes"]] == sorted(answer["NodeNames"])
    # GPU by GPU: the evaluator's fit (the path bind takes) on each node.
    state = _service(client).state
    demand = state.parser.parse(probe).demand
    assert demand is not None
    for item in room["nodes"]:
        entry = state.evaluator.entry(demand, item["node"])
        assert entry is not None
        assert item["gpus"] == list(entry[0].gpus)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("", "ask for threads"),
        ("threads=300", "above 100"),
        ("threads=ten", "mpsched.io/threads"),
        ("memory=1Pi", "larger than any GPU"),
        ("clients=2", "ask for threads"),
        ("threads=10&namespace=" + "x" * 300, "longer than 253"),
        ("threads=10&user=-1", "not a Linux user id"),
        ("threads=10&user=99999999999", "not a Linux user id"),
    ],
)
async def test_fit_refuses_an_ask_no_pod_could_make(
    client: TestClient[Any, Any], query: str, says: str
) -> None:
    answer = await _json(client, f"/status/fit?{query}", 400)
    assert says in answer["Error"], answer


# -- /status/pod -------------------------------------------------------------------------------


async def test_pod_details(client: TestClient[Any, Any]) -> None:
    status = await _json(client, "/status")
    shares = [p for n in status["nodes"] for g in n["gpus"] for p in g["pods"]]
    first = shares[0]
    doc = await _json(client, f"/status/pod/{first['uid']}")
    assert (doc["namespace"], doc["name"], doc["kind"]) == (
        first["namespace"],
        first["name"],
        "share",
    )
    assert (doc["threads"], doc["memoryMiB"], doc["clients"]) == (
        first["threads"], first["memoryMiB"], first["clients"],
    )  # fmt: skip
    assert [c["name"] for c in doc["containers"]] == ["main"]
    assert doc["containers"][0]["threads"] == first["threads"]
    assert "no allocation" in (await _json(client, "/status/pod/nope", 404))["Error"]


# -- the page's feed ---------------------------------------------------------------------------


async def test_feed_gives_every_node_then_what_changed(client: TestClient[Any, Any]) -> None:
    service = _service(client)
    whole = await _json(client, "/ui/nodes")
    status = await _json(client, "/status")
    # Each node's fragmentation, weighted by its GPUs, adds up to the cluster's in /status.
    gpus = sum(len(n["gpus"]) for n in whole["nodes"])
    weighted = sum(n["fragmentationPct"] * len(n["gpus"]) for n in whole["nodes"]) / gpus
    assert weighted == pytest.approx(status["summary"]["fragmentationPct"], abs=0.01)
    assert any(n["fragmentationPct"] > 0 for n in whole["nodes"])
    assert [n["name"] for n in whole["nodes"]] == [n["name"] for n in status["nodes"]]
    for mine, theirs in zip(whole["nodes"], status["nodes"], strict=True):
        frag = mine.pop("fragmentationPct")
        assert mine == theirs and 0 <= frag <= 100
    first = await _json(client, "/ui/nodes?limit=2")
    assert first["total"] == whole["total"] == len(whole["nodes"])
    assert [n["name"] for n in first["nodes"]] == [n["name"] for n in whole["nodes"][:2]]
    refused = await _json(client, "/ui/nodes?limit=x", 400)
    assert "limit must be a whole number" in refused["Error"]
    token = whole["token"]
    quiet = await _json(client, f"/ui/changes?since={token}")
    assert (quiet["reset"], quiet["nodes"], quiet["removed"]) == (False, [], [])
    assert quiet["token"] == token

    # A bind: its node comes again, with the pod on it.
    names = [n["name"] for n in status["nodes"]]
    wait = pod("wait-0", namespace="a", threads=30, memory="8Gi", user=1000)
    node = (await _filter(client, wait, names))["NodeNames"][0]
    await service.bind(name="wait-0", namespace="a", uid=wait["metadata"]["uid"], node=node)
    changed = await _json(client, f"/ui/changes?since={token}")
    assert not changed["reset"] and [n["name"] for n in changed["nodes"]] == [node]
    pods = {p["name"] for g in changed["nodes"][0]["gpus"] for p in g["pods"]}
    assert "wait-0" in pods
    token = changed["token"]

    # More changes than the evaluator's touch log keeps: the ledger generations tell.
    cluster = service.cluster
    assert isinstance(cluster, EmbeddedCluster)
    for k in range(TOUCH_LOG + 10):
        cluster.apply(gpu_node(f"late-{k:03d}", gpus=1))
    await _settle(service, f"late-{TOUCH_LOG + 9:03d}")
    assert service.state.evaluator.touched_since(0) is None
    changed = await _json(client, f"/ui/changes?since={token}")
    assert not changed["reset"]
    assert {n["name"] for n in changed["nodes"]} == {f"late-{k:03d}" for k in range(TOUCH_LOG + 10)}
    token = changed["token"]
    cluster.delete_node("late-000")
    await _settle(service, "late-000", gone=True)
    changed = await _json(client, f"/ui/changes?since={token}")
    assert changed["removed"] == ["late-000"] and changed["nodes"] == []

    # A token of another process, a made-up one, or one from before a reconfiguration: reset.
    for bad in ("", "nope", "00000000.1", token.split(".")[0] + ".999999"):
        assert (await _json(client, f"/ui/changes?since={bad}"))["reset"]
    cfg = service.config
    budgets = dataclasses.replace(cfg.budgets, oversubscription=2.0)
    assert (await service.reconfigure(dataclasses.replace(cfg, budgets=budgets))).rebuilt
    assert (await _json(client, f"/ui/changes?since={changed['token']}"))["reset"]


async def _settle(service: ExtenderService, node: str, *, gone: bool = False) -> None:
    """Wait until the extender's watch has delivered the change to `node`."""
    for _ in range(200):
        present = service.state.ledger.get_node(node) is not None
        if present != gone:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{node} never {'went' if gone else 'came'}")


async def test_a_bind_in_doubt_comes_in_the_changes() -> None:
    cluster, service = await _faulty([gpu_node("n", gpus=1), pod("a", threads=60)], in_doubt_s=30)

    async def never_answered(**kwargs: Any) -> None:
        raise Unavailable("timed out")

    # The page's routes alone, over the service already started (make_app would start it again).
    app = web.Application()
    app[SERVICE] = service
    ui.add_routes(app)
    async with TestClient(TestServer(app)) as client:
        token = (await _json(client, "/ui/nodes"))["token"]
        cluster.reads_fail = True
        cluster.bind = never_answered  # type: ignore[method-assign]
        with pytest.raises(BindError):
            await service.bind(name="a", namespace="default", uid="uid-default-a", node="n")
        changed = await _json(client, f"/ui/changes?since={token}")
        assert changed["inDoubt"] == ["uid-default-a"]
        [node] = changed["nodes"]
        [share] = node["gpus"][0]["pods"]
        assert (share["uid"], share["state"]) == ("uid-default-a", "in_doubt")
    await service.close()
