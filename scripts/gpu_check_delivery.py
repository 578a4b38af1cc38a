"""Steps 4 and 5 of `scripts/gpu-check` (see gpu_check.py): the device plugin's delivery on a
real GPU, and the agent's check of a client started without its limits.

The stand-in kubelet is the tests' fake device manager (real gRPC over unix sockets, kubelet's
own order of calls); everything else is real: the agent's DevicePlugin, the MPS control daemon
started by the agent's ControlDaemon, NVML, /proc, and CUDA clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from gpu_check import can_bind, client_command, namespaced, run_client

# The stand-in kubelet lives with the tests (repository root on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

THREADS, LIMIT_MIB = 25, 1024
UNLIMITED_UID = "00000000-0000-4000-8000-00000000000a"
HONEST_UID = "00000000-0000-4000-8000-00000000000b"


class _Quiet:
    """The agent's cluster, where there is none: Events are printed."""

    description = "gpu-check (no cluster)"

    async def get_node(self, name: str) -> Any:
        return None

    async def patch_node_metadata(self, name: str, patch: Mapping[str, Any]) -> Any:
        return {}

    async def list_node_pods(self, node: str) -> list[Any]:
        return []

    async def record_event(self, **event: Any) -> None:
        print(f"  Event {event['reason']}: {event['message']}")

    async def record_node_event(self, **event: Any) -> None:
        print(f"  Node Event {event['reason']}: {event['message']}")

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def _tmpfs(path: Path) -> AsyncIterator[bool]:
    """A tmpfs at `path` as the DaemonSet's init container mounts it (root only); False where
    the plain directory is used instead."""
    mounted = False
    if os.geteuid() == 0:
        done = await asyncio.to_thread(
            subprocess.run,
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                "rw,nosuid,nodev,noexec,mode=1777,size=1g",
                "tmpfs",
                str(path),
            ],
            check=False,
            capture_output=True,
        )
        mounted = done.returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            await asyncio.to_thread(subprocess.run, ["umount", "-l", str(path)], check=False)


def _wrapper(directory: Path, binds: list[tuple[str, str]]) -> str:
    """A control binary that runs NVIDIA's in the device plugin's mounts (the daemon, as the
    agent runs it in its DaemonSet, has the shm directory at /dev/shm)."""
    real = "nvidia-cuda-mps-control"
    if not binds:
        return real
    path = directory / "nvidia-cuda-mps-control"
    command = shlex.join(namespaced([real], binds))
    path.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    path.chmod(0o755)
    return str(path)


async def _allocate(tmp: Path, pipe: Path, shm: Path) -> tuple[dict[str, str], list[Any]]:
    """Register the agent's plugin with the stand-in kubelet and ask Allocate once."""
    from extender.agent.deviceplugin import DevicePlugin, running
    from extender.agent.inventory import Slot
    from extender.config_agent import DevicePluginSettings
    from tests.agent.fake_kubelet import FakeDeviceManager

    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths are short
    settings = DevicePluginSettings(kubelet_directory=str(directory), shm_directory=str(shm))
    plugin = DevicePlugin(settings, pipe_directory=str(pipe), poll_s=0.1, retry_s=0.2)
    await plugin.update([Slot(id=f"gpu-check::{n}", healthy=True) for n in range(4)])
    try:
        async with FakeDeviceManager(directory) as kubelet, running(plugin):
            await kubelet.wait_for(lambda k: len(k.devices) == 4, 30)
            answer = (await kubelet.allocate(["gpu-check::0"])).container_responses[0]
    finally:
        await asyncio.to_thread(shutil.rmtree, directory, True)
    return dict(answer.envs), list(answer.mounts)


