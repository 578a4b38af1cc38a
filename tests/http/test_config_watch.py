"""`serve --config FILE`'s watch: a document that fails, however it fails, is logged and
reported (`config.error` in /status, `mpsched_config_valid 0`), and a later valid file is
applied: the watch never dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.commands import serve as serve_cli
from extender.config import load_config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node


@contextlib.asynccontextmanager
async def watched(path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ExtenderService]:
    monkeypatch.setattr(serve_cli, "CONFIG_POLL_S", 0.02)
    cluster = EmbeddedCluster.from_objects([gpu_node("n1")])
    service = ExtenderService(cluster=cluster, config=load_config(path), config_source=str(path))
    app = make_app(service, HttpSettings())
    await asyncio.wait_for(service.start(), 10)
    watch = serve_cli._watch_config(app, str(path))
    await anext(watch)
    await asyncio.sleep(0.3)  # the watch takes the file's first stamp in a thread of its own
    try:
        yield service
    finally:
        with contextlib.suppress(StopAsyncIteration):
            await anext(watch)
        await service.close()


def write(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a distinct modification time, whatever the clock


async def until(what: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if what():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s")


async def test_a_deeply_nested_file_is_reported_and_a_later_valid_one_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: RecursionError ended the watch's task without a line; config.error stayed null
    and the valid file written next was never applied."""
    caplog.set_level(logging.INFO)
    path = tmp_path / "mpsched.yaml"
    write(path, "policy: {name: default}\n", 10**18)
    async with watched(path, monkeypatch) as service:
        write(path, "[" * 20_000, 2 * 10**18)
        await until(lambda: service.status()["config"]["error"] is not None)
        assert "nested deeper than 32 levels" in service.status()["config"]["error"]
        assert not (await service.metrics_sample()).config_ok
        assert "rejected, keeping the last good one" in caplog.text
        write(path, "policy: {name: bestfit}\n", 3 * 10**18)
        await until(lambda: service.config.policy.name == "bestfit")
        assert service.status()["config"]["error"] is None
        assert (await service.metrics_sample()).config_ok


async def test_any_failure_while_loading_is_reported_and_the_watch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mpsched.yaml"
    write(path, "policy: {name: default}\n", 10**18)
    real = load_config
    failures = iter([MemoryError("out of memory")])

    def failing_once(source: str) -> object:
        for exc in failures:
            raise exc
        return real(source)

    async with watched(path, monkeypatch) as service:
        monkeypatch.setattr(serve_cli, "load_config", failing_once)
        write(path, "policy: {name: spread}\n", 2 * 10**18)
        await until(lambda: service.status()["config"]["error"] is not None)
        assert "MemoryError" in service.status()["config"]["error"]
        assert "MemoryError" in caplog.text
        write(path, "policy: {name: spread}  # again\n", 3 * 10**18)
        await until(lambda: service.config.policy.name == "spread")
        assert service.status()["config"]["error"] is None
