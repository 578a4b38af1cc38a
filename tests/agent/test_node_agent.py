"""The node agent end to end, with fakes only at the edges: the fake NVML (pynvml's own errors),
the fake `nvidia-cuda-mps-control` (a real child process on a unix socket), the fake API server
(merge patches, resourceVersions, request counts) and a fake /proc. What it publishes is read
back with the extender's own decoder, so the test also shows what the extender would place."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from extender.agent.deviceplugin import DevicePlugin
from extender.agent.inventory import AGENT_KEY, MPS_READY_LABEL
from extender.agent.mps import ControlDaemon
from extender.agent.node import REASON_MPS_DOWN, REASON_MPS_READY, REASON_OVER_SHARE, NodeAgent
from extender.agent.nvml import EXCLUSIVE_PROCESS, Nvml
from extender.agent.podresources import ContainerDevices, ContainerResources, PodResources
from extender.config import Config
from extender.config_agent import (
    AgentSettings,
    DevicePluginSettings,
    MpsDaemonSettings,
    WebhookSettings,
)
from extender.kube.api import KubeCluster
from extender.packing.codec import INVENTORY_KEY, allocation_annotations, decode_inventory
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.request import ContainerDemand
from tests.agent.fake_kubelet import FakeDeviceManager, FakeKubelet
from tests.agent.fake_mps_control import write_wrapper
from tests.agent.fake_nvml import H100, MIB, MIXED_NODE, V100, FakeNvml, FakeProcess
from tests.kube.fake_apiserver import FakeApiServer, Served, serving

NODE = "gpu-node-1"
POD_UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
CLIENT_PID = 41001


def config_for(tmp_path: Path, binary: Path | None = None, **agent: Any) -> Config:
    mps = MpsDaemonSettings(
        control_binary=str(binary or "nvidia-cuda-mps-control"),
        log_directory=str(tmp_path / "log"),
        health_interval_seconds=0.1,
        command_timeout_seconds=2.0,
        restart_backoff_seconds=0.2,
        restart_backoff_max_seconds=1.0,
        stable_after_seconds=5.0,
        foreign_pipe_directories=(),
    )
    settings = AgentSettings(
        # Generous for a loaded machine; the hang test waits for it once.
        nvml_timeout_seconds=2.0,
        sample_interval_seconds=0.2,
        metrics_port=None,
        proc_root=str(tmp_path / "proc"),
        mps=mps,
    )
    return dataclasses.replace(
        Config(),
        agent=dataclasses.replace(settings, **agent),
        webhook=WebhookSettings(pipe_directory=str(tmp_path / "pipe")),
    )


@contextlib.asynccontextmanager
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, KubeCluster]]:
    fake = FakeApiServer()
    fake.add_node(NODE, labels={"nvidia.com/gpu.present": "true"})
    async with serving(fake, tmp_path) as served:
        cluster = await connect(served)
        try:
            yield fake, cluster
        finally:
            await cluster.close()


async def connect(served: Served) -> KubeCluster:
    return await KubeCluster.connect(
        kubeconfig=served.kubeconfig, context=None, request_timeout_s=2.0, retry_delay_s=0.05
    )


@contextlib.asynccontextmanager
async def session(fake_nvml: FakeNvml) -> AsyncIterator[Nvml]:
    nvml = Nvml(fake_nvml, timeout_s=2.0)
    await nvml.start()
    try:
        yield nvml
    finally:
        await nvml.close()


def node_annotations(fake: FakeApiServer) -> dict[str, str]:
    return dict(fake.nodes[NODE]["metadata"].get("annotations") or {})


def ready_label(fake: FakeApiServer) -> str | None:
    labels: dict[str, str] = fake.nodes[NODE]["metadata"].get("labels") or {}
    return labels.get(MPS_READY_LABEL)


def gpu_states(fake: FakeApiServer) -> list[str]:
    return [g["mps"] for g in json.loads(node_annotations(fake)[INVENTORY_KEY])]


async def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if check():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


def node_reasons(fake: FakeApiServer) -> list[str]:
    return [e["reason"] for e in fake.node_events(NODE)]


# -- publishing -------------------------------------------------------------------------------


async def test_the_mixed_node_is_published_as_the_extender_places_it(tmp_path: Path) -> None:
    """H100, A100 with MIG on, V100, P100: the published inventory, decoded by the extender,
    carries the 48/16 client limits from the discovered compute capability and the MIG flag."""
    config = config_for(tmp_path)
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(MIXED_NODE)) as nvml:
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        published = await agent.publish()
    assert published.wrote
    inventory = decode_inventory(
        NODE, node_annotations(fake)[INVENTORY_KEY], budgets=config.budgets
    )
    assert [g.model for g in inventory.gpus] == [g.name for g in MIXED_NODE]
    assert [g.max_clients for g in inventory.gpus] == [48, 48, 48, 16]
    assert [g.mig for g in inventory.gpus] == [False, True, False, False]
    assert [str(g.compute_capability) for g in inventory.gpus] == ["9.0", "8.0", "7.0", "6.0"]
    # No daemon answers in the pipe directory: the GPUs are down, and the label says so.
    assert {g.mps for g in inventory.gpus} == {"down"}
    assert ready_label(fake) == "false"
    record = json.loads(node_annotations(fake)[AGENT_KEY])
    assert (record["driver"], record["cuda"], record["mps"]) == ("550.54.15", "12.4", "down")


async def test_nothing_changed_means_no_write(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(MIXED_NODE)) as nvml:
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        first = await agent.publish()
        rv = fake.nodes[NODE]["metadata"]["resourceVersion"]
        again = [await agent.publish() for _ in range(3)]
    assert first.wrote and not any(p.wrote for p in again)
    assert fake.requests_of("PATCH", "nodes") == 1
    assert fake.nodes[NODE]["metadata"]["resourceVersion"] == rv


async def test_a_label_change_is_published_once(tmp_path: Path) -> None:
    """Units per GPU follow the node's replicas label: a changed label is one more write."""
    config = config_for(tmp_path)
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(MIXED_NODE)) as nvml:
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        await agent.publish()
        fake.update_node(NODE, labels={"nvidia.com/gpu.replicas": "8"})
        assert (await agent.publish()).wrote
        assert not (await agent.publish()).wrote
    assert {g["units"] for g in json.loads(node_annotations(fake)[INVENTORY_KEY])} == {8}
    assert fake.requests_of("PATCH", "nodes") == 2


