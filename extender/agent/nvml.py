"""NVML for the node agent: the one importer of pynvml (nvidia-ml-py), and an NVML session whose
every call runs on one dedicated worker thread, never on the event loop, each bounded in time.

Owns the NVML subset the agent calls (`NvmlApi`, pynvml's own names and semantics, so a test
fake can stand in for the module), what discovery and a usage sample read from it, and the
typed errors built from NVML's return codes (`NVMLError.value`, never its text).

A driver in trouble can block an NVML call indefinitely. The session then raises `NvmlTimeout`
naming the call, and every later call fails fast with NvmlTimeout while the worker is still
stuck, instead of queueing behind it. The worker is a daemon thread: a thread pool's workers are
joined at interpreter exit, so one stuck in the driver would keep the agent from ever exiting.
"""

# ruff: noqa: N802 (NvmlApi keeps pynvml's names)
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar

import pynvml

# The findings are plain data, defined beside the pure decisions that read them (the import
# contracts keep those from importing this module); re-exported here.
from extender.agent.inventory import DiscoveredGpu, Discovery, GpuProcess, GpuSample
from extender.packing.model import ComputeCapability

__all__ = [
    "DEFAULT",
    "EXCLUSIVE_PROCESS",
    "DiscoveredGpu",
    "Discovery",
    "GpuLost",
    "GpuProcess",
    "GpuSample",
    "Nvml",
    "NvmlApi",
    "NvmlError",
    "NvmlNotSupported",
    "NvmlTimeout",
    "NvmlUnavailable",
    "load_pynvml",
    "nvml_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: NVML compute modes the agent sets (`NVML_COMPUTEMODE_*`): MPS wants EXCLUSIVE_PROCESS, so that
#: the MPS server is the only process owning the GPU (MPS doc §2.3.1.2).
DEFAULT: Final = 0
EXCLUSIVE_PROCESS: Final = 3

NOT_SUPPORTED: Final = 3
TIMEOUT: Final = 10
FUNCTION_NOT_FOUND: Final = 13
UNINITIALIZED: Final = 1
#: Codes meaning NVML itself is unusable on this node (no library, no driver, no access, a
#: library that does not match the kernel driver).
UNAVAILABLE_CODES: Final = frozenset({4, 9, 12, 18})
#: Codes meaning the GPU has gone (fell off the bus, was removed): GpuIsLost, GpuNotFound.
LOST_CODES: Final = frozenset({15, 28})

#: `NVML_ERROR_*` names by code, from the bindings' own constants (nvml.h).
ERROR_NAMES: Final = MappingProxyType(
    {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and type(v) is int}
)
MIB: Final = 2**20


class NvmlApi(Protocol):
    """The subset of pynvml the agent calls: same names, same semantics (module functions)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int: ...
    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None: ...
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...


def load_pynvml() -> NvmlApi:
    """The real NVML: the pynvml module itself (importing it needs no GPU; `nvmlInit` loads
    libnvidia-ml)."""
    api: NvmlApi = pynvml
    return api


# -- errors -----------------------------------------------------------------------------------


class NvmlError(Exception):
    """An NVML call failed: its `NVML_ERROR_*` code and name, the call, the GPU it was about."""

    def __init__(self, code: int, *, call: str, detail: str, gpu: str | None = None) -> None:
        self.code = code
        self.name = ERROR_NAMES.get(code, f"NVML_ERROR_{code}")
        self.call = call
        self.detail = detail
        self.gpu = gpu
        super().__init__(self._message())

    def _where(self) -> str:
        return f"{self.call} on GPU {self.gpu}" if self.gpu else self.call

    def _message(self) -> str:
        return f"NVML {self._where()} failed with {self.name} ({self.detail})"


class NvmlUnavailable(NvmlError):
    """NVML cannot be used on this node: no library, no driver, no permission."""

    def _message(self) -> str:
        return f"NVML is not available: {self._where()} failed with {self.name} ({self.detail})"


class NvmlTimeout(NvmlError):
    """An NVML call did not return in time, or could not start: the worker is stuck."""

    def _message(self) -> str:
        return f"NVML {self._where()} timed out ({self.name}): {self.detail}"


class GpuLost(NvmlError):
    """The GPU fell off the bus or was removed; it answers nothing until the node is fixed."""

    def _message(self) -> str:
        return (
            f"NVML lost GPU {self.gpu or '?'}: {self.call} failed with {self.name} ({self.detail})"
        )


class NvmlNotSupported(NvmlError):
    """The GPU or driver does not support this query (MIG mode before Ampere, say)."""


def nvml_error(exc: BaseException, *, call: str, gpu: str | None = None) -> NvmlError | None:
    """The typed error for what an NVML call raised, chosen by its code; None when `exc` is
    not from NVML. Reads `str(exc)` (pynvml may ask the library for it: call this off the
    loop)."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        # An unversioned pynvml wrapper found no `_v3` symbol: a driver older than the bindings.
        code, detail = FUNCTION_NOT_FOUND, f"libnvidia-ml is older than the bindings: {exc}"
    elif isinstance(exc, pynvml.NVMLError) and isinstance(getattr(exc, "value", None), int):
        code, detail = exc.value, str(exc)
    else:
        return None
    cls: type[NvmlError]
    if call == "nvmlInit" or code in UNAVAILABLE_CODES:
        cls = NvmlUnavailable
    elif code in LOST_CODES:
        cls = GpuLost
    elif code == TIMEOUT:
        cls = NvmlTimeout
    elif code == NOT_SUPPORTED:
        cls = NvmlNotSupported
    else:
        cls = NvmlError
    return cls(code, call=call, detail=" ".join(detail.split()) or "no detail", gpu=gpu)


# -- the worker -------------------------------------------------------------------------------


class _Worker:
    """One daemon thread running submitted functions in order. Not a ThreadPoolExecutor: its
    workers are joined at interpreter exit, and a call stuck in the driver never returns."""

    def __init__(self) -> None:
        #: (future, function) jobs; None asks the thread to end.
        self._jobs: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None
        ]
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._run, name="nvml", daemon=True).start()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, fn))
        return future

    def stop(self) -> None:
        """Ask the thread to end after what it is doing; never waits for it."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the caller, whatever it is
                    future.set_exception(exc)


# -- the session ------------------------------------------------------------------------------


class Nvml:
    """One NVML session: `start`, then `discover` / `sample` / `set_compute_mode`, then `close`."""

    def __init__(self, api: NvmlApi, *, timeout_s: float) -> None:
        self._api = api
        self._timeout_s = timeout_s
        self._worker = _Worker()
        #: The call the worker is stuck in, its future, and since when (monotonic).
        self._stuck: tuple[str, concurrent.futures.Future[Any], float] | None = None
        self._started = False
        self._closed = False
        #: uuid by index from the last discovery, to name a GPU that is lost later.
        self._uuids: dict[int, str] = {}

    async def _call(self, call: str, *args: Any, gpu: int | None = None) -> Any:
        where = self._gpu_name(gpu)
        if self._closed:
            raise NvmlError(UNINITIALIZED, call=call, detail="the session is closed", gpu=where)
        if self._stuck is not None:
            stuck, stuck_future, since = self._stuck
            if not stuck_future.done():
                detail = (
                    f"not attempted: the NVML worker is still stuck in {stuck} "
                    f"({time.monotonic() - since:.1f} s)"
                )
                raise NvmlTimeout(TIMEOUT, call=call, detail=detail, gpu=where)
            self._stuck = None
        fn = getattr(self._api, call)

        def run() -> Any:
            try:
                return fn(*args)
            except Exception as exc:
                typed = nvml_error(exc, call=call, gpu=where)
                if typed is None:
                    raise
                raise typed from exc

        future = self._worker.submit(run)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns an answer that meets a
            # cancellation and drops the cancellation, and the agent's TaskGroup never ends.
            async with asyncio.timeout(self._timeout_s):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            # A call still queued is dropped; one that started holds the worker until it returns.
            if not future.cancel() and not future.done():
                self._stuck = (call, future, time.monotonic() - self._timeout_s)
            detail = f"no answer within {self._timeout_s:g} s"
            raise NvmlTimeout(TIMEOUT, call=call, detail=detail, gpu=where) from None

    def _gpu_name(self, gpu: int | None) -> str | None:
        if gpu is None:
            return None
        uuid = self._uuids.get(gpu)
        return f"{gpu} ({uuid})" if uuid else str(gpu)

    async def _optional(self, call: str, handle: Any, *, gpu: int) -> Any:
        """A query some GPUs do not support: None there."""
        try:
            return await self._call(call, handle, gpu=gpu)
        except NvmlNotSupported:
            return None

    async def start(self) -> None:
        """nvmlInit. Raises NvmlUnavailable where NVML cannot be used, NvmlTimeout if it hangs."""
        if not self._started:
            await self._call("nvmlInit")
            self._started = True

    async def discover(self) -> Discovery:
        """The driver and every GPU. A GPU that fails on the way raises GpuLost / NvmlError."""
        driver = await self._call("nvmlSystemGetDriverVersion")
        cuda = await self._call("nvmlSystemGetCudaDriverVersion")
        gpus = []
        for index in range(await self._call("nvmlDeviceGetCount")):
            handle = await self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            uuid = await self._call("nvmlDeviceGetUUID", handle, gpu=index)
            self._uuids[index] = uuid
            memory = await self._call("nvmlDeviceGetMemoryInfo", handle, gpu=index)
            major, minor = await self._call("nvmlDeviceGetCudaComputeCapability", handle, gpu=index)
            mig = await self._optional("nvmlDeviceGetMigMode", handle, gpu=index)
            gpus.append(
                DiscoveredGpu(
                    index=index,
                    uuid=uuid,
                    name=await self._call("nvmlDeviceGetName", handle, gpu=index),
                    memory_mib=int(memory.total) // MIB,
                    compute_capability=ComputeCapability(int(major), int(minor)),
                    mig=bool(mig and mig[0] == 1),
                    compute_mode=await self._optional(
                        "nvmlDeviceGetComputeMode", handle, gpu=index
                    ),
                )
            )
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return Discovery(driver_version=driver, cuda_version=cuda_version, gpus=tuple(gpus))

    async def sample(self) -> tuple[GpuSample, ...]:
        """Utilisation, memory and processes of every GPU; unsupported fields None / empty."""
        samples = []
        for index in range(await self._call("nvmlDeviceGetCount")):
            handle = await self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            uuid = await self._call("nvmlDeviceGetUUID", handle, gpu=index)
            util = await self._optional("nvmlDeviceGetUtilizationRates", handle, gpu=index)
            memory = await self._optional("nvmlDeviceGetMemoryInfo", handle, gpu=index)
            clients = await self._optional(
                "nvmlDeviceGetMPSComputeRunningProcesses", handle, gpu=index
            )
            procs = await self._optional("nvmlDeviceGetComputeRunningProcesses", handle, gpu=index)
            samples.append(
                GpuSample(
                    index=index,
                    uuid=uuid,
                    utilization_percent=None if util is None else int(util.gpu),
                    memory_used_mib=None if memory is None else int(memory.used) // MIB,
                    mps_clients=_processes(clients),
                    processes=_processes(procs),
                )
            )
        return tuple(samples)

    async def set_compute_mode(self, index: int, mode: int) -> None:
        """Set GPU `index`'s compute mode (needs root); raises NvmlError."""
        handle = await self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
        await self._call("nvmlDeviceSetComputeMode", handle, mode, gpu=index)

    async def close(self) -> None:
        """nvmlShutdown, bounded; never raises. A worker stuck in a call is abandoned."""
        if self._closed:
            return
        try:
            if self._started:
                await self._call("nvmlShutdown")
        except Exception as exc:  # closing must not fail whatever NVML does
            log.warning("%s; NVML session abandoned", exc)
        finally:
            self._closed = True
            self._worker.stop()


def _processes(items: list[Any] | None) -> tuple[GpuProcess, ...]:
    def mib(used: Any) -> int | None:
        return None if used is None else int(used) // MIB

    return tuple(
        GpuProcess(pid=int(p.pid), used_memory_mib=mib(p.usedGpuMemory)) for p in items or ()
    )
