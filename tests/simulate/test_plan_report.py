"""The HTML report of `mpsched plan` opens in headless Chromium with no console error, no
exception and no request for anything but the file itself, and its one script works (a legend
click hides a strategy's lines). Driven over the Chrome DevTools protocol on loopback; skipped,
saying why, only where no Chromium is installed (Debian's package `chromium`)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from extender.cli import main
from tests.simulate.helpers import NODE_HEADER, POD_HEADER, write_csv

CONFIG = """
budgets: {memoryReserveMiB: 0, clientOverheadMiB: 0, preVolta: share}
gpuModels:
  G2: {memoryMiB: 32768, computeCapability: "7.0"}
"""
#: Seconds for Chromium to start, and for each protocol answer.
START_S, ANSWER_S = 30.0, 20.0
#: A click that hides strategy 0's lines; the display of one of them afterwards.
CLICK = (
    "document.querySelector('.legend span[data-s=\"0\"]').click();"
    "document.querySelector('polyline[data-s=\"0\"]').style.display"
)


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    return found


class Page:
    """One page over the DevTools protocol: commands, and every event seen, kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=ANSWER_S)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    async def until(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(await self.ws.receive_json(timeout=ANSWER_S))


async def _inspect(profile: Path, url: str) -> tuple[Page, str, bytes]:
    deadline = time.monotonic() + START_S
    timeout = aiohttp.ClientTimeout(total=ANSWER_S)
    # Chromium picks its own free port (--remote-debugging-port=0) and writes it to the
    # profile's DevToolsActivePort: no port is chosen here, so none can be taken meanwhile.
    active = profile / "DevToolsActivePort"
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                port = int(active.read_text().split()[0])
                async with session.get(f"http://127.0.0.1:{port}/json/list") as answer:
                    targets = await answer.json(content_type=None)
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    break
            except (OSError, ValueError, IndexError, aiohttp.ClientError):
                pass  # not written yet, or not listening yet
            if time.monotonic() > deadline:
                raise AssertionError("chromium did not open its DevTools port")
            await asyncio.sleep(0.2)
        async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            for domain in ("Runtime", "Log", "Network", "Page"):
                await page.call(f"{domain}.enable")
            await page.call("Page.navigate", url=url)
            await page.until("Page.loadEventFired")
            clicked = await page.call("Runtime.evaluate", expression=CLICK)
            shot = await page.call("Page.captureScreenshot", format="png")
            return page, str(clicked["result"].get("value")), base64.b64decode(shot["data"])


def problems(page: Page) -> tuple[list[str], list[str]]:
    """Console errors and exceptions; URLs requested that are neither the file nor data."""
    errors, requests = [], []
    for event in page.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(json.dumps(params["exceptionDetails"])[:300])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(json.dumps(params.get("args"))[:300])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            target = params["request"]["url"]
            if not target.startswith(("file://", "data:")):
                requests.append(target)
    return errors, requests


def test_the_report_opens_in_chromium_without_errors_or_requests(tmp_path: Path) -> None:
    browser = _browser()
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    nodes = write_csv(
        tmp_path / "n.csv", NODE_HEADER, [f"n{i},64000,262144,1,G2" for i in range(3)]
    )
    rows = [
        f"p{i},1000,1024,1,{300 + 100 * (i % 5)},,LS,Running,{10 * i},{10 * i + 95},0"
        for i in range(30)
    ]
    pods = write_csv(tmp_path / "p.csv", POD_HEADER, rows)
    report = tmp_path / "plan.html"
    argv = ["plan", "--nodes", str(nodes), "--pods", str(pods), "--config", str(config)]
    assert main([*argv, "--seeds", "1,2", "--jobs", "1", "--report", str(report)]) == 0
    profile = tmp_path / "profile"
    command = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--remote-debugging-port=0", f"--user-data-dir={profile}",
        "--window-size=1200,1600", "about:blank",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        page, hidden, png = asyncio.run(_inspect(profile, report.as_uri()))
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    errors, requests = problems(page)
    assert errors == []
    assert requests == []
    assert hidden == "none"
    assert png.startswith(b"\x89PNG")