async def test_a_hung_nvml_publishes_the_gpus_down(tmp_path: Path) -> None:
    """A driver call that does not return: the last good inventory is published down, with the
    reason, rather than left ready while nothing can be known."""
    config = config_for(tmp_path, binary=write_wrapper(tmp_path))
    fake_nvml = FakeNvml(MIXED_NODE)
    async with api(tmp_path) as (fake, cluster), session(fake_nvml) as nvml:
        daemon = ControlDaemon(
            config.agent.mps, pipe_directory=config.webhook.pipe_directory, multi_user=False
        )
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon)
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: ready_label(fake) == "true", "published ready")
            hang = fake_nvml.hang("nvmlDeviceGetCount")
            await until(lambda: ready_label(fake) == "false", "published down")
            assert set(gpu_states(fake)) == {"down"}
            assert "NVML" in json.loads(node_annotations(fake)[AGENT_KEY])["reason"]
            hang.release()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await daemon.stop()


# -- the MPS daemon ---------------------------------------------------------------------------


async def test_daemon_death_is_published_down_then_ready_after_the_restart(tmp_path: Path) -> None:
    config = config_for(tmp_path, binary=write_wrapper(tmp_path))
    pipe = Path(config.webhook.pipe_directory)
    fake_nvml = FakeNvml(MIXED_NODE)
    async with api(tmp_path) as (fake, cluster), session(fake_nvml) as nvml:
        daemon = ControlDaemon(config.agent.mps, pipe_directory=str(pipe), multi_user=False)
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon)
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: ready_label(fake) == "true", "published ready")
            # The shared GPUs (H100, V100) were put in EXCLUSIVE_PROCESS before the daemon
            # started; the MIG A100 and the pre-Volta P100 were left alone.
            modes = [fake_nvml.gpu_state(i).compute_mode for i in range(4)]
            assert modes == [EXCLUSIVE_PROCESS, 0, EXCLUSIVE_PROCESS, 0]
            assert gpu_states(fake) == ["ready"] * 4
            first_pid = daemon.health().pid
            (pipe / "fake-die").write_text("once")
            await until(lambda: ready_label(fake) == "false", "published down")
            assert set(gpu_states(fake)) == {"down"}
            assert json.loads(node_annotations(fake)[AGENT_KEY])["mps"] == "down"
            await until(lambda: ready_label(fake) == "true", "published ready again")
            # The Event follows the node's patch: wait for it before stopping the agent.
            await until(lambda: node_reasons(fake)[-1:] == [REASON_MPS_READY], "MpsReady recorded")
            assert daemon.health().pid != first_pid
            assert daemon.health().restarts >= 1
            assert gpu_states(fake) == ["ready"] * 4
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await daemon.stop()
    reasons = node_reasons(fake)
    assert REASON_MPS_DOWN in reasons
    assert reasons[-1] == REASON_MPS_READY
    # A write per change (not started, ready, down, ready; a slow start on a loaded machine
    # may add a down and a ready), not one per probe or sample: the loop ran many rounds.
    assert fake.requests_of("PATCH", "nodes") <= 6
    assert fake.requests_of("GET", "nodes") > fake.requests_of("PATCH", "nodes")


