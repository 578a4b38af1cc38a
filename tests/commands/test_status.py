"""`mpsched status` and the shared status table: rendering a fixed /status document, the HTTP
round trip against a test server (plain, and https verified with --cacert), the way through the
API server's service proxy (the fake API server, relaying to a real extender), one readable
line plus exit 1 when any of that fails, and exit 2 for bad usage."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer

from extender.cli import main
from extender.cluster import status_body
from extender.cluster.embedded import EmbeddedCluster
from extender.commands import demo
from extender.commands import status as status_cli
from extender.commands.status_table import format_status
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.service import ExtenderService
from tests.kube.fake_apiserver import FakeApiServer, serving


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


# -- https, verified with --cacert -------------------------------------------------------------


async def test_status_over_https_trusts_the_given_ca_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    cacert = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cacert))

    async def status(_: web.Request) -> web.Response:
        return web.json_response(STATUS)

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        code = await asyncio.to_thread(status_cli.run, _args(url, "--cacert", str(cacert)))
        assert (code, capsys.readouterr().out) == (0, format_status(STATUS))
        # Without it, the system's CAs do not know this one: refused, in one line.
        code = await asyncio.to_thread(status_cli.run, _args(url, "--timeout", "5"))
        captured = capsys.readouterr()
        assert code == 1
        assert captured.err.count("\n") == 1 and "certificate" in captured.err.lower()
    finally:
        await runner.cleanup()


# -- through the API server's service proxy ------------------------------------------------------


@dataclass
class ProxyingApiServer(FakeApiServer):
    """The fake API server with the service proxy subresource for one Service
    (`/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/{path}`), relaying to `upstream`
    as the real one relays to a ready endpoint, and answering its own v1.Status where the
    real one does: no such Service or port (404), no ready endpoint (503)."""

    #: namespace, service name, port name → the URL of the endpoint behind it.
    upstreams: dict[tuple[str, str, str], str] = field(default_factory=dict)
    #: The Service exists but no pod behind it is ready.
    no_endpoints: bool = False
    #: Authorization headers the proxy requests came with.
    authorizations: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = super().app()
        proxy = "/api/v1/namespaces/{ns}/services/{target}/proxy/{path:.*}"
        app.router.add_get(proxy, self._proxy)
        return app

    async def _proxy(self, request: web.Request) -> web.Response:
        gated = await self._gate(request)
        if gated is not None:
            return gated
        self.authorizations.append(request.headers.get("Authorization", ""))
        ns, target = request.match_info["ns"], request.match_info["target"]
        name, _, port = target.partition(":")
        upstream = self.upstreams.get((ns, name, port))
        if upstream is None:
            message = f'services "{name}" not found'
            body = status_body(404, "NotFound", message, name=name, kind="services")
            return web.json_response(body, status=404)
        if self.no_endpoints:
            message = f'no endpoints available for service "{name}"'
            body = status_body(503, "ServiceUnavailable", message)
            return web.json_response(body, status=503)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{upstream}/{request.match_info['path']}") as resp,
        ):
            return web.Response(
                body=await resp.read(), status=resp.status, content_type=resp.content_type
            )


@contextlib.asynccontextmanager
async def _extender_behind_api(tmp_path: Path) -> AsyncIterator[tuple[Any, ExtenderService]]:
    """A real extender on loopback and the fake API server proxying its Service to it."""
    cluster = EmbeddedCluster.from_text(demo.sample_cluster_text(), source="sample")
    service = ExtenderService(cluster=cluster, config=Config.default())
    extender = TestServer(make_app(service, HttpSettings()), host="127.0.0.1")
    await extender.start_server()
    upstream = str(extender.make_url("")).rstrip("/")
    fake = ProxyingApiServer(upstreams={("mpsched-system", "mpsched", "metrics"): upstream})
    try:
        await service.wait_ready()
        async with serving(fake, tmp_path) as served:
            yield served, service
    finally:
        await extender.close()
        await cluster.close()


def _run(*argv: str) -> int:
    return main(["status", *argv])


async def test_status_through_the_api_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with _extender_behind_api(tmp_path) as (served, service):
        code = await asyncio.to_thread(_run, "--kubeconfig", served.kubeconfig)
        out = capsys.readouterr().out
        assert code == 0
        assert out == format_status(service.status())
        code = await asyncio.to_thread(_run, "--kubeconfig", served.kubeconfig, "-o", "json")
        assert code == 0
        assert orjson.loads(capsys.readouterr().out) == orjson.loads(orjson.dumps(service.status()))
        fake = served.fake
        assert fake.requests_of("GET", "services/proxy") == 2
        assert any(
            r == "GET /api/v1/namespaces/mpsched-system/services/mpsched:metrics/proxy/status"
            for r in fake.requests
        ), fake.requests
        # With the kubeconfig's credentials.
        assert fake.authorizations == ["Bearer t", "Bearer t"]


async def test_status_through_the_api_names_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async with _extender_behind_api(tmp_path) as (served, _):
        kubeconfig = served.kubeconfig
        code = await asyncio.to_thread(_run, "--kubeconfig", kubeconfig, "--service", "nope")
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1
        assert 'services "nope" not found' in err
        code = await asyncio.to_thread(_run, "--kubeconfig", kubeconfig, "--namespace", "other")
        err = capsys.readouterr().err
        assert code == 1 and 'services "mpsched" not found' in err
        served.fake.no_endpoints = True
        code = await asyncio.to_thread(_run, "--kubeconfig", kubeconfig)
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1
        assert 'no endpoints available for service "mpsched"' in err


async def test_status_through_the_api_relays_the_extenders_refusal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async def standby(_: web.Request) -> web.Response:
        return web.json_response({"Error": "not ready"}, status=503)

    extender = await _serve(standby)
    upstream = str(extender.make_url("")).rstrip("/")
    fake = ProxyingApiServer(upstreams={("mpsched-system", "mpsched", "metrics"): upstream})
    try:
        async with serving(fake, tmp_path) as served:
            code = await asyncio.to_thread(_run, "--kubeconfig", served.kubeconfig)
    finally:
        await extender.close()
    captured = capsys.readouterr()
    assert code == 1 and captured.out == "" and captured.err.count("\n") == 1
    assert "service mpsched-system/mpsched:metrics through kubeconfig" in captured.err
    assert 'answered HTTP 503: {"Error": "not ready"}' in captured.err


async def test_status_through_the_api_is_bounded_by_the_timeout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = ProxyingApiServer(delay_s=30.0)
    async with serving(fake, tmp_path) as served:
        started = time.monotonic()
        code = await asyncio.to_thread(_run, "--kubeconfig", served.kubeconfig, "--timeout", "0.5")
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert "no answer within 0.5 s" in err
    assert took < 3.0


def test_status_without_a_readable_kubeconfig(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert _run("--kubeconfig", str(tmp_path / "missing")) == 1
    err = capsys.readouterr().err
    assert err == f"mpsched status: cannot use --kubeconfig {tmp_path / 'missing'}: " + (
        "No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--url", "notaurl"], "'notaurl' is not an http:// or https:// URL"),
        (["--url", "ftp://h/"], "'ftp://h/' is not an http:// or https:// URL"),
        (["--timeout", "0"], "'0' is not a positive number of seconds"),
        (["--timeout", "soon"], "'soon' is not a positive number of seconds"),
        (["--max-pods", "-1"], "'-1' is not a whole number >= 0"),
        (["-o", "yaml"], "invalid choice: 'yaml'"),
        (["--url", "http://h", "--kubeconfig", "k"], "--url or --kubeconfig, not both"),
        (["--url", "http://h", "--context", "c"], "--url or --context, not both"),
        (["--cacert", "ca.pem", "--url", "http://h"], "--cacert needs an https:// --url"),
        (["--cacert", "ca.pem", "--service", "s"], "--cacert is for an https --url"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_usage_exits_2_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(*argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("mpsched: usage error: ")
    assert captured.err.count("\n") == 1
    assert says in captured.err


def test_a_refused_node_inventory_is_shown_with_its_reason() -> None:
    doc = {"summary": {"nodes": 0, "refusedNodes": [{"name": "n9", "reason": "memoryMiB: big"}]}}
    assert "node n9 takes no GPU pods: memoryMiB: big" in format_status(doc)
    assert "takes no GPU pods" not in format_status(STATUS)
