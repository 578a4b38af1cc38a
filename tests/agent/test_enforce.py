"""The agent's check of every MPS client end to end, fakes only at the edges: the fake control
daemon (a real child process answering get_server_list, get_client_list and terminate_client),
the fake NVML (MPS clients by GPU with their memory), a fake /proc (cgroup, environ, stat) and
the fake API server (pods with their allocations, Events).

One honest client and four that are outside their share, one of each kind: no thread limit,
the wrong GPU, one client too many, over its memory. Each is reported once per episode however
many samples see it; under `enforce: terminate` each is ended through the control daemon with
the reason in the Event; the honest client is never touched."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.agent.app import make_app
from extender.agent.enforce import REASON_OUTSIDE, REASON_TERMINATED
from extender.agent.mps import ControlDaemon
from extender.agent.node import NodeAgent
from extender.packing.codec import allocation_annotations
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.request import ContainerDemand
from tests.agent.fake_mps_control import commands, write_wrapper
from tests.agent.fake_nvml import H100, MIB, V100, FakeNvml, FakeProcess
from tests.agent.test_node_agent import NODE, api, config_for, session, until, write_cgroup

SERVER = 50000
HONEST = 41001
GOOD_ENV = {
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M",
}
#: pid → (pod name, GPU index, MiB used, environment, start time)
CLIENTS: dict[int, tuple[str, int, int, dict[str, str], int]] = {
    HONEST: ("honest", 0, 512, GOOD_ENV, 100),
    41002: ("unlimited", 0, 100, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}, 100),
    41003: ("elsewhere", 2, 100, GOOD_ENV, 100),
    41004: ("greedy", 0, 100, GOOD_ENV, 100),
    41005: ("greedy", 0, 100, GOOD_ENV, 200),  # the newer of greedy's two: one too many
    41006: ("hungry", 0, 3000, GOOD_ENV, 100),
}
EXPECTED = {
    41002: "no-limits",
    41003: "wrong-gpu",
    41005: "too-many-clients",
    41006: "over-memory",
}


def uid_of(name: str) -> str:
    return f"{sum(map(ord, name)):08x}-5f60-7182-93a4-b5c6d7e8f901"


def pod(name: str) -> dict[str, Any]:
    alloc = Allocation(
        pod_uid=uid_of(name),
        namespace="ml",
        name=name,
        node=NODE,
        kind="share",
        gpus=(GpuRef(0, H100.uuid),),
        threads=25,
        memory_mib=1024,
        clients=1,
        containers=(ContainerDemand("main", 25, 1024, 1),),
    )
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid_of(name),
            "annotations": allocation_annotations(alloc),
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def write_process(proc: Path, pid: int, name: str, environ: dict[str, str], started: int) -> None:
    write_cgroup(proc, pid, uid_of(name))
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in {"PATH": "/bin", **environ}.items())
    )
    fields = ["S", *["0"] * 18, str(started), *["0"] * 5]
    (proc / str(pid) / "stat").write_text(f"{pid} (python3 (app)) {' '.join(fields)}\n")


def node_gpus() -> tuple[Any, ...]:
    on = {i: [FakeProcess(pid=p, used_bytes=c[2] * MIB) for p, c in CLIENTS.items() if c[1] == i]
          for i in (0, 2)}  # fmt: skip
    return (
        dataclasses.replace(H100, mps_clients=tuple(on[0])),
        dataclasses.replace(H100, uuid="GPU-11111111-2222-3333-4444-555555555555", mps_clients=()),
        dataclasses.replace(V100, mps_clients=tuple(on[2])),
    )


@contextlib.asynccontextmanager
async def daemon_for(
    config: Any, clients: Iterable[int] = tuple(CLIENTS)
) -> AsyncIterator[ControlDaemon]:
    pipe = Path(config.webhook.pipe_directory)
    # Before the daemon starts, nothing else runs: plain file writes are fine here.
    pipe.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    (pipe / "fake-servers").write_text(f"{SERVER}\n")
    (pipe / "fake-clients").write_text("".join(f"{SERVER} {p}\n" for p in clients))
    daemon = ControlDaemon(config.agent.mps, pipe_directory=str(pipe), multi_user=False)
    task = asyncio.create_task(daemon.run())
    try:
        await until(lambda: daemon.health().state == "ready", "daemon ready")
        yield daemon
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await daemon.stop()


@pytest.mark.parametrize("enforce", ["report", "terminate"])
async def test_each_client_outside_its_share_is_found_once_and_ended_when_asked(
    tmp_path: Path, enforce: str
) -> None:
    config = config_for(tmp_path, binary=write_wrapper(tmp_path), enforce=enforce)
    for pid, (name, _, _, environ, started) in CLIENTS.items():
        write_process(tmp_path / "proc", pid, name, environ, started)
    async with (
        api(tmp_path) as (fake, cluster),
        session(FakeNvml(node_gpus())) as nvml,
        daemon_for(config) as daemon,
    ):
        for name in {c[0] for c in CLIENTS.values()}:
            fake.put(pod(name))
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon)
        for _ in range(3):
            await agent.sample()
        async with TestClient(TestServer(make_app(agent))) as http:
            status = (await (await http.get("/status")).json())["clients"]
        await agent.publish()
        metrics = agent.metrics.render().decode()
    found = {f.pid: f.kind for f in agent.checks.state.findings}
    assert found == EXPECTED
    outside = [e for e in fake.events if e.get("reason") == REASON_OUTSIDE]
    # once per episode: three samples, one Event each
    assert sorted(e["involvedObject"]["name"] for e in outside) == [
        "elsewhere", "greedy", "hungry", "unlimited",
    ]  # fmt: skip
    assert all(e["type"] == "Warning" for e in outside)
    by_pod = {e["involvedObject"]["name"]: e["message"] for e in outside}
    assert "started without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in by_pod["unlimited"]
    assert "runs on GPU 2; its pod was given GPU 0" in by_pod["elsewhere"]
    assert "one of 2 MPS clients of its pod on GPU 0, allowed 1" in by_pod["greedy"]
    assert "use 3000 MiB on GPU 0, allowed 1024 MiB" in by_pod["hungry"]
    sent = [c for c in commands(tmp_path / "log") if c.startswith("terminate_client")]
    ended = [e for e in fake.events if e.get("reason") == REASON_TERMINATED]
    if enforce == "report":
        assert sent == [] and ended == []
        assert status["terminated"] == 0
    else:
        assert sorted(sent) == [f"terminate_client {SERVER} {pid}" for pid in sorted(EXPECTED)]
        assert len(ended) == 4
        assert {e["involvedObject"]["name"] for e in ended} == {
            "elsewhere", "greedy", "hungry", "unlimited",
        }  # fmt: skip
        assert "started without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in next(
            e["message"] for e in ended if e["involvedObject"]["name"] == "unlimited"
        )
        assert status["terminated"] == 4
    # the honest client: never named, never ended
    assert all(str(HONEST) not in c for c in sent)
    assert all(str(HONEST) not in e["message"] for e in fake.events)
    assert sorted(f["pid"] for f in status["outsideShare"]) == sorted(EXPECTED)
    assert status["enforce"] == enforce
    assert status["episodes"] == {
        "no-limits": 1,
        "wrong-gpu": 1,
        "too-many-clients": 1,
        "over-memory": 1,
        "no-allocation": 0,
    }
    assert 'mpsched_agent_mps_clients_outside_share{kind="no-limits",node="gpu-node-1"} 1.0' in (
        metrics
    )


async def test_a_new_episode_is_reported_again(tmp_path: Path) -> None:
    """A finding that went away and came back is a new episode: one more Event."""
    config = config_for(tmp_path, binary=write_wrapper(tmp_path))
    write_process(tmp_path / "proc", 41002, "unlimited", {}, 100)
    gpus = (dataclasses.replace(H100, mps_clients=(FakeProcess(pid=41002, used_bytes=MIB),)),)
    async with (
        api(tmp_path) as (fake, cluster),
        session(FakeNvml(gpus)) as nvml,
        daemon_for(config) as daemon,
    ):
        fake.put(pod("unlimited"))
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon)
        await agent.sample()
        await agent.sample()
        (tmp_path / "proc" / "41002" / "environ").write_bytes(
            b"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\0CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\0"
        )
        await agent.sample()
        assert agent.checks.state.findings == ()
        (tmp_path / "proc" / "41002" / "environ").write_bytes(b"PATH=/bin\0")
        await agent.sample()
    outside = [e for e in fake.events if e.get("reason") == REASON_OUTSIDE]
    assert len(outside) == 2


async def test_a_sidecar_given_no_share_that_reached_mps_is_found_and_ended(tmp_path: Path) -> None:
    """The issue's bypass: a container that asked for nothing reaches the daemon with the
    pod's own limits copied (or any); its cgroup names its container, the pod's status names
    the container, and the container was given no share."""
    config = config_for(tmp_path, binary=write_wrapper(tmp_path), enforce="terminate")
    sidecar_id = "5e" * 32
    proc = tmp_path / "proc"
    write_process(proc, 41010, "twins", GOOD_ENV, 100)
    uid = uid_of("twins").replace("-", "_")
    (proc / "41010" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{sidecar_id}.scope\n"
    )
    gpus = (dataclasses.replace(H100, mps_clients=(FakeProcess(pid=41010, used_bytes=MIB),)),)
    twins = pod("twins")
    twins["status"]["containerStatuses"] = [
        {"name": "main", "containerID": "containerd://" + "4d" * 32},
        {"name": "helper", "containerID": f"containerd://{sidecar_id}"},
    ]
    async with (
        api(tmp_path) as (fake, cluster),
        session(FakeNvml(gpus)) as nvml,
        daemon_for(config, clients=(41010,)) as daemon,
    ):
        fake.put(twins)
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon)
        await agent.sample()
    [finding] = agent.checks.state.findings
    assert (finding.kind, finding.pid) == ("no-limits", 41010)
    assert "container 'helper', which was given no GPU share" in finding.text
    assert f"terminate_client {SERVER} 41010" in commands(tmp_path / "log")