async def test_the_device_plugin_advertises_shared_gpus_with_the_daemon_health(
    tmp_path: Path,
) -> None:
    """kubelet (the fake device manager) sees one mpsched.io/mps slot per MPS client of the
    shared GPUs (H100 and V100: 2 × 48), healthy while the daemon is, unhealthy while it is
    down."""
    config = config_for(tmp_path, binary=write_wrapper(tmp_path))
    pipe = Path(config.webhook.pipe_directory)
    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short unix socket paths
    settings = DevicePluginSettings(kubelet_directory=str(directory), shm_directory="/run/x")
    plugin = DevicePlugin(settings, pipe_directory=str(pipe), poll_s=0.05, retry_s=0.05)
    async with (
        api(tmp_path) as (_, cluster),
        session(FakeNvml(MIXED_NODE)) as nvml,
        FakeDeviceManager(directory) as kubelet,
    ):
        daemon = ControlDaemon(config.agent.mps, pipe_directory=str(pipe), multi_user=False)
        agent = NodeAgent(
            node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=daemon, plugin=plugin
        )
        task = asyncio.create_task(agent.run())
        try:
            await kubelet.wait_for(lambda k: set(k.devices.values()) == {"Healthy"})
            assert len(kubelet.devices) == 96
            assert {d.split("::")[0] for d in kubelet.devices} == {H100.uuid, V100.uuid}
            (pipe / "fake-die").write_text("once")
            await kubelet.wait_for(lambda k: set(k.devices.values()) == {"Unhealthy"})
            await kubelet.wait_for(lambda k: set(k.devices.values()) == {"Healthy"})
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await daemon.stop()
            shutil.rmtree(directory, ignore_errors=True)


# -- usage ------------------------------------------------------------------------------------


def write_cgroup(proc: Path, pid: int, pod_uid: str) -> None:
    slice_uid = pod_uid.replace("-", "_")
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-0123abcd.scope\n"
    )


def running_pod(memory_mib: int) -> dict[str, Any]:
    alloc = Allocation(
        pod_uid=POD_UID,
        namespace="ml",
        name="trainer",
        node=NODE,
        kind="share",
        gpus=(GpuRef(0, H100.uuid),),
        threads=25,
        memory_mib=memory_mib,
        clients=1,
        containers=(ContainerDemand("main", 25, memory_mib, 1),),
    )
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "trainer",
            "namespace": "ml",
            "uid": POD_UID,
            "annotations": allocation_annotations(alloc),
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


async def test_a_pod_over_its_memory_share_is_reported_once(tmp_path: Path) -> None:
    """The H100's MPS client (pid 41001) uses 2048 MiB; its pod was given 1024 MiB: one Warning
    Event on the pod, and the over-share metric, for as long as it lasts."""
    config = config_for(tmp_path)
    write_cgroup(tmp_path / "proc", CLIENT_PID, POD_UID)
    gpus = (
        dataclasses.replace(
            H100, mps_clients=(FakeProcess(pid=CLIENT_PID, used_bytes=2048 * MIB),)
        ),
    )
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(gpus)) as nvml:
        fake.put(running_pod(memory_mib=1024))
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        report = await agent.sample()
        assert report is not None
        (usage,) = [p for p in report.pods if p.pod_uid == POD_UID]
        assert usage.over_share and usage.used_mib == 2048 and usage.allowed_mib == 1024
        await agent.sample()
        await agent.publish()
        metrics = agent.metrics.render().decode()
    warnings = [e for e in fake.events if e.get("reason") == REASON_OVER_SHARE]
    assert len(warnings) == 1
    assert warnings[0]["involvedObject"]["uid"] == POD_UID
    assert "2048" in warnings[0]["message"] and "1024" in warnings[0]["message"]
    over = [
        line for line in metrics.splitlines() if line.startswith("mpsched_agent_pod_over_share{")
    ]
    assert over and over[0].endswith(" 1.0"), over


