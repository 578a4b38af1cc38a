"""A hand-written NVML for the agent's tests: the `NvmlApi` subset with pynvml's semantics.

It raises real `pynvml.NVMLError(code)` instances with NVML's codes where the library would:
Uninitialized (1) before `nvmlInit` and after the last `nvmlShutdown` (init is
reference-counted), LibraryNotFound (12) on a node without the driver, InvalidArgument (2) for a
bad index or handle, NotSupported (3) for MIG mode before Ampere, MPS client lists before Volta
and utilisation on MIG-enabled GPUs, GpuIsLost (15) for every call about a GPU that `lose()`
made disappear. `hang(name)` makes a call block, as a driver in trouble does, until released.
Thread-safe: the session calls it from its worker thread while the test steers it.
"""

# ruff: noqa: N802 (pynvml's names)
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

MIB = 2**20
#: NVML's "no instance" value for `gpuInstanceId` / `computeInstanceId` of a non-MIG process.
NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeProcess:
    pid: int
    #: Bytes; None where NVML cannot tell (pynvml turns NVML_VALUE_NOT_AVAILABLE into None).
    used_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeGpuSpec:
    name: str
    uuid: str
    memory_mib: int
    cc: tuple[int, int]
    mig: bool = False
    compute_mode: int = 0
    memory_used_mib: int = 0
    utilization: int = 0
    mps_clients: tuple[FakeProcess, ...] = ()
    processes: tuple[FakeProcess, ...] = ()


H100 = FakeGpuSpec(
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-4f8a1c2e-9b3d-4e6f-a1b2-7c8d9e0f1a2b",
    memory_mib=81559,
    cc=(9, 0),
    memory_used_mib=4660,
    utilization=37,
    mps_clients=(
        FakeProcess(pid=41001, used_bytes=2048 * MIB),
        FakeProcess(pid=41002, used_bytes=None),
    ),
    processes=(FakeProcess(pid=40999, used_bytes=4096 * MIB),),
)
A100_MIG = FakeGpuSpec(
    name="NVIDIA A100-SXM4-80GB",
    uuid="GPU-b2e7d3a0-5c61-4f2e-9d8a-3e4f5a6b7c8d",
    memory_mib=81920,
    cc=(8, 0),
    mig=True,
)
V100 = FakeGpuSpec(
    name="Tesla V100-SXM2-16GB",
    uuid="GPU-7d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6",
    memory_mib=16160,
    cc=(7, 0),
)
P100 = FakeGpuSpec(
    name="Tesla P100-PCIE-16GB",
    uuid="GPU-0a9b8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d",
    memory_mib=16280,
    cc=(6, 0),
    utilization=5,
)
#: A node with one GPU of each generation the agent must tell apart, indices 0..3.
MIXED_NODE = (H100, A100_MIG, V100, P100)


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """Opaque like `c_nvmlDevice_t`; only the fake that made it accepts it."""

    owner: int
    index: int


@dataclass(slots=True)
class Hang:
    """A call that blocks: `entered` is set when a call is blocked, `release()` lets it go."""

    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class FakeNvml:
    """One node's NVML. `no_driver`: nvmlInit fails as without libnvidia-ml; `init_error`: it
    fails with that code instead (9 driver not loaded, 4 no permission)."""

    def __init__(
        self,
        gpus: Sequence[FakeGpuSpec] = MIXED_NODE,
        *,
        driver: str = "550.54.15",
        cuda: int = 12040,
        no_driver: bool = False,
        init_error: int | None = None,
        root: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self._gpus = list(gpus)
        self._driver = driver
        self._cuda = cuda
        self._init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND if no_driver else init_error
        self._root = root
        self._refcount = 0
        self._loaded = False
        self._lost: set[int] = set()
        self._hangs: dict[str, Hang] = {}
        self.calls: list[str] = []

    # -- steering -------------------------------------------------------------------------

    def lose(self, index: int) -> None:
        """GPU `index` falls off the bus: every call about it raises GpuIsLost from now on."""
        with self._lock:
            self._lost.add(index)

    def hang(self, name: str) -> Hang:
        """Calls to `name` block from now on, until the returned Hang is released."""
        hang = Hang()
        with self._lock:
            self._hangs[name] = hang
        return hang

    def release_all(self) -> None:
        with self._lock:
            hangs = list(self._hangs.values())
        for hang in hangs:
            hang.release()

    @property
    def initialised(self) -> int:
        with self._lock:
            return self._refcount

    def gpu_state(self, index: int) -> FakeGpuSpec:
        with self._lock:
            return self._gpus[index]

    # -- NVML -----------------------------------------------------------------------------

    def _enter(self, name: str, *, init: bool = False) -> None:
        with self._lock:
            self.calls.append(name)
            hang = self._hangs.get(name)
        if hang is not None and not hang.released.is_set():
            hang.entered.set()
            hang.released.wait()
        if not init and self.initialised == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> tuple[int, FakeGpuSpec]:
        if not isinstance(handle, FakeHandle) or handle.owner != id(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            if handle.index in self._lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return handle.index, self._gpus[handle.index]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", init=True)
        if self._init_error is not None:
            raise pynvml.NVMLError(self._init_error)
        with self._lock:
            self._loaded = True
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", init=True)
        with self._lock:
            # pynvml: Uninitialized until the library was once loaded; after that an extra
            # shutdown is no error (the C library counts down to zero and stays there).
            if not self._loaded:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            self._refcount = max(0, self._refcount - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self._cuda

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)  # a lost GPU still counts, as in NVML

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = FakeHandle(id(self), index)
        self._gpu(handle)  # a lost GPU has no handle either
        return handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self._gpu(handle)[1].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName")
        return self._gpu(handle)[1].name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)[1]
        total, used = gpu.memory_mib * MIB, gpu.memory_used_mib * MIB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability")
        return self._gpu(handle)[1].cc

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle)[1]
        if gpu.cc < (8, 0):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetComputeMode")
        return self._gpu(handle)[1].compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        self._enter("nvmlDeviceSetComputeMode")
        index, gpu = self._gpu(handle)
        if not self._root:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        # EXCLUSIVE_THREAD (1) is no longer supported by NVML.
        if mode not in (0, 2, 3):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._gpus[index] = replace(gpu, compute_mode=mode)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetMPSComputeRunningProcesses")
        gpu = self._gpu(handle)[1]
        if gpu.cc < (7, 0):  # "For Volta or newer"
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [_friendly(p) for p in gpu.mps_clients]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return [_friendly(p) for p in self._gpu(handle)[1].processes]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        gpu = self._gpu(handle)[1]
        if gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.utilization // 2)


def _friendly(p: FakeProcess) -> Any:
    """A process as pynvml hands it out: an `nvmlFriendlyObject`."""
    return pynvml.nvmlFriendlyObject(
        {
            "pid": p.pid,
            "usedGpuMemory": p.used_bytes,
            "gpuInstanceId": NO_INSTANCE,
            "computeInstanceId": NO_INSTANCE,
        }
    )
