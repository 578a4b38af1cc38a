"""The `/ui` page at 5,000 nodes × 8 GPUs (the bench's generated cluster, about 16,000 running
pods), served by a real `mpsched serve --cluster-file`, in headless chromium: how soon the first
rows are painted and every node has arrived, and how the page keeps up while binds stream in and
the list is scrolled (frame gaps, long tasks, how long the page takes to answer, how soon each
bind shows). The figures are printed (`pytest -s`), not asserted: they depend on the machine.
What is asserted: every bind shows, and nothing is logged as an error."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from extender_bench.cluster import generate_cluster
from extender_bench.pods import pending_pods
from tests.browser import Page, chromium_or_skip, launch
from tests.observability.served import serve, wait_for

NODES = 5000
RUNNING = 16000
BINDS = 150
#: Binds a second while the page is watched (kube-scheduler's pace on a busy cluster).
BIND_RATE = 25.0

PROBE = """
(() => {
  const probe = window.__probe = {gaps: [], long: []};
  let last = performance.now();
  const frame = (t) => { probe.gaps.push(t - last); last = t; requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
  new PerformanceObserver((l) => l.getEntries().forEach((e) => probe.long.push(e.duration)))
    .observe({type: "longtask"});
  return true;
})()
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _bind_stream(
    http: aiohttp.ClientSession,
    base: str,
    names: list[str],
    pods: list[dict[str, Any]],
    made: list[tuple[str, str, float]],
) -> None:
    """Filter and bind `pods` at BIND_RATE, each over 300 candidate nodes as kube-scheduler
    sends them; (node, uid, time bound) of each bind made goes to `made` at once."""
    rng = random.Random(5)
    for p in pods:
        started = time.monotonic()
        body = {"Pod": p, "NodeNames": rng.sample(names, 300)}
        async with http.post(f"{base}/filter", data=orjson.dumps(body)) as resp:
            passed = (await resp.json())["NodeNames"] or []
        if passed:
            meta = p["metadata"]
            args = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": passed[0],
            }
            async with http.post(f"{base}/bind", data=orjson.dumps(args)) as resp:
                if not (await resp.json()).get("Error"):
                    made.append((passed[0], meta["uid"], time.monotonic()))
        await asyncio.sleep(max(0.0, 1 / BIND_RATE - (time.monotonic() - started)))


async def _watch(
    page: Page,
    made: list[tuple[str, str, float]],
    seen: dict[str, float],
    feed: tuple[aiohttp.ClientSession, str, list[float]],
    rtts: list[float],
) -> None:
    """Until cancelled: scroll the list as a reader would, note when each bind shows, and time
    the extender's answers to /ui/changes from here (without the page's own delays)."""
    http, metrics, feed_times = feed
    token = await page.evaluate("window.mpschedUi.token()")
    top = 0
    while True:
        asked = time.monotonic()
        async with http.get(f"{metrics}/ui/changes", params={"since": token}) as resp:
            token = (await resp.json())["token"]
        feed_times.append(time.monotonic() - asked)
        top = (top + 2200) % (NODES * 44)
        started = time.monotonic()
        await page.evaluate(f"document.getElementById('list').scrollTop = {top}")
        rtts.append(time.monotonic() - started)
        pending = [(n, u) for n, u, _ in made if u not in seen]
        if pending:
            shown = await page.evaluate(
                f"{orjson.dumps(pending).decode()}.filter(([n, u]) => window.mpschedUi.podOn(n, u))"
                ".map(([n, u]) => u)"
            )
            now = time.monotonic()
            for uid in shown:
                seen[uid] = now
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_the_page_at_5000_nodes(tmp_path: Path) -> None:
    chromium_or_skip()
    doc, _ = await asyncio.to_thread(generate_cluster, NODES, RUNNING, 11)
    pods = pending_pods(BINDS, 12)
    shares = [p for p in pods if "mpsched.io/gpus" not in str(p["spec"])]
    doc["items"] += pods
    path = tmp_path / "cluster.json"
    await asyncio.to_thread(path.write_bytes, orjson.dumps(doc))
    del doc
    async with (
        serve("--cluster-file", str(path)) as served,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        launch(tmp_path / "profile") as browser,
        browser.page() as page,
    ):
        await wait_for(f"{served.metrics}/readyz", timeout_s=600)
        await page.navigate(f"{served.metrics}/ui")
        await page.wait_for("document.body.dataset.painted === '1'", timeout_s=60)
        await page.wait_for("window.mpschedUi.loaded()", timeout_s=60)
        paint = await page.evaluate(
            "performance.getEntriesByName('mpsched-first-rows')[0].startTime"
        )
        loaded = await page.evaluate("performance.now()")
        assert await page.evaluate("window.mpschedUi.nodes()") == NODES
        gpus = await page.evaluate("document.querySelectorAll('.gpu').length")
        names = [f"node-{i:05d}" for i in range(NODES)]

        await page.evaluate(PROBE)
        made: list[tuple[str, str, float]] = []
        seen: dict[str, float] = {}
        feed_times: list[float] = []
        rtts: list[float] = []
        watcher = asyncio.get_running_loop().create_task(
            _watch(page, made, seen, (http, served.metrics, feed_times), rtts)
        )
        started = time.monotonic()
        await _bind_stream(http, served.base, names, shares, made)
        streamed = time.monotonic() - started
        for _ in range(100):  # up to 10 s for the last binds to show
            if len(seen) >= len(made):
                break
            await asyncio.sleep(0.1)
        watcher.cancel()
        probe = await page.evaluate("window.__probe")
        stats = await page.evaluate("window.mpschedUi.stats()")
        polls = [s for s in stats if "fetchMs" in s]
        delays = [seen[u] - at for _, u, at in made if u in seen]
        print(
            f"\n/ui at {NODES} nodes x 8 GPUs ({gpus} GPU boxes in the DOM, rows in view only):"
            f"\n  first rows painted {paint:.0f} ms after navigation; every node loaded at "
            f"{loaded:.0f} ms"
            f"\n  {len(made)} binds in {streamed:.1f} s while scrolling; shown after "
            f"median {statistics.median(delays) * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms"
            f"\n  frame gaps: median {_pct(probe['gaps'], 0.5):.0f} ms, p99 "
            f"{_pct(probe['gaps'], 0.99):.0f} ms, max {max(probe['gaps']):.0f} ms over "
            f"{len(probe['gaps'])} frames"
            f"\n  long tasks: {len(probe['long'])}, longest {max(probe['long'], default=0):.0f} ms;"
            f" page answered a scroll in median {statistics.median(rtts) * 1000:.0f} ms, max "
            f"{max(rtts) * 1000:.0f} ms"
            f"\n  polls of /ui/changes: {len(polls)}, answered in median "
            f"{_pct([p['fetchMs'] for p in polls], 0.5):.0f} ms, max "
            f"{max(p['fetchMs'] for p in polls):.0f} ms; applied in median "
            f"{_pct([p['applyMs'] for p in polls], 0.5):.1f} ms, max "
            f"{max(p['applyMs'] for p in polls):.1f} ms; nodes per poll max "
            f"{max(p['nodes'] for p in polls)}"
            f"\n  /ui/changes timed from the test: median {_pct(feed_times, 0.5) * 1000:.0f} ms,"
            f" max {max(feed_times) * 1000:.0f} ms over {len(feed_times)} calls"
        )
        assert len(made) > BINDS // 2
        assert set(seen) == {u for _, u, _ in made}
        assert page.errors() == []