async def test_a_pod_within_its_share_is_not_reported(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    write_cgroup(tmp_path / "proc", CLIENT_PID, POD_UID)
    gpus = (
        dataclasses.replace(H100, mps_clients=(FakeProcess(pid=CLIENT_PID, used_bytes=900 * MIB),)),
    )
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(gpus)) as nvml:
        fake.put(running_pod(memory_mib=1024))
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        report = await agent.sample()
    assert report is not None and not report.over_share
    assert not [e for e in fake.events if e.get("reason") == REASON_OVER_SHARE]


# -- the command ------------------------------------------------------------------------------


def test_once_without_a_driver_exits_1_with_one_line_naming_nvml() -> None:
    """On this machine (no NVIDIA driver) the real pynvml fails to load libnvidia-ml."""
    done = subprocess.run(
        [sys.executable, "-m", "extender", "agent", "--once", "--node-name", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "KUBECONFIG": "/nonexistent"},
        check=False,
    )
    if done.returncode == 0:
        pytest.skip("this machine has a working NVIDIA driver")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "NVML" in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_agent_needs_a_node_name() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "extender", "agent", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "--node-name" in done.stderr


async def test_gpus_held_through_the_device_plugin_are_published(tmp_path: Path) -> None:
    """kubelet's PodResources says a pod holds the V100 through nvidia.com/gpu (a shared replica,
    `<uuid>::<n>`, as NVIDIA's plugin names it): the agent record names that GPU."""
    sock = tmp_path / "kubelet.sock"
    config = config_for(tmp_path, pod_resources_socket=str(sock))
    held = PodResources(
        name="legacy",
        namespace="ml",
        containers=(
            ContainerResources(
                name="main",
                devices=(
                    ContainerDevices(
                        resource_name="nvidia.com/gpu", device_ids=(f"{V100.uuid}::3",)
                    ),
                ),
            ),
        ),
    )
    async with (
        api(tmp_path) as (fake, cluster),
        session(FakeNvml(MIXED_NODE)) as nvml,
        FakeKubelet(sock, [held]),
    ):
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        await agent.sample()
        await agent.publish()
    assert json.loads(node_annotations(fake)[AGENT_KEY])["devicePluginGpus"] == [V100.uuid]


async def test_once_publishes_and_prints_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mpsched agent --once` on a node whose NVML is the fake: it publishes the inventory on
    the Node and prints the same JSON, starting no daemon."""
    from extender.commands import agent as cli

    monkeypatch.setattr(cli, "load_pynvml", lambda: FakeNvml(MIXED_NODE))
    config = config_for(tmp_path)
    fake = FakeApiServer()
    fake.add_node(NODE)
    async with serving(fake, tmp_path) as served:
        args = cli.build_args(["--once", "--node-name", NODE, "--kubeconfig", served.kubeconfig])
        await cli.main_async(args, config)
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(node_annotations(fake)[INVENTORY_KEY])
    assert [g["maxClients"] for g in printed] == [48, 48, 48, 16]
    assert not (tmp_path / "pipe").exists()  # no daemon was started


async def test_a_failing_round_does_not_end_the_agent(tmp_path: Path) -> None:
    """The agent's exit would end the MPS daemon and every client with it: a round that fails
    unexpectedly is logged and the next round publishes."""
    config = config_for(tmp_path)
    async with api(tmp_path) as (fake, cluster), session(FakeNvml(MIXED_NODE)) as nvml:
        real_patch = cluster.patch_node_metadata
        calls = 0

        async def flaky_patch(name: str, patch: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in the first round")
            return await real_patch(name, patch)

        cluster.patch_node_metadata = flaky_patch  # type: ignore[method-assign]
        agent = NodeAgent(node_name=NODE, config=config, nvml=nvml, cluster=cluster, daemon=None)
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: INVENTORY_KEY in node_annotations(fake), "published")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert calls >= 2
