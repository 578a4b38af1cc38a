"""The `/ui` page in a real browser (headless chromium over the DevTools protocol), served by a
real `mpsched serve --cluster-file` with the sample cluster and a few pending pods:

- every GPU of the ledger is drawn, split by pod exactly as `/status` counts it (threads,
  memory with the clients' overhead, clients; whole, over budget, MPS down);
- "has room for" marks exactly the GPUs where filter's fit places such a pod: the nodes are the
  ones `/filter` passes for the same ask, the GPUs the candidates of the evaluator's fit (the
  path bind takes) on a ledger built here from the same file;
- a bind made meanwhile shows within 2 s, and a click on it shows its allocation and its
  containers' limits;
- the node, model and namespace filters show the nodes they should;
- nothing is requested from anywhere but 127.0.0.1, and nothing is logged as an error.

Set MPSCHED_UI_SCREENSHOT=PATH to keep the page's screenshot (docs/ui.png is made so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest
import yaml

from extender.cluster.embedded import EmbeddedCluster
from extender.commands import demo
from extender.config import Config
from extender.packing.codec import ALLOCATION_KEY
from extender.packing.fit import Fit
from extender.service import ExtenderService
from tests.browser import Page, chromium_or_skip, launch
from tests.http.kube_objects import pod
from tests.observability.served import serve, wait_for

Json = dict[str, Any]
ASK = {"threads": "30", "memory": "8Gi"}

#: The DOM's GPUs: per GPU its classes and, per bar, its segments (pod uid or none, value,
#: width in percent of the bar).
READ_GPUS = """
[...document.querySelectorAll('.gpu')].map(g => ({
  node: g.dataset.node, gpu: Number(g.dataset.gpu), classes: [...g.classList],
  bars: Object.fromEntries([...g.querySelectorAll('.bar')].map(b => [
    [...b.classList].find(c => c !== 'bar'),
    [...b.querySelectorAll('.seg')].map(s => ({
      uid: s.dataset.uid || null, owner: s.dataset.owner || null,
      v: s.dataset.v === undefined ? null : Number(s.dataset.v),
      width: parseFloat(s.style.width), kind: [...s.classList].find(c => c !== 'seg'),
    }))]))
}))
"""


def cluster_file(directory: Path) -> Path:
    """The sample cluster with pending pods to bind while the page is open."""
    doc = yaml.safe_load(demo.sample_cluster_text())
    # A share the cluster shows beside llm-serve and embedder on the H100's GPU 0 (75 % taken):
    # counted as it runs, 115 % of the threads, so the GPU is over budget.
    over = pod("late-share", namespace="ml-infer", uid="uid-late-share", node="gpu-h100-1")
    over["status"]["phase"] = "Running"
    over["metadata"]["annotations"][ALLOCATION_KEY] = orjson.dumps(
        {
            "clients": 1,
            "containers": [{"clients": 1, "memoryMiB": 1024, "name": "main", "threads": 40}],
            "gpus": [{"index": 0, "uuid": "GPU-6513270e-269e-4d37-b2a7-4de452e6b438"}],
            "kind": "share",
            "memoryMiB": 1024,
            "node": "gpu-h100-1",
            "threads": 40,
            "uid": 1000,
            "v": 1,
        }
    ).decode()
    doc["items"] += [
        over,
        pod("live-0", namespace="ml-live", threads=40, memory="10Gi", uid="uid-live-0"),
        pod("probe-0", namespace="ml-live", threads=30, memory="8Gi", uid="uid-probe-0", user=1000),
    ]
    path = directory / "cluster.json"
    path.write_bytes(orjson.dumps(doc))
    return path


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, (url, resp.status, await resp.text())
        return await resp.json()


async def _post(http: aiohttp.ClientSession, url: str, body: Json) -> Json:
    async with http.post(url, data=orjson.dumps(body)) as resp:
        assert resp.status == 200, (url, resp.status, await resp.text())
        answer: Json = await resp.json()
        return answer


def expected_bars(g: Json) -> dict[str, list[tuple[str | None, int]]]:
    """What each bar of a /status GPU must show: (pod uid, value) per segment, in order."""
    if g["wholeOwner"]:
        return {k: [(None, 100)] for k in ("threads", "memory", "clients")}
    pods = g["pods"]
    memory = [(p["uid"], p["memoryMiB"]) for p in pods]
    overhead = g["memory"]["usedMiB"] - sum(p["memoryMiB"] for p in pods)
    if overhead > 0:
        memory.append((None, overhead))
    return {
        "threads": [(p["uid"], p["threads"]) for p in pods],
        "memory": memory,
        "clients": [(p["uid"], p["clients"]) for p in pods],
    }


def check_gpus(shown: list[Json], status: Json) -> None:
    """The page's GPUs are the ledger's, each split as /status counts it."""
    by_key = {(g["node"], g["gpu"]): g for g in shown}
    want = {(n["name"], g["index"]): g for n in status["nodes"] for g in n["gpus"]}
    assert set(by_key) == set(want)
    for key, g in want.items():
        dom = by_key[key]
        caps = {
            "threads": g["threads"]["capacity"],
            "memory": g["memory"]["capacityMiB"],
            "clients": g["clients"]["capacity"],
        }
        for bar, segments in expected_bars(g).items():
            drawn = dom["bars"][bar]
            if g["wholeOwner"]:
                assert [(s["owner"], s["width"]) for s in drawn] == [(g["wholeOwner"], 100)], key
                continue
            assert [(s["uid"], s["v"]) for s in drawn] == segments, (key, bar)
            for s, (_, value) in zip(drawn, segments, strict=True):
                assert s["width"] == pytest.approx(min(100, 100 * value / caps[bar]), abs=1e-3)
        assert ("whole" in dom["classes"]) == bool(g["wholeOwner"])
        assert ("over" in dom["classes"]) == bool(g["overBudget"])
        assert (f"mps-{g['mps']}" in dom["classes"]) == (g["mps"] != "ready")


async def fit_oracle(path: Path, ask_pod: Json) -> dict[str, set[int]]:
    """Per node, the GPUs the evaluator's fit (what filter and bind use) finds for `ask_pod`,
    on a ledger built here from the same file."""
    cluster = EmbeddedCluster.from_file(path)
    service = ExtenderService(cluster=cluster, config=Config.default())
    try:
        await service.start()
        state = service.state
        demand = state.parser.parse(ask_pod).demand
        assert demand is not None
        out = {}
        for name in state.ledger.node_names():
            entry = state.evaluator.entry(demand, name)
            if entry is not None and isinstance(entry[0], Fit):
                out[name] = set(entry[0].gpus)
        return out
    finally:
        await service.close()
        await cluster.close()


async def set_input(page: Page, element: str, value: str, event: str = "input") -> None:
    await page.evaluate(
        f"(() => {{ const e = document.getElementById({element!r}); e.value = {value!r};"
        f" e.dispatchEvent(new Event({event!r})); }})()"
    )


async def test_the_page_shows_the_ledger_live(tmp_path: Path) -> None:
    chromium_or_skip()
    path = cluster_file(tmp_path)
    async with (
        serve("--cluster-file", str(path)) as served,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        launch(tmp_path / "profile") as browser,
        browser.page() as page,
    ):
        await wait_for(f"{served.metrics}/readyz")
        await page.navigate(f"{served.metrics}/ui")
        await page.wait_for("document.body.dataset.painted === '1'")
        status = await _get(http, f"{served.metrics}/status")
        check_gpus(await page.evaluate(READ_GPUS), status)
        classes = {c for g in await page.evaluate(READ_GPUS) for c in g["classes"]}
        assert {"whole", "over", "mps-down"} <= classes

        # Has room for: exactly where filter would put such a pod.
        names = [n["name"] for n in status["nodes"]]
        probe = pod(
            "probe-0", namespace="ml-live", threads=30, memory="8Gi", uid="uid-probe-0", user=1000
        )
        filtered = await _post(http, f"{served.base}/filter", {"Pod": probe, "NodeNames": names})
        await set_input(page, "room-threads", ASK["threads"])
        await set_input(page, "room-memory", ASK["memory"])
        await set_input(page, "room-user", "1000")
        await page.evaluate("document.getElementById('room-go').click()")
        # The answer is written at once; the rows it marks are drawn at the next frame.
        await page.wait_for(
            "document.getElementById('room-result').textContent && window.mpschedUi.drawn()"
        )
        room = await page.evaluate(
            "[...document.querySelectorAll('.gpu.room')].map(g => [g.dataset.node, +g.dataset.gpu])"
        )
        marked: dict[str, set[int]] = {}
        for node, gpu in room:
            marked.setdefault(node, set()).add(gpu)
        assert set(marked) == set(filtered["NodeNames"])
        assert marked == await fit_oracle(path, probe)
        shown = await page.evaluate("window.mpschedUi.shown()")
        assert shown == sorted(filtered["NodeNames"])
        await page.evaluate("document.getElementById('room-clear').click()")
        await page.wait_for(f"window.mpschedUi.shown().length === {len(names)}")

        # A bind made meanwhile: on the page within 2 s.
        live = pod("live-0", namespace="ml-live", threads=40, memory="10Gi", uid="uid-live-0")
        passed = await _post(http, f"{served.base}/filter", {"Pod": live, "NodeNames": names})
        node = passed["NodeNames"][0]
        bound = await _post(
            http,
            f"{served.base}/bind",
            {"PodName": "live-0", "PodNamespace": "ml-live", "PodUID": "uid-live-0", "Node": node},
        )
        assert not bound.get("Error"), bound
        started = time.monotonic()
        await page.wait_for(
            "document.querySelector('.seg[data-uid=\"uid-live-0\"]') !== null", timeout_s=5
        )
        took = time.monotonic() - started
        print(f"\nbind shown on the page {took * 1000:.0f} ms after /bind answered")
        assert took < 2.0
        status = await _get(http, f"{served.metrics}/status")
        check_gpus(await page.evaluate(READ_GPUS), status)

        # Its details on click: the allocation and the containers' limits.
        await page.evaluate("document.querySelector('.seg[data-uid=\"uid-live-0\"]').click()")
        await page.wait_for("document.getElementById('details-body').dataset.uid === 'uid-live-0'")
        details = await page.evaluate("document.getElementById('details').innerText")
        assert "ml-live/live-0" in details and node in details
        limits = await page.evaluate(
            "[...document.querySelectorAll('tr[data-container] td')].map(td => td.textContent)"
        )
        assert limits[:3] == ["main", "40%", "10240 MiB"]

        # The filters.
        await set_input(page, "f-node", "a100")
        assert await page.evaluate("window.mpschedUi.shown()") == ["gpu-a100-1"]
        await set_input(page, "f-node", "")
        await set_input(page, "f-model", "Tesla V100-SXM2-16GB", "change")
        assert await page.evaluate("window.mpschedUi.shown()") == ["gpu-v100-1"]
        await set_input(page, "f-model", "", "change")
        await set_input(page, "f-ns", "ml-live")
        assert await page.evaluate("window.mpschedUi.shown()") == [node]
        await set_input(page, "f-ns", "")

        await page.wait_for("document.getElementById('summary').textContent.includes('GPUs')")
        shot = tmp_path / "ui.png"
        await page.screenshot(shot)
        if keep := os.environ.get("MPSCHED_UI_SCREENSHOT"):
            shutil.copyfile(shot, keep)
        await asyncio.sleep(0.6)  # a poll or two more: any error they log counts too

        assert page.errors() == []
        urls = page.requested_urls()
        assert any(u.endswith("/ui/changes?since=" + u.rpartition("=")[2]) for u in urls)
        assert {urlsplit(u).hostname for u in urls} == {"127.0.0.1"}, urls
