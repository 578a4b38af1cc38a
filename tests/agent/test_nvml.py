"""The NVML session against a fake with pynvml's semantics: discovery of a mixed node, NVML
missing, a GPU that disappears, a call that hangs (bounded, the loop stays responsive, later
calls fail fast, close is bounded), a cancellation that meets a call's answer (the call ends
cancelled), unsupported fields, and errors typed by code, not text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pynvml
import pytest

from extender.agent.nvml import (
    EXCLUSIVE_PROCESS,
    GpuLost,
    GpuProcess,
    Nvml,
    NvmlApi,
    NvmlError,
    NvmlNotSupported,
    NvmlTimeout,
    NvmlUnavailable,
    load_pynvml,
    nvml_error,
)
from extender.packing.model import ComputeCapability
from tests.agent.fake_nvml import A100_MIG, H100, MIXED_NODE, P100, V100, FakeNvml

TIMEOUT_S = 0.3
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    fake = FakeNvml()
    yield fake
    fake.release_all()  # never leave the worker thread blocked after a test


@pytest.fixture
async def nvml(fake: FakeNvml) -> AsyncIterator[Nvml]:
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    await session.start()
    yield session
    await session.close()


def test_the_fake_is_an_nvml_api() -> None:
    api: NvmlApi = FakeNvml()  # mypy checks the fake against the protocol
    assert api.nvmlDeviceGetCount is not None


async def test_discovers_the_mixed_node(nvml: Nvml) -> None:
    found = await nvml.discover()
    assert found.driver_version == "550.54.15"
    assert found.cuda_version == "12.4"
    assert [g.index for g in found.gpus] == [0, 1, 2, 3]
    assert [g.name for g in found.gpus] == [s.name for s in MIXED_NODE]
    assert [g.uuid for g in found.gpus] == [s.uuid for s in MIXED_NODE]
    assert [g.memory_mib for g in found.gpus] == [81559, 81920, 16160, 16280]
    assert [str(g.compute_capability) for g in found.gpus] == ["9.0", "8.0", "7.0", "6.0"]
    # MIG mode: on for the A100; NotSupported before Ampere reads as off.
    assert [g.mig for g in found.gpus] == [False, True, False, False]
    assert [g.compute_mode for g in found.gpus] == [0, 0, 0, 0]
    assert not found.gpus[3].compute_capability.is_volta_or_later  # the P100


async def test_cuda_version_from_nvml_integer() -> None:
    session = Nvml(FakeNvml((H100,), cuda=11080), timeout_s=TIMEOUT_S)
    await session.start()
    assert (await session.discover()).cuda_version == "11.8"
    await session.close()


async def test_nvml_missing_is_unavailable_in_one_line() -> None:
    session = Nvml(FakeNvml(no_driver=True), timeout_s=TIMEOUT_S)
    with pytest.raises(NvmlUnavailable) as caught:
        await session.start()
    assert str(caught.value) == (
        "NVML is not available: nvmlInit failed with NVML_ERROR_LIBRARY_NOT_FOUND "
        "(NVML Shared Library Not Found)"
    )
    assert (caught.value.code, caught.value.call) == (12, "nvmlInit")
    assert isinstance(caught.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    await session.close()  # a session that never started closes quietly


@pytest.mark.parametrize(
    ("code", "name"),
    [(9, "NVML_ERROR_DRIVER_NOT_LOADED"), (4, "NVML_ERROR_NO_PERMISSION")],
)
async def test_init_failures_are_unavailable(code: int, name: str) -> None:
    session = Nvml(FakeNvml(init_error=code), timeout_s=TIMEOUT_S)
    with pytest.raises(NvmlUnavailable, match=name) as caught:
        await session.start()
    assert caught.value.name == name
    assert "\n" not in str(caught.value)
    await session.close()


def test_the_real_pynvml_without_a_driver_behaves_as_the_fake() -> None:
    """Where this machine has no driver, real pynvml and the fake raise the same errors."""
    real = load_pynvml()
    try:
        real.nvmlInit()
    except pynvml.NVMLError as exc:
        real_error = exc
    else:
        real.nvmlShutdown()
        pytest.skip("NVML works here; the GPU test covers the real library")
    if real_error.value != pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        pytest.skip(f"NVML fails here with code {real_error.value}, not for a missing library")
    with pytest.raises(pynvml.NVMLError) as fake_error:
        FakeNvml(no_driver=True).nvmlInit()
    assert type(fake_error.value) is type(real_error)
    assert (fake_error.value.value, str(fake_error.value)) == (real_error.value, str(real_error))
    for api in (real, FakeNvml()):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            api.nvmlDeviceGetCount()


def test_the_fake_counts_inits() -> None:
    fake = FakeNvml()
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 4  # one init still holds
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(4)


async def test_a_gpu_that_disappears_is_lost_by_name(nvml: Nvml, fake: FakeNvml) -> None:
    await nvml.discover()
    fake.lose(2)
    with pytest.raises(GpuLost) as caught:
        await nvml.sample()
    lost = caught.value
    assert (lost.code, lost.name) == (15, "NVML_ERROR_GPU_IS_LOST")
    assert lost.gpu == f"2 ({V100.uuid})"
    assert str(lost).startswith(f"NVML lost GPU 2 ({V100.uuid}): nvmlDeviceGetHandleByIndex")
    with pytest.raises(GpuLost, match="GPU 2"):
        await nvml.discover()


async def test_a_gpu_lost_before_discovery_is_named_by_index(fake: FakeNvml) -> None:
    fake.lose(1)
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    await session.start()
    with pytest.raises(GpuLost, match=r"^NVML lost GPU 1: "):
        await session.discover()
    await session.close()


async def test_a_hung_call_times_out_while_the_loop_keeps_running(
    nvml: Nvml, fake: FakeNvml
) -> None:
    hang = fake.hang("nvmlDeviceGetUtilizationRates")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    with pytest.raises(NvmlTimeout) as caught:
        await nvml.sample()
    elapsed = time.monotonic() - started
    task.cancel()
    assert hang.entered.is_set()
    assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + 0.5
    assert ticks >= 10  # the loop ran other work the whole time
    assert caught.value.call == "nvmlDeviceGetUtilizationRates"
    assert caught.value.name == "NVML_ERROR_TIMEOUT"
    assert str(caught.value) == (
        f"NVML nvmlDeviceGetUtilizationRates on GPU 0 timed out (NVML_ERROR_TIMEOUT): "
        f"no answer within {TIMEOUT_S:g} s"
    )


async def test_a_cancellation_that_meets_the_answer_cancels_the_call(fake: FakeNvml) -> None:
    """The task is cancelled while its call's answer is already on its way to the loop: it ends
    cancelled, not with the answer. (3.11's wait_for returned the answer and dropped the
    cancellation: the agent's publish or sample loop went on, its TaskGroup never ended, and
    the agent hung on SIGTERM with its MPS daemon still running.)"""
    session = Nvml(fake, timeout_s=30.0)  # no timeout may end the call during the test
    await session.start()
    hang = fake.hang("nvmlDeviceGetCount")
    call = asyncio.create_task(session.sample())
    assert await asyncio.to_thread(hang.entered.wait, 10)
    # A second call, queued on the worker behind the hung one: when it enters the fake, the
    # worker has handed the first answer to the loop (call_soon_threadsafe, not yet run).
    behind = fake.hang("nvmlSystemGetDriverVersion")
    other = asyncio.create_task(session.discover())
    await asyncio.sleep(0)  # `other` submits its first call
    # Deliberately blocking the loop thread, so that nothing the worker queued runs before the
    # cancellation: the answer is queued, the cancellation meets it.
    hang.release()
    assert behind.entered.wait(10)
    call.cancel()
    behind.release()
    await asyncio.wait({call}, timeout=10)
    assert call.cancelled(), "the cancellation was swallowed: the call went on"
    await other
    await session.close()


async def test_calls_fail_fast_while_the_worker_is_stuck(nvml: Nvml, fake: FakeNvml) -> None:
    hang = fake.hang("nvmlDeviceGetCount")
    with pytest.raises(NvmlTimeout):
        await nvml.sample()
    calls = len(fake.calls)
    started = time.monotonic()
    with pytest.raises(NvmlTimeout, match="still stuck in nvmlDeviceGetCount") as caught:
        await nvml.discover()
    assert time.monotonic() - started < TIMEOUT_S / 3  # not queued behind the hung call
    assert caught.value.call == "nvmlSystemGetDriverVersion"
    assert len(fake.calls) == calls  # nothing was handed to the stuck worker
    # The driver recovers: the next call goes through again.
    hang.release()
    for _ in range(100):
        try:
            assert len(await nvml.sample()) == 4
            break
        except NvmlTimeout:
            await asyncio.sleep(0.01)
    else:
        pytest.fail("the session never recovered after the hung call returned")


async def test_close_is_bounded_with_a_hung_worker(fake: FakeNvml) -> None:
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    await session.start()
    fake.hang("nvmlDeviceGetCount")
    with pytest.raises(NvmlTimeout):
        await session.sample()
    started = time.monotonic()
    await session.close()  # never raises
    assert time.monotonic() - started < TIMEOUT_S / 3
    with pytest.raises(NvmlError, match="session is closed"):
        await session.discover()


async def test_close_is_bounded_when_shutdown_hangs(fake: FakeNvml) -> None:
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    await session.start()
    fake.hang("nvmlShutdown")
    started = time.monotonic()
    await session.close()
    assert time.monotonic() - started < TIMEOUT_S + 0.5
    await session.close()  # twice is fine


async def test_close_shuts_nvml_down(fake: FakeNvml) -> None:
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    await session.start()
    assert fake.initialised == 1
    await session.close()
    assert fake.initialised == 0


def test_a_hung_worker_does_not_keep_the_process_from_exiting() -> None:
    """The worker is abandoned for real: a process whose NVML call never returns still exits."""
    script = textwrap.dedent(
        """
        import asyncio
        from extender.agent.nvml import Nvml, NvmlTimeout
        from tests.agent.fake_nvml import FakeNvml

        async def main():
            fake = FakeNvml()
            fake.hang("nvmlDeviceGetCount")
            session = Nvml(fake, timeout_s=0.1)
            await session.start()
            try:
                await session.sample()
            except NvmlTimeout as exc:
                print(exc)
            await session.close()

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    assert "nvmlDeviceGetCount timed out" in done.stdout


