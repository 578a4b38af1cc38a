"""Whole-service scenarios: `mpsched serve --kubeconfig` as a subprocess against the fake API
server in the test process, driven over HTTP exactly as kube-scheduler drives it.

The server under test is this checkout, or the checkout named by `MPSCHED_UNDER_TEST` (so the
same scenarios measure an older version: `MPSCHED_UNDER_TEST=/path/to/old pytest
tests/scenarios`). For an older server the configuration leaves out the keys it does not know.

What the scenarios count is taken from the API server's side where possible — the binds the
fake applied and the allocations written on the pods — so that they judge behaviour, not a
server's own account of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from extender.packing.codec import ALLOCATION_KEY, decode_allocation
from tests.kube.fake_apiserver import FakeApiServer, serving

ROOT = Path(__file__).resolve().parents[2]
UNDER_TEST = os.environ.get("MPSCHED_UNDER_TEST")
#: An older server reads a configuration without the keys this work added.
LEGACY = UNDER_TEST is not None
Json = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config_text(**sections: Any) -> str:
    """A configuration: no leader election (one replica), the scenario's sections on top.
    Short API timeouts keep the scenarios quick (the defaults are 4 s and 8 s)."""
    doc: dict[str, Any] = {
        "apiVersion": "mpsched.io/v1alpha1",
        "kind": "MpschedConfig",
        "leaderElection": {"enabled": False},
    }
    if not LEGACY:
        doc["api"] = {"requestTimeoutSeconds": 1.0, "bindTimeoutSeconds": 3.0}
        doc["server"] = {"metricsPort": None}  # /status on the verbs' port, as before
    for name, value in sections.items():
        if name in ("api",) and LEGACY:
            continue
        doc[name] = {**doc.get(name, {}), **value}
    return yaml.safe_dump(doc)


@dataclass
class Serve:
    """A running `mpsched serve` and the client that drives it."""

    proc: asyncio.subprocess.Process
    base: str
    http: aiohttp.ClientSession
    config: Path

    async def post(self, path: str, body: Json, *, timeout_s: float = 35.0) -> Json:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self.http.post(self.base + path, json=body, timeout=timeout) as resp:
            reply: Json = await resp.json(content_type=None)
            return reply

    async def filter(self, pod: Json, nodes: list[str]) -> list[str]:
        reply = await self.post("/filter", {"Pod": pod, "NodeNames": nodes})
        return list(reply.get("NodeNames") or [])

    async def bind(self, pod: Json, node: str, *, timeout_s: float = 35.0) -> str:
        """The bind's Error ("" on success)."""
        meta = pod["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        return str((await self.post("/bind", args, timeout_s=timeout_s)).get("Error") or "")

    async def schedule(self, pod: Json, node: str) -> str:
        """Filter then bind, as the scheduler does: the refusal, or "" when bound."""
        if node not in await self.filter(pod, [node]):
            return "filtered out"
        return await self.bind(pod, node)

    async def status(self) -> Json:
        """The /status document ({} while the server cannot give one: starting, rebuilding)."""
        async with self.http.get(self.base + "/status") as resp:
            if resp.status != 200:
                return {}
            doc: Json = await resp.json(content_type=None)
            return doc

    def reconfigure(self, text: str) -> None:
        self.config.write_text(text)

    async def stop(self, *, cap_s: float = 30.0) -> float:
        """SIGTERM; seconds until the process exited (cap_s when it did not)."""
        started = time.monotonic()
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), cap_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            return cap_s
        return time.monotonic() - started


@asynccontextmanager
async def serve(fake: FakeApiServer, tmp_path: Path, config: str) -> AsyncIterator[Serve]:
    """The fake on loopback and serve over it, ready; stopped (killed if need be) on exit."""
    async with serving(fake, tmp_path) as served:
        path = tmp_path / "mpsched.yaml"
        path.write_text(config)
        port = free_port()
        env = {**os.environ, "PYTHONPATH": UNDER_TEST or str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "extender",
            "serve",
            "--kubeconfig",
            served.kubeconfig,
            "--config",
            str(path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            env=env,
            # `python -m` looks in the working directory first: run from the checkout itself.
            cwd=UNDER_TEST or str(ROOT),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with aiohttp.ClientSession() as http:
            running = Serve(proc, f"http://127.0.0.1:{port}", http, path)
            try:
                await until(lambda: _ready(running), "serve is ready", timeout_s=60)
                yield running
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def _ready(running: Serve) -> bool:
    if running.proc.returncode is not None:
        raise AssertionError(f"serve exited with {running.proc.returncode}")
    try:
        async with running.http.get(running.base + "/readyz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def until(
    condition: Callable[[], Any], what: str, *, timeout_s: float = 30.0, every_s: float = 0.1
) -> float:
    """Poll `condition` (sync or async) until true; seconds it took. Raises on timeout."""
    started = time.monotonic()
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting until {what}")
        await asyncio.sleep(every_s)


def threads_given_out(fake: FakeApiServer, node: str, gpu: int = 0) -> int:
    """Σ threads of the allocations the API server holds on bound pods of that GPU."""
    total = 0
    for pod in fake.pods.values():
        meta = pod["metadata"]
        text = (meta.get("annotations") or {}).get(ALLOCATION_KEY)
        if not text or pod["spec"].get("nodeName") != node:
            continue
        alloc = decode_allocation(
            text, pod_uid=meta["uid"], namespace=meta["namespace"], name=meta["name"]
        )
        if any(ref.index == gpu for ref in alloc.gpus):
            total += 100 if alloc.kind == "whole" else alloc.threads
    return total


def bound(fake: FakeApiServer, name: str, namespace: str = "default") -> bool:
    return bool(fake.pods[(namespace, name)]["spec"].get("nodeName"))


async def gpu_doc(running: Serve, node: str, gpu: int = 0) -> Json:
    """That GPU's part of /status ({} when the server shows none now)."""
    doc = await running.status()
    for n in doc.get("nodes", ()):
        if n["name"] == node:
            found: Json = n["gpus"][gpu]
            return found
    return {}
