"""`kubectl mpsched` (the `kubectl-mpsched` console script) against a real extender over the
embedded sample cluster, reached through the fake API server's service proxy, and a node agent's
real metrics rendering reached through its pod proxy:

- `why POD` prints, per node, the reason the extender's filter gave for a pod it refused, the
  very reasons `/filter` answered; a bound pod is said to be bound; an unknown pod is one line;
- `status` prints the table `mpsched status` prints;
- `top` prints each pod's share beside what the agent saw it use;
- one line and exit 1 when the extender cannot be found, exit 2 for bad usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from extender.agent.metrics import AgentMetrics, AgentSnapshot, GpuSnapshot, PodSnapshot
from extender.cli import main as mpsched
from extender.cluster.embedded import EmbeddedCluster
from extender.commands import demo, kubectl
from extender.commands.kubectl_tables import AgentMetricsError, format_why, parse_agent_metrics
from extender.commands.status_table import format_status
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.service import ExtenderService
from tests.http.kube_objects import pod
from tests.kube.fake_apiserver import serving
from tests.ui.fake_proxy import ProxyingApiServer

LLM = ("ml-infer", "llm-serve-7d9f8-x2k4q", "6bf46c69-7d2c-4f82-aeea-cbe226e87555")
EMBEDDER = ("ml-infer", "embedder-5c6b7-p8r2m", "13deef86-ab10-41d0-b646-e1f40a097c97")
#: Pending, and too large for any GPU but an empty H100's.
BIG = pod("big-0", namespace="ml", threads=80, memory="40Gi", uid="uid-big-0")
AGENT = {
    "kind": "Pod",
    "apiVersion": "v1",
    "metadata": {
        "name": "mpsched-agent-h100",
        "namespace": "mpsched-node",
        "uid": "uid-agent",
        "labels": {"app.kubernetes.io/name": "mpsched-agent"},
    },
    "spec": {"nodeName": "gpu-h100-1", "containers": [{"name": "agent"}]},
    "status": {"phase": "Running"},
}


def agent_snapshot() -> AgentSnapshot:
    gpu = GpuSnapshot(
        index=0,
        uuid="GPU-6513270e-269e-4d37-b2a7-4de452e6b438",
        model="NVIDIA H100 80GB HBM3",
        mps="ready",
        utilization_percent=40,
        memory_used_mib=55000,
        memory_total_mib=81559,
        mps_clients=2,
    )
    pods = (
        PodSnapshot(
            namespace=LLM[0], name=LLM[1], uid=LLM[2], gpu_index=0, used_mib=30000,
            allowed_mib=40960, over_share=False, clients=1,
        ),
        PodSnapshot(
            namespace=EMBEDDER[0], name=EMBEDDER[1], uid=EMBEDDER[2], gpu_index=0,
            used_mib=25000, allowed_mib=20325, over_share=True, clients=1,
        ),
    )  # fmt: skip
    return AgentSnapshot(node="gpu-h100-1", gpus=(gpu,), pods=pods, daemon_up=True)


@dataclass
class Setup:
    service: ExtenderService
    extender_url: str
    kubeconfig: str
    fake: ProxyingApiServer
    #: The fake API server's URL.
    api_url: str


@contextlib.asynccontextmanager
async def plugin_setup(tmp_path: Path) -> AsyncIterator[Setup]:
    doc = yaml.safe_load(demo.sample_cluster_text())
    cluster = EmbeddedCluster.from_objects([*doc["items"], BIG])
    service = ExtenderService(cluster=cluster, config=Config.default())
    extender = TestServer(make_app(service, HttpSettings()), host="127.0.0.1")
    metrics = AgentMetrics()
    metrics.update(agent_snapshot())

    async def agent_metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    agent_app = web.Application()
    agent_app.router.add_get("/metrics", agent_metrics)
    agent = TestServer(agent_app, host="127.0.0.1")
    await extender.start_server()
    await agent.start_server()
    fake = ProxyingApiServer(
        services={("mpsched-system", "mpsched", "metrics"): str(extender.make_url("")).rstrip("/")},
        pod_ports={
            ("mpsched-node", "mpsched-agent-h100", "9465"): str(agent.make_url("")).rstrip("/")
        },
    )
    for obj in doc["items"]:
        if obj["kind"] == "Pod":
            fake.put(obj)
    fake.put(BIG)
    fake.put(AGENT)
    try:
        await service.wait_ready()
        async with serving(fake, tmp_path) as served:
            extender_url = str(extender.make_url("")).rstrip("/")
            yield Setup(service, extender_url, served.kubeconfig, fake, served.url)
    finally:
        await agent.close()
        await extender.close()
        await cluster.close()


async def _plugin(*argv: str) -> int:
    return await asyncio.to_thread(kubectl.main, list(argv))


async def _filter(setup: Setup, body: dict[str, Any]) -> dict[str, Any]:
    """POST /filter as kube-scheduler does, for every node but the H100 one (and a node
    without GPUs)."""
    status = setup.service.status()
    names = [n["name"] for n in status["nodes"] if n["name"] != "gpu-h100-1"] + ["cpu-1"]
    args = orjson.dumps({"Pod": body, "NodeNames": names})
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{setup.extender_url}/filter", data=args) as resp,
    ):
        answer = await resp.json()
    return {
        "passed": answer["NodeNames"],
        "failed": answer["FailedNodes"] or {},
        "never": answer["FailedAndUnresolvableNodes"] or {},
    }


async def test_why_prints_filters_reason_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with plugin_setup(tmp_path) as setup:
        # Before any filter call: nothing to say, in one line.
        code = await _plugin("--kubeconfig", setup.kubeconfig, "why", "big-0", "-n", "ml")
        captured = capsys.readouterr()
        assert code == 1 and captured.err.count("\n") == 1
        assert "no filter call remembered for pod ml/big-0" in captured.err

        answer = await _filter(setup, BIG)
        assert answer["passed"] == []
        refused = {**answer["failed"], **answer["never"]}
        assert len(refused) == 6
        code = await _plugin("--kubeconfig", setup.kubeconfig, "why", "big-0", "-n", "ml")
        out = capsys.readouterr().out
        assert code == 0
        lines = out.splitlines()
        assert lines[0].startswith("ml/big-0: the last filter call (")
        assert lines[0].endswith("passed 0 node(s) and refused 6")
        table = lines[lines.index(next(x for x in lines if x.startswith("NODE"))) + 1 :]
        assert len(table) == 6
        for node, reason in refused.items():
            tail = "  (no eviction can help)" if node in answer["never"] else ""
            assert any(line.split()[0] == node and line.endswith(reason + tail) for line in table)
        assert "cpu-1" in answer["never"]
        # The per-reason counts add up to the nodes refused.
        counts = [int(x.split()[0]) for x in lines[1 : lines.index("")]]
        assert sum(counts) == 6

        # Through `mpsched kubectl` too, the same output.
        code = await asyncio.to_thread(
            mpsched, ["kubectl", "--kubeconfig", setup.kubeconfig, "why", "big-0", "-n", "ml"]
        )
        assert (code, capsys.readouterr().out) == (0, out)
        # kubectl's flags after the verb, as kubectl users write them.
        code = await _plugin("why", "big-0", "-n", "ml", "--kubeconfig", setup.kubeconfig)
        assert (code, capsys.readouterr().out) == (0, out)
        # And at the extender's own listener (--url, no API server).
        code = await _plugin("--url", setup.extender_url, "why", "big-0", "-n", "ml")
        assert (code, capsys.readouterr().out) == (0, out)

        # A bound pod is not pending; an unknown one does not exist.
        code = await _plugin("--kubeconfig", setup.kubeconfig, "why", LLM[1], "-n", LLM[0])
        assert code == 0
        assert (
            capsys.readouterr().out
            == f"{LLM[0]}/{LLM[1]} is not pending: it is bound to node gpu-h100-1\n"
        )
        code = await _plugin("--kubeconfig", setup.kubeconfig, "why", "nope", "-n", "ml")
        captured = capsys.readouterr()
        assert code == 1
        assert captured.err == 'kubectl mpsched why: pod "nope" not found in namespace "ml"\n'
        proxy = "GET /api/v1/namespaces/mpsched-system/services/mpsched:metrics/proxy"
        assert f"{proxy}/status/why/ml/big-0" in setup.fake.requests


async def test_status_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with plugin_setup(tmp_path) as setup:
        code = await _plugin("--kubeconfig", setup.kubeconfig, "status")
        assert (code, capsys.readouterr().out) == (0, format_status(setup.service.status()))
        code = await _plugin("--kubeconfig", setup.kubeconfig, "status", "-o", "json")
        doc = orjson.loads(capsys.readouterr().out)
        assert code == 0 and doc == orjson.loads(orjson.dumps(setup.service.status()))


async def test_top_shows_use_against_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with plugin_setup(tmp_path) as setup:
        code = await _plugin("--kubeconfig", setup.kubeconfig, "top", "-n", "ml-infer")
        out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {f"{LLM[0]}/{LLM[1]}", f"{EMBEDDER[0]}/{EMBEDDER[1]}"}
    assert rows[f"{LLM[0]}/{LLM[1]}"][1:] == ["gpu-h100-1", "0", "50%", "30000/40960", "1/1", "ok"]
    assert rows[f"{EMBEDDER[0]}/{EMBEDDER[1]}"][1:] == [
        "gpu-h100-1", "0", "25%", "25000/20325", "1/1", "OVER", "SHARE",
    ]  # fmt: skip
    assert out.splitlines()[0].split()[:4] == ["POD", "NODE", "GPU", "THREADS"]


async def test_top_of_every_namespace_says_where_no_use_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with plugin_setup(tmp_path) as setup:
        code = await _plugin("--kubeconfig", setup.kubeconfig, "top", "-A")
        out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "research/trainer-llama-0" in rows and "legacy/cuda-sim-0" in rows
    assert rows["research/trainer-llama-0"].endswith("no usage published")
    assert "whole" in rows["legacy/cuda-sim-0"]


async def test_a_missing_extender_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with plugin_setup(tmp_path) as setup:
        code = await _plugin(
            "--kubeconfig", setup.kubeconfig, "--extender-service", "nope", "status"
        )
    captured = capsys.readouterr()
    assert code == 1 and captured.err.count("\n") == 1
    assert captured.err.startswith("kubectl mpsched status: ")
    assert 'services "nope" not found' in captured.err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "the following arguments are required: verb"),
        (["why"], "the following arguments are required: POD"),
        (["frob"], "invalid choice: 'frob'"),
        (["--timeout", "0", "status"], "'0' is not a positive number of seconds"),
        (["status", "-o", "yaml"], "invalid choice: 'yaml'"),
    ],
)
def test_bad_usage_exits_2_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kubectl.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.startswith("kubectl mpsched: usage error")


def test_the_plugin_is_on_path() -> None:
    """pyproject installs the console script kubectl finds plugins by (`kubectl-NAME`)."""
    here = Path(sys.executable).parent / "kubectl-mpsched"
    found = str(here) if here.exists() else shutil.which("kubectl-mpsched")
    if found is None:
        pytest.skip("the project is not installed in this environment (pip install -e .)")
    assert Path(found).read_text().count("extender.commands.kubectl") == 1


def test_why_says_when_its_reasons_are_for_an_earlier_pod_of_that_name() -> None:
    doc = {"namespace": "ml", "name": "p", "uid": "old", "filteredAt": 0, "passed": 0}
    doc["nodes"] = [{"node": "n1", "reason": "no GPU has room", "resolvable": True}]
    out = format_why(doc, pod={"metadata": {"uid": "new"}})
    assert out.splitlines()[1] == (
        "note: these reasons are for an earlier pod of that name (uid old); "
        "the extender has not filtered new yet"
    )
    assert "note:" not in format_why(doc, pod={"metadata": {"uid": "old"}})


def test_agent_metrics_are_read_by_node_pod_and_gpu() -> None:
    metrics = AgentMetrics()
    metrics.update(agent_snapshot())
    usage = parse_agent_metrics(metrics.render().decode())
    llm = usage[("gpu-h100-1", LLM[2], 0)]
    assert (llm.used_mib, llm.allowed_mib, llm.clients, llm.over_share) == (30000, 40960, 1, False)
    assert usage[("gpu-h100-1", EMBEDDER[2], 0)].over_share
    with pytest.raises(AgentMetricsError):
        parse_agent_metrics('mpsched_agent_pod_mps_clients{node="n" 1\n')