async def test_unsupported_fields_become_none_or_empty(nvml: Nvml) -> None:
    h100, a100, v100, p100 = await nvml.sample()
    assert (h100.index, h100.uuid) == (0, H100.uuid)
    assert h100.utilization_percent == 37
    assert h100.memory_used_mib == 4660
    # usedGpuMemory None (NVML could not tell) stays None.
    assert h100.mps_clients == (
        GpuProcess(pid=41001, used_memory_mib=2048),
        GpuProcess(pid=41002, used_memory_mib=None),
    )
    assert h100.processes == (GpuProcess(pid=40999, used_memory_mib=4096),)
    assert a100.uuid == A100_MIG.uuid
    assert a100.utilization_percent is None  # NotSupported on a MIG-enabled GPU
    assert a100.memory_used_mib == 0
    assert v100.utilization_percent == 0
    assert v100.mps_clients == ()
    assert p100.uuid == P100.uuid
    assert p100.mps_clients == ()  # NotSupported before Volta
    assert p100.utilization_percent == 5


async def test_set_compute_mode(nvml: Nvml, fake: FakeNvml) -> None:
    await nvml.set_compute_mode(2, EXCLUSIVE_PROCESS)
    assert fake.gpu_state(2).compute_mode == EXCLUSIVE_PROCESS
    found = await nvml.discover()
    assert [g.compute_mode for g in found.gpus] == [0, 0, 3, 0]
    with pytest.raises(NvmlError, match="NVML_ERROR_INVALID_ARGUMENT") as caught:
        await nvml.set_compute_mode(0, 1)  # EXCLUSIVE_THREAD: gone from NVML
    assert type(caught.value) is NvmlError
    assert str(caught.value).startswith(
        f"NVML nvmlDeviceSetComputeMode on GPU 0 ({H100.uuid}) failed with"
    )