async def delivery_and_checks() -> int:
    from extender.agent.clients import check
    from extender.agent.enforce import ClientChecks
    from extender.agent.mps import ControlDaemon
    from extender.agent.nvml import Nvml, NvmlError, load_pynvml
    from extender.config_agent import AgentSettings, MpsDaemonSettings
    from extender.packing.ledger import Allocation, GpuRef
    from extender.packing.request import ContainerDemand

    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mpsched-gpu-check-dp-") as name:
        tmp = Path(name)
        pipe, logs, shm = tmp / "pipe", tmp / "log", tmp / "shm"
        for d in (pipe, logs, shm):
            d.mkdir()
        envs, mounts = await _allocate(tmp, pipe, shm)
        got = [(m.host_path, m.container_path, m.read_only) for m in mounts]
        print(f"device plugin Allocate: envs {envs}, mounts {got}")
        if envs != {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)} or got != [
            (str(pipe), str(pipe), False),
            (str(shm), "/dev/shm", False),
        ]:
            failures.append("the device plugin's Allocate answer is not the MPS delivery")
        binds = [(m.host_path, m.container_path) for m in mounts] if can_bind() else []
        if not binds:
            print("SKIP applying the mounts: needs root and unshare(1); env only")
        async with _tmpfs(shm) as is_tmpfs:
            print(f"shm directory {shm}: {'a tmpfs' if is_tmpfs else 'a plain directory'}")
            settings = MpsDaemonSettings(
                control_binary=await asyncio.to_thread(_wrapper, tmp, binds),
                log_directory=str(logs),
                exclusive_process=False,
                health_interval_seconds=0.5,
                command_timeout_seconds=10.0,
                foreign_pipe_directories=(),
            )
            nvml = Nvml(load_pynvml(), timeout_s=30.0)
            try:
                await nvml.start()
            except NvmlError as exc:
                print(f"FAIL NVML: {exc}")
                return 1
            daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
            supervisor = asyncio.create_task(daemon.run())
            try:
                async with asyncio.timeout(60):
                    while daemon.health().state != "ready":
                        await daemon.changed()
                base = {**os.environ, **envs, "CUDA_MPS_LOG_DIRECTORY": str(logs)}
                base.pop("CUDA_VISIBLE_DEVICES", None)
                limited = {
                    **base,
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(THREADS),
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={LIMIT_MIB}M",
                }
                inside = await asyncio.to_thread(run_client, limited, LIMIT_MIB // 2, binds)
                past = await asyncio.to_thread(run_client, limited, LIMIT_MIB * 2, binds)
                print(f"client through the plugin's delivery, {LIMIT_MIB // 2} MiB: {inside}")
                print(f"client through the plugin's delivery, {LIMIT_MIB * 2} MiB: {past}")
                if inside.get("alloc_ok") is not True or past.get("alloc_ok") is not False:
                    failures.append("limits through the device plugin's delivery do not hold")
                checks = ClientChecks(
                    node_name=os.uname().nodename,
                    settings=AgentSettings(proc_root="/proc"),
                    cluster=_Quiet(),
                    control=daemon,
                )
                failures += await _check_clients(
                    daemon,
                    nvml,
                    checks,
                    base,
                    limited,
                    binds,
                    shm,
                    check,
                    Allocation,
                    GpuRef,
                    ContainerDemand,
                )
            except TimeoutError:
                failures.append(f"the MPS daemon did not become ready: {daemon.health()}")
            finally:
                supervisor.cancel()
                await daemon.stop()
                await nvml.close()
    for failure in failures:
        print(f"FAIL {failure}")
    print("gpu-check delivery: " + ("FAILED" if failures else "OK"))
    return 1 if failures else 0


def _start_holding(binds: list[tuple[str, str]], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        client_command(["--hold", "40"], binds), env=env, stdout=subprocess.PIPE, text=True
    )


async def _check_clients(
    daemon: Any,
    nvml: Any,
    checks: Any,
    base: dict[str, str],
    limited: dict[str, str],
    binds: list[tuple[str, str]],
    shm: Path,
    check: Any,
    allocation: Any,
    gpu_ref: Any,
    demand: Any,
) -> list[str]:
    """Two clients hold a context: one without limits, one honest. The agent's gather and
    check must find the first only; the daemon then ends it."""
    failures: list[str] = []
    unlimited = await asyncio.to_thread(_start_holding, binds, base)
    honest = await asyncio.to_thread(_start_holding, binds, limited)
    try:
        for proc in (unlimited, honest):
            line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
            if "holding" not in line:
                return [f"a holding client did not start: {line.strip()}"]
        clients: tuple[Any, ...] = ()
        deadline = time.monotonic() + 20
        pids = {unlimited.pid, honest.pid}
        while time.monotonic() < deadline:
            samples = await nvml.sample()
            clients = await checks.gather(samples)
            seen = {c.pid for c in clients if c.server_pid is not None and c.gpu_index is not None}
            if pids <= seen:
                break
            await asyncio.sleep(0.5)
        for c in clients:
            print(f"  client {c.pid}: {dataclasses.asdict(c)}")
        print(f"  files in the shm directory while they run: {len(os.listdir(shm))}")
        if binds and not os.listdir(shm):
            failures.append("the MPS server put nothing in the device plugin's shm directory")
        gpu = next((c for c in clients if c.pid == honest.pid and c.gpu_index is not None), None)
        if gpu is None:
            return [*failures, "the daemon's client list and NVML did not both show the clients"]
        owners = {unlimited.pid: UNLIMITED_UID, honest.pid: HONEST_UID}
        ours = [dataclasses.replace(c, pod_uid=owners[c.pid]) for c in clients if c.pid in owners]
        allocations = {
            uid: allocation(
                pod_uid=uid,
                namespace="gpu-check",
                name=uid[-1],
                node="here",
                kind="share",
                gpus=(gpu_ref(gpu.gpu_index, gpu.gpu_uuid),),
                threads=THREADS,
                memory_mib=LIMIT_MIB,
                clients=1,
                containers=(demand("main", THREADS, LIMIT_MIB, 1),),
            )
            for uid in owners.values()
        }
        findings = check(ours, allocations, pods={}, tolerance_mib=0)
        for f in findings:
            print(f"  finding: {f.kind}: {f.text}")
        if [(f.kind, f.pid) for f in findings] != [("no-limits", unlimited.pid)]:
            failures.append("the check did not find exactly the client without limits")
        server = next(c.server_pid for c in ours if c.pid == unlimited.pid)
        said = await daemon.command(f"terminate_client {server} {unlimited.pid}")
        print(f"  terminate_client {server} {unlimited.pid}: {said or 'ok'}")
        try:
            out, _ = await asyncio.to_thread(unlimited.communicate, timeout=15)
        except subprocess.TimeoutExpired:
            failures.append("the client without limits was not ended by terminate_client")
        else:
            print(f"  the ended client said: {out.strip()} (exit {unlimited.returncode})")
            if unlimited.returncode != 4:
                failures.append("the ended client did not see an error")
        if honest.poll() is not None:
            failures.append("the honest client did not survive its neighbour's end")
    finally:
        for proc in (unlimited, honest):
            if proc.poll() is None:
                proc.kill()
            await asyncio.to_thread(proc.wait)
    print(
        "  NVML per client: pid and used memory (None where the driver does not say); the "
        "thread percentage is not visible to NVML"
    )
    print(f"  result: {json.dumps({'findings': len(failures) == 0})}")
    return failures
