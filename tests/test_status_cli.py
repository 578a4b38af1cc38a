"""`mpsched status` and the shared status table: rendering a fixed /status document, the HTTP
round trip against a test server, and one readable line plus exit 1 when that fails."""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http import demo, status_cli
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.http.status_table import format_status
from extender.service import ExtenderService


def _gpu(index: int, **over: Any) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index}",
        "model": "NVIDIA H100 80GB HBM3",
        "memoryMiB": 81559,
        "computeCapability": "9.0",
        "mps": "ready",
        "threads": {"used": 0, "capacity": 100},
        "memory": {"usedMiB": 0, "capacityMiB": 81303},
        "clients": {"used": 0, "capacity": 48},
        "wholeOwner": None,
        "pods": [],
    }
    gpu.update(over)
    return gpu


def _pod(name: str, threads: int, memory: int, *, state: str = "confirmed") -> dict[str, Any]:
    return {
        "namespace": "ml",
        "name": name,
        "uid": f"uid-{name}",
        "threads": threads,
        "memoryMiB": memory,
        "clients": 1,
        "state": state,
    }


STATUS: dict[str, Any] = {
    "nodes": [
        {
            "name": "gpu-h100-1",
            "gpus": [
                _gpu(
                    0,
                    threads={"used": 75, "capacity": 100},
                    memory={"usedMiB": 61285, "capacityMiB": 81303},
                    clients={"used": 2, "capacity": 48},
                    pods=[_pod("serve", 50, 40960), _pod("embed", 25, 20325, state="assumed")],
                ),
                _gpu(1, wholeOwner="research/trainer-0"),
            ],
        },
        {
            "name": "gpu-p100-1",
            "gpus": [
                _gpu(
                    0,
                    model="Tesla P100-PCIE-16GB",
                    computeCapability="6.0",
                    threads={"used": 0, "capacity": 0},
                    memory={"usedMiB": 0, "capacityMiB": 0},
                    clients={"used": 0, "capacity": 0},
                )
            ],
        },
        {"name": "cpu-1", "gpus": []},
    ],
    "summary": {
        "nodes": 3,
        "gpus": 3,
        "pods": 3,
        "threadsUsedPct": 58.333,
        "fragmentationPct": 12.5,
    },
    "config": {"policy": "default", "source": "/etc/mpsched/config.yaml", "error": None},
}


def test_table_shows_every_node_gpu_budget_and_pod() -> None:
    text = format_status(STATUS)
    lines = text.splitlines()
    assert lines[0] == "gpu-h100-1  (2 GPUs)"
    row0 = next(line for line in lines if "ml/serve" in line)
    for cell in ("9.0", "ready", "75/100", "61285/81303", "2/48", "ml/serve 50%/40960Mi"):
        assert cell in row0
    assert "ml/embed* 25%/20325Mi" in row0
    assert any("whole: research/trainer-0" in line for line in lines)
    assert any("Tesla P100-PCIE-16GB" in line and "0/0" in line for line in lines)
    assert "cpu-1  (0 GPUs)" in lines
    assert "  no GPU inventory" in lines
    assert "* assumed: reserved by the extender, not yet seen in the cluster" in lines
    assert "3 nodes, 3 GPUs, 3 pods; threads used 58.3%; fragmentation 12.5%" in lines
    assert "policy default, config /etc/mpsched/config.yaml" in lines


def test_table_columns_line_up() -> None:
    lines = [line for line in format_status(STATUS).splitlines() if line.startswith("  ")]
    header = lines[0]
    pods_at = header.index("PODS")
    h100_rows = lines[1:3]
    assert all(len(r) >= pods_at for r in h100_rows)
    assert h100_rows[0][pods_at:].startswith("ml/serve")
    assert h100_rows[1][pods_at:].startswith("whole:")


def test_long_pod_lists_are_cut_and_counted() -> None:
    pods = [_pod(f"p{i}", 2, 100) for i in range(11)]
    doc = {"nodes": [{"name": "n", "gpus": [_gpu(0, pods=pods)]}]}
    text = format_status(doc, max_pods_per_gpu=3)
    assert "ml/p0 2%/100Mi, ml/p1 2%/100Mi, ml/p2 2%/100Mi +8 more" in text
    assert "ml/p3" not in text


