"""A real `mpsched serve` subprocess for the observability tests, and reading its /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from extender_bench.processes import free_ports


def free_port() -> int:
    """A free loopback port below the ephemeral range (see `free_ports`)."""
    (port,) = free_ports(1)
    return port


@dataclass(frozen=True)
class Serve:
    proc: asyncio.subprocess.Process
    base: str
    metrics: str


@contextlib.asynccontextmanager
async def serve(*args: str) -> AsyncIterator[Serve]:
    """`mpsched serve ARGS` on free loopback ports (verbs and metrics apart); SIGTERM at the end.
    stderr is piped: read it with `stop()` after the block."""
    port, metrics_port = free_ports(2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "extender",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield Serve(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def wait_for(url: str, *, status: int = 200, timeout_s: float = 15.0) -> None:
    """Poll `url` until it answers `status`."""
    async with aiohttp.ClientSession() as http:
        for _ in range(int(timeout_s / 0.05)):
            try:
                async with http.get(url) as resp:
                    if resp.status == status:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered {status}")


async def scrape(base: str) -> str:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def samples(text: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def exported_names(text: str) -> set[str]:
    """Every series name the exposition declares or shows: sample names (`_total`, `_bucket`,
    ...) and family names, so a labelled family with no child yet counts too."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        names.update(s.name for s in family.samples)
    return names


def value(found: Sequence[Sample], name: str, **labels: str) -> float:
    matching = [
        s for s in found if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matching) == 1, (name, labels, matching)
    return matching[0].value
