"""A small Chrome DevTools Protocol client for the browser tests: Debian's `chromium`, headless,
driven over its DevTools websocket with aiohttp (no selenium, no downloaded driver).

`launch()` starts a browser with its own profile, every background service off (no update
checks, no sync, no component downloads) and the DevTools port on loopback; `Browser.page()`
opens a tab and connects to it. A `Page` records every protocol event it receives, so a test
can ask afterwards which URLs the page requested (`requested_urls`) and whether anything was
logged as an error (`errors`). `chromium_or_skip()` skips a test, with the reason, where no
chromium is installed (`scripts/test` installs it where it can).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

#: Names Debian and others install the browser under.
NAMES = ("chromium", "chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--mute-audio",
    # A tab the test drives is never "in the background": its timers and frames run as in a
    # window someone is looking at.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
Json = dict[str, Any]


def chromium() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p is not None), None)


def chromium_or_skip() -> str:
    path = chromium()
    if path is None:
        pytest.skip(
            "no chromium on PATH: scripts/test installs Debian's chromium when run as root "
            "with apt-get; elsewhere install it (apt-get install chromium) to run this test"
        )
    return path


class CdpError(Exception):
    """The browser answered a command with an error, or the page threw."""


@dataclass
class Page:
    """One tab's DevTools session."""

    ws: aiohttp.ClientWebSocketResponse
    events: list[tuple[str, Json]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _waiting: dict[int, asyncio.Future[Json]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None
    _seen: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = msg.json()
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self.events.append((data["method"], data.get("params", {})))
                self._seen.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(CdpError("the browser closed the connection"))

    async def send(self, method: str, timeout_s: float = 30.0, **params: Any) -> Json:
        call_id = next(self._ids)
        future: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        answer = await asyncio.wait_for(future, timeout_s)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error'].get('message')}")
        result: Json = answer.get("result", {})
        return result

    async def wait_event(
        self, method: str, where: Callable[[Json], bool] = lambda _: True, timeout_s: float = 30
    ) -> Json:
        """The first event `method` (already received or to come) for which `where` holds."""
        async with asyncio.timeout(timeout_s):
            checked = 0
            while True:
                for name, params in self.events[checked:]:
                    if name == method and where(params):
                        return params
                checked = len(self.events)
                self._seen.clear()
                await self._seen.wait()

    async def evaluate(self, expression: str, timeout_s: float = 30.0) -> Any:
        """The value of `expression` in the page (promises awaited), as JSON."""
        result = await self.send(
            "Runtime.evaluate",
            timeout_s,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{expression[:60]!r} threw: {text}")
        return result["result"].get("value")

    async def wait_for(
        self, expression: str, timeout_s: float = 10.0, every_s: float = 0.05
    ) -> Any:
        """Poll `expression` until it is truthy; its value."""
        async with asyncio.timeout(timeout_s):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await asyncio.sleep(every_s)

    async def navigate(self, url: str, timeout_s: float = 30.0) -> None:
        loaded = len(self.events)
        await self.send("Page.navigate", url=url)
        async with asyncio.timeout(timeout_s):
            while not any(m == "Page.loadEventFired" for m, _ in self.events[loaded:]):
                self._seen.clear()
                await self._seen.wait()

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))

    def requested_urls(self) -> list[str]:
        return [p["request"]["url"] for m, p in self.events if m == "Network.requestWillBeSent"]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors, in words."""
        out = []
        for method, p in self.events:
            if method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value")) for a in p["args"]))
            elif method == "Runtime.exceptionThrown":
                out.append("exception: " + str(p["exceptionDetails"].get("text")))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log: {p['entry']['text']} ({p['entry'].get('url', '')})")
        return out

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            await self._reader


@dataclass
class Browser:
    http: aiohttp.ClientSession
    port: int

    @contextlib.asynccontextmanager
    async def page(self, *, width: int = 1400, height: int = 900) -> AsyncIterator[Page]:
        """A new tab with the Page, Runtime, Network and Log domains on."""
        base = f"http://127.0.0.1:{self.port}"
        async with self.http.put(f"{base}/json/new?about:blank") as resp:
            target = await resp.json()
        ws = await self.http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = Page(ws)
        page.start()
        try:
            for domain in ("Page", "Runtime", "Network", "Log"):
                await page.send(f"{domain}.enable")
            await page.send("Page.bringToFront")
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            yield page
        finally:
            await page.close()


@contextlib.asynccontextmanager
async def launch(profile: Path, *, binary: str | None = None) -> AsyncIterator[Browser]:
    """A headless chromium with its profile in `profile` (a fresh folder), killed at the end."""
    path = binary or chromium_or_skip()
    proc = await asyncio.create_subprocess_exec(
        path,
        *FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        port = None
        seen: list[str] = []
        async with asyncio.timeout(30):
            while port is None:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise CdpError("chromium exited before DevTools listened: " + "".join(seen))
                seen.append(line)
                found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                if found:
                    port = int(found.group(1))
        # Keep reading its stderr so that the pipe never fills and stalls the browser.
        drain = asyncio.get_running_loop().create_task(_drain(proc.stderr))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            yield Browser(http, port)
        drain.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
