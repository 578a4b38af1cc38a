"""The agent's device plugin against a fake kubelet (`fake_kubelet.FakeDeviceManager`), real
gRPC over unix sockets: it registers, advertises one slot per MPS client of each shared GPU
with the daemon's health, answers Allocate with exactly the pipe directory, the shm directory
at /dev/shm and CUDA_MPS_PIPE_DIRECTORY, and registers again when kubelet restarts."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.agent.deviceplugin import ENDPOINT, RESOURCE, DevicePlugin, running
from extender.agent.inventory import Slot, advertised_slots, inventory_from_discovery
from extender.agent.nvml import DiscoveredGpu, Discovery
from extender.config_agent import DevicePluginSettings
from extender.packing.model import ComputeCapability
from extender.packing.settings import BudgetSettings
from tests.agent.fake_kubelet import FakeDeviceManager

PIPE = "/tmp/nvidia-mps"
SHM = "/run/mpsched/shm"


@pytest.fixture
def directory() -> Iterator[Path]:
    # A short path: a unix socket's path is limited to 107 bytes, pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _gpu(index: int, cc: tuple[int, int], *, mig: bool = False) -> DiscoveredGpu:
    return DiscoveredGpu(
        index=index,
        uuid=f"GPU-{index:08d}-1111-2222-3333-444455556666",
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        compute_capability=ComputeCapability(*cc),
        mig=mig,
        compute_mode=3,
    )


def _slots(
    *gpus: DiscoveredGpu, cuda: str = "12.4", ready: bool = True, **budgets: object
) -> tuple[Slot, ...]:
    settings = BudgetSettings(**budgets)  # type: ignore[arg-type]
    discovery = Discovery(driver_version="550.54.15", cuda_version=cuda, gpus=gpus)
    inventory = inventory_from_discovery(
        "gpu-1", discovery, labels={}, budgets=settings, mps="ready" if ready else "down"
    )
    return advertised_slots(inventory, ready=ready, budgets=settings)


def _plugin(directory: Path) -> DevicePlugin:
    settings = DevicePluginSettings(kubelet_directory=str(directory), shm_directory=SHM)
    return DevicePlugin(settings, pipe_directory=PIPE, poll_s=0.05, retry_s=0.05)


# -- what is advertised (pure) -----------------------------------------------------------------


def test_one_slot_per_client_of_each_shared_gpu_with_stable_short_ids() -> None:
    slots = _slots(_gpu(0, (9, 0)), _gpu(1, (8, 0), mig=True), _gpu(2, (6, 0)))
    # MIG GPUs are given out whole, pre-Volta ones too by default: no MPS slots there.
    assert len(slots) == 48
    assert all(s.healthy for s in slots)
    assert slots[0].id == "GPU-00000000-1111-2222-3333-444455556666::0"
    assert len({s.id for s in slots}) == 48 and max(len(s.id) for s in slots) <= 63
    assert slots == _slots(_gpu(0, (9, 0)), _gpu(1, (8, 0), mig=True), _gpu(2, (6, 0)))
    assert len(_slots(_gpu(2, (6, 0)), pre_volta="share")) == 16


def test_slots_follow_the_daemon_health_and_the_client_cap() -> None:
    assert not any(s.healthy for s in _slots(_gpu(0, (9, 0)), ready=False))
    assert len(_slots(_gpu(0, (9, 0)), max_clients_per_gpu=8)) == 8


def test_sixty_clients_only_where_asked_and_the_driver_is_cuda_13_1() -> None:
    assert len(_slots(_gpu(0, (9, 0)), cuda="13.1")) == 48  # off by default
    assert len(_slots(_gpu(0, (9, 0)), cuda="13.1", clients_cuda131=True)) == 60
    assert len(_slots(_gpu(0, (9, 0)), cuda="13.0", clients_cuda131=True)) == 48
    assert len(_slots(_gpu(0, (9, 0)), cuda="13.2", clients_cuda131=True)) == 60
    # never above the configured cap; never for pre-Volta GPUs
    assert len(_slots(_gpu(0, (9, 0)), cuda="13.1", clients_cuda131=True, max_clients_per_gpu=50))
    assert (
        len(_slots(_gpu(0, (9, 0)), cuda="13.1", clients_cuda131=True, max_clients_per_gpu=50))
        == 50
    )
    assert len(_slots(_gpu(0, (6, 0)), cuda="13.1", clients_cuda131=True, pre_volta="share")) == 16


# -- against kubelet ---------------------------------------------------------------------------


async def test_registers_advertises_and_allocates_exactly_the_mps_delivery(
    directory: Path,
) -> None:
    plugin = _plugin(directory)
    await plugin.update(_slots(_gpu(0, (9, 0))))
    async with FakeDeviceManager(directory) as kubelet, running(plugin):
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
        [registered] = kubelet.registered
        assert (registered.version, registered.endpoint, registered.resource_name) == (
            "v1beta1",
            ENDPOINT,
            RESOURCE,
        )
        assert not kubelet.options.pre_start_required
        assert not kubelet.options.get_preferred_allocation_available
        assert set(kubelet.devices.values()) == {"Healthy"}

        response = await kubelet.allocate([next(iter(kubelet.devices))])
        [answer] = response.container_responses
        assert dict(answer.envs) == {"CUDA_MPS_PIPE_DIRECTORY": PIPE}
        mounts = [(m.host_path, m.container_path, m.read_only) for m in answer.mounts]
        assert mounts == [(PIPE, PIPE, False), (SHM, "/dev/shm", False)]
        assert not answer.devices and not answer.annotations and not answer.cdi_devices
        assert plugin.allocations == 1


async def test_health_changes_reach_kubelet_as_a_full_list(directory: Path) -> None:
    plugin = _plugin(directory)
    await plugin.update(_slots(_gpu(0, (9, 0))))
    async with FakeDeviceManager(directory) as kubelet, running(plugin):
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
        sent = kubelet.lists
        await plugin.update(_slots(_gpu(0, (9, 0))))  # unchanged: nothing sent
        await plugin.update(_slots(_gpu(0, (9, 0)), ready=False))
        await kubelet.wait_for(lambda k: set(k.devices.values()) == {"Unhealthy"})
        assert len(kubelet.devices) == 48 and kubelet.lists == sent + 1


async def test_registers_again_when_kubelet_restarts(directory: Path) -> None:
    plugin = _plugin(directory)
    await plugin.update(_slots(_gpu(0, (9, 0))))
    async with FakeDeviceManager(directory) as kubelet, running(plugin):
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
        await kubelet.restart()
        assert not (directory / ENDPOINT).exists()  # kubelet removed our socket
        await kubelet.wait_registered(2)
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
        assert (directory / ENDPOINT).is_socket()
        response = await kubelet.allocate(["GPU-00000000-1111-2222-3333-444455556666::3"])
        assert dict(response.container_responses[0].envs) == {"CUDA_MPS_PIPE_DIRECTORY": PIPE}
        assert plugin.registrations == 2


async def test_registers_again_when_only_kubelet_sock_is_new(directory: Path) -> None:
    plugin = _plugin(directory)
    await plugin.update(_slots(_gpu(0, (9, 0))))
    async with FakeDeviceManager(directory) as kubelet, running(plugin):
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
        await kubelet.restart(remove_sockets=False)
        await kubelet.wait_registered(2)
        await kubelet.wait_for(lambda k: len(k.devices) == 48)


async def test_waits_for_a_kubelet_that_is_not_up_yet(directory: Path) -> None:
    plugin = _plugin(directory)
    await plugin.update(_slots(_gpu(0, (9, 0))))
    async with running(plugin):
        await asyncio.sleep(0.2)  # a few failed attempts: no kubelet.sock
        assert plugin.registrations == 0 and (directory / ENDPOINT).is_socket()
        async with FakeDeviceManager(directory) as kubelet:
            await kubelet.wait_for(lambda k: len(k.devices) == 48)
            assert len(kubelet.registered) == 1


async def test_nothing_registers_before_the_first_inventory(directory: Path) -> None:
    plugin = _plugin(directory)
    async with FakeDeviceManager(directory) as kubelet, running(plugin):
        await asyncio.sleep(0.2)
        assert kubelet.registered == [] and not (directory / ENDPOINT).exists()
        await plugin.update(_slots(_gpu(0, (9, 0))))
        await kubelet.wait_for(lambda k: len(k.devices) == 48)