def test_table_survives_a_partial_or_odd_document() -> None:
    assert format_status({}) == "no nodes\n"
    doc = {
        "nodes": [{"name": "n", "gpus": [{"index": 0, "threads": "lots"}, "junk"]}, "junk"],
        "summary": {"nodes": 1},
        "config": {"policy": "bestfit", "source": None, "error": "line 3: unknown key 'polcy'"},
    }
    text = format_status(doc)
    assert "n  (1 GPU)" in text
    row = next(line for line in text.splitlines() if line.startswith("  0 "))
    assert row.split() == ["0", "?", "?", "?", "?", "?", "?", "-"]
    assert "1 node, ? GPUs, ? pods; threads used ?; fragmentation ?" in text
    assert "policy bestfit, config built-in (last reload failed: line 3: unknown key 'polcy')" in (
        text
    )


def _args(url: str, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    status_cli.add_arguments(parser)
    return parser.parse_args(["--url", url, *extra])


async def _serve(handler: Any) -> TestServer:
    app = web.Application()
    app.router.add_get("/status", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def test_status_prints_the_table_from_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    async def status(_: web.Request) -> web.Response:
        return web.json_response(STATUS)

    server = await _serve(status)
    try:
        url = str(server.make_url("/"))
        # run() owns its event loop (asyncio.run), so it runs in a thread here, as it would in
        # a process of its own.
        code = await asyncio.to_thread(status_cli.run, _args(url))
        out = capsys.readouterr().out
        assert code == 0
        assert out == format_status(STATUS)
        code = await asyncio.to_thread(status_cli.run, _args(url + "status", "--json"))
        assert code == 0
        assert orjson.loads(capsys.readouterr().out) == STATUS
    finally:
        await server.close()


async def test_status_reports_an_http_error(capsys: pytest.CaptureFixture[str]) -> None:
    async def status(_: web.Request) -> web.Response:
        return web.Response(status=503, text="not the leader")

    server = await _serve(status)
    try:
        code = await asyncio.to_thread(status_cli.run, _args(str(server.make_url("/"))))
    finally:
        await server.close()
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "answered HTTP 503: not the leader" in captured.err


def test_status_on_an_unreachable_url_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The socket is closed: nothing listens on that port now.
    code = status_cli.run(_args(f"http://127.0.0.1:{port}", "--timeout", "5"))
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.startswith(f"mpsched status: cannot reach http://127.0.0.1:{port}/status")
    assert captured.err.count("\n") == 1


def test_status_url_is_built_from_a_base_or_taken_as_is() -> None:
    assert status_cli.status_url("http://h:8888") == "http://h:8888/status"
    assert status_cli.status_url("http://h:8888/") == "http://h:8888/status"
    assert status_cli.status_url("http://h/ext/status") == "http://h/ext/status"


async def test_status_against_the_real_extender(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = EmbeddedCluster.from_text(demo.sample_cluster_text(), source="sample")
    service = ExtenderService(cluster=cluster, config=Config.default())
    server = TestServer(make_app(service, HttpSettings()), host="127.0.0.1")
    await server.start_server()
    try:
        for _ in range(200):  # the ledger is built in the background; /readyz says when
            if service.ready:
                break
            await asyncio.sleep(0.02)
        assert service.ready
        code = await asyncio.to_thread(status_cli.run, _args(str(server.make_url("/"))))
        out = capsys.readouterr().out
    finally:
        await server.close()
        await cluster.close()
    assert code == 0
    assert out == format_status(service.status())
    for node in ("gpu-h100-1", "gpu-a100-1", "gpu-l4-1", "gpu-v100-1", "gpu-p100-1"):
        assert f"{node}  (" in out
    assert "ml-infer/llm-serve-7d9f8-x2k4q 50%/40960Mi" in out
    assert "whole: research/trainer-llama-0" in out
