"""The agent's listener: /readyz only once the node's facts were published, /metrics as
Prometheus text from the latest snapshot, /healthz always."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from extender.agent.app import make_app
from extender.agent.node import NodeAgent
from tests.agent.fake_nvml import MIXED_NODE, FakeNvml
from tests.agent.test_node_agent import NODE, api, config_for, session


async def test_ready_once_published_and_metrics_from_the_snapshot(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    async with api(tmp_path) as (_fake, cluster), session(FakeNvml(MIXED_NODE)) as nvml:
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        async with TestClient(TestServer(make_app(agent))) as client:
            assert (await client.get("/healthz")).status == 200
            assert (await client.get("/readyz")).status == 503
            await agent.publish()
            ready = await client.get("/readyz")
            assert ready.status == 200 and (await ready.json())["node"] == NODE
            metrics = await client.get("/metrics")
            assert metrics.headers["Content-Type"].startswith("text/plain")
            text = await metrics.text()
    assert "mpsched_agent_gpu_memory_total_mib{" in text
    assert text.count("mpsched_agent_gpu_memory_total_mib{") == len(MIXED_NODE)