async def test_set_compute_mode_needs_root() -> None:
    session = Nvml(FakeNvml(root=False), timeout_s=TIMEOUT_S)
    await session.start()
    with pytest.raises(NvmlError) as caught:
        await session.set_compute_mode(0, EXCLUSIVE_PROCESS)
    assert caught.value.name == "NVML_ERROR_NO_PERMISSION"
    await session.close()


async def test_calls_before_start_are_uninitialised(fake: FakeNvml) -> None:
    session = Nvml(fake, timeout_s=TIMEOUT_S)
    with pytest.raises(NvmlError) as caught:
        await session.discover()
    assert (caught.value.code, caught.value.name) == (1, "NVML_ERROR_UNINITIALIZED")
    await session.close()


class _MisleadingError(pynvml.NVMLError_NotSupported):  # type: ignore[misc]
    """An NVML error whose text says something else than its code."""

    def __str__(self) -> str:
        return "GPU is lost"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (15, GpuLost),
        (28, GpuLost),
        (10, NvmlTimeout),
        (12, NvmlUnavailable),
        (9, NvmlUnavailable),
        (3, NvmlNotSupported),
        (2, NvmlError),
        (999, NvmlError),
    ],
)
def test_errors_are_typed_by_code(code: int, kind: type[NvmlError]) -> None:
    typed = nvml_error(pynvml.NVMLError(code), call="nvmlDeviceGetName", gpu="0")
    assert type(typed) is kind
    assert typed is not None and typed.code == code
    assert typed.name == next(
        k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and v == code
    )


def test_error_text_is_never_used_to_classify() -> None:
    exc = _MisleadingError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    typed = nvml_error(exc, call="nvmlDeviceGetMigMode", gpu="3")
    assert type(typed) is NvmlNotSupported
    assert typed is not None and typed.name == "NVML_ERROR_NOT_SUPPORTED"
    # Init failures are NvmlUnavailable whatever the code; unknown codes keep their number.
    assert type(nvml_error(pynvml.NVMLError(2), call="nvmlInit")) is NvmlUnavailable
    odd = nvml_error(pynvml.NVMLError(4242), call="nvmlDeviceGetName")
    assert odd is not None and odd.name == "NVML_ERROR_4242"
    assert nvml_error(ValueError("GPU is lost"), call="nvmlDeviceGetName") is None


def test_library_mismatch_is_an_nvml_error() -> None:
    exc = pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...")
    typed = nvml_error(exc, call="nvmlDeviceGetComputeRunningProcesses", gpu="0")
    assert type(typed) is NvmlError
    assert typed is not None and typed.name == "NVML_ERROR_FUNCTION_NOT_FOUND"
    assert "older than the bindings" in str(typed)


@pytest.mark.gpu
async def test_real_nvml_on_a_gpu_node() -> None:
    """On a machine with a driver: the real library through the same session."""
    session = Nvml(load_pynvml(), timeout_s=10)
    try:
        await session.start()
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    try:
        found = await session.discover()
        assert found.gpus and found.driver_version
        assert all(g.uuid.startswith("GPU-") for g in found.gpus)
        assert all(g.compute_capability >= ComputeCapability(3, 5) for g in found.gpus)
        samples = await session.sample()
        assert [s.uuid for s in samples] == [g.uuid for g in found.gpus]
    finally:
        await session.close()
