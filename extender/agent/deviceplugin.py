"""The agent's kubelet device plugin for `mpsched.io/mps` (kubelet's v1beta1 device plugin API,
gRPC over unix sockets in kubelet's device-plugins directory; code generated from
`proto/deviceplugin/v1beta1/api.proto`).

The webhook adds `mpsched.io/mps: 1` to each container that asks for a GPU share, and only to
those. kubelet calls this plugin's Allocate for each such container, and the answer is what
reaches MPS: the pipe directory (host path, same path inside), the daemon's shm directory at
/dev/shm, and CUDA_MPS_PIPE_DIRECTORY. The answer is the same for every container: the thread,
memory and device values come from the pod's own annotations (the downward API), so nothing
here needs to know which pod it serves. No hostIPC, no hostPath in any pod spec.

Owns the service (grpc.aio: nothing blocks the loop), the registration with kubelet, and the
watch for kubelet restarts: kubelet removes the plugins' sockets and creates a new kubelet.sock
when it starts, so a missing own socket or a new kubelet.sock means serve anew and register
again. What to advertise is decided in `inventory.advertised_slots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from extender.agent.inventory import HEALTHY, UNHEALTHY, Slot
from extender.agent.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from extender.config_agent import DevicePluginSettings
from extender.packing.podspec import MPS_DELIVERY

log = logging.getLogger("mpsched.agent.deviceplugin")

#: The resource the webhook adds to each share-asking container (one name, one place).
RESOURCE: Final = MPS_DELIVERY
API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
#: Our socket's file name in kubelet's directory (kubelet is told the name, not the path).
ENDPOINT: Final = "mpsched-mps.sock"
SHM_PATH: Final = "/dev/shm"
PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
#: kubelet dials back into the plugin inside Register with a 10 s budget: ours is longer.
REGISTER_TIMEOUT_S: Final = 15.0
#: How often the sockets are looked at; kubelet restarts are seen within this.
POLL_S: Final = 1.0
#: Pause before registering again after a failed attempt (kubelet not up yet).
RETRY_S: Final = 5.0
#: Seconds open streams get to end when the server stops.
STOP_GRACE_S: Final = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """What Allocate gives every container: environment and (host path, container path)."""

    envs: tuple[tuple[str, str], ...]
    mounts: tuple[tuple[str, str], ...]


def delivery(settings: DevicePluginSettings, *, pipe_directory: str) -> Delivery:
    """The MPS pipe directory at its own path, the daemon's shm at /dev/shm (replacing the
    sandbox's, as NVIDIA's plugin does), and the pipe directory's variable."""
    return Delivery(
        envs=((PIPE_ENV, pipe_directory),),
        mounts=((pipe_directory, pipe_directory), (settings.shm_directory, SHM_PATH)),
    )


def allocate_response(request: Any, answer: Delivery) -> Any:
    """One ContainerAllocateResponse per container request (kubelet sends one), each the same."""
    response = api_pb2.ContainerAllocateResponse(
        envs=dict(answer.envs),
        mounts=[
            api_pb2.Mount(host_path=host, container_path=inside, read_only=False)
            for host, inside in answer.mounts
        ],
    )
    return api_pb2.AllocateResponse(
        container_responses=[response for _ in request.container_requests]
    )


def preferred(request: Any) -> Any:
    """kubelet's advice call: the IDs it must include, then the first available, up to size.
    Every slot is alike; any choice serves."""
    answers = []
    for ask in request.container_requests:
        chosen = list(dict.fromkeys([*ask.must_include_deviceIDs, *ask.available_deviceIDs]))
        answers.append(
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen[: ask.allocation_size])
        )
    return api_pb2.PreferredAllocationResponse(container_responses=answers)


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=False
        )

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for slots in self._plugin.lists():
            yield api_pb2.ListAndWatchResponse(
                devices=[
                    api_pb2.Device(ID=s.id, health=HEALTHY if s.healthy else UNHEALTHY)
                    for s in slots
                ]
            )

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        return preferred(request)

    async def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._plugin.allocations += sum(1 for _ in request.container_requests)
        return allocate_response(request, self._plugin.answer)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class RegistrationFailed(Exception):
    """kubelet did not take the registration; `code` is the gRPC status code's name."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file `path` is: its inode and change time (a file system may hand a removed
    file's inode number to the next file at once)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


class DevicePlugin:
    """Serves `mpsched.io/mps` to kubelet. `update()` sets the slots (the first call lets
    `run()` register); `run()` serves and keeps the registration until cancelled."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        pipe_directory: str,
        poll_s: float = POLL_S,
        retry_s: float = RETRY_S,
    ) -> None:
        self._settings = settings
        self._poll_s, self._retry_s = poll_s, retry_s
        self.answer = delivery(settings, pipe_directory=pipe_directory)
        self.directory = Path(settings.kubelet_directory)
        self.socket_path = self.directory / ENDPOINT
        self._slots: tuple[Slot, ...] = ()
        self._version = 0
        self._changed = asyncio.Condition()
        self._first = asyncio.Event()
        #: Registrations kubelet accepted, and container allocations answered (for /status).
        self.registrations = 0
        self.allocations = 0
        self.registered = asyncio.Event()

    @property
    def slots(self) -> tuple[Slot, ...]:
        return self._slots

    async def update(self, slots: Sequence[Slot]) -> None:
        """The devices to advertise; streams to kubelet get a new list only on a change."""
        new = tuple(slots)
        self._first.set()
        if new == self._slots:
            return
        async with self._changed:
            self._slots, self._version = new, self._version + 1
            self._changed.notify_all()

    async def lists(self) -> AsyncIterator[tuple[Slot, ...]]:
        """The full list now, then again on every change (each message is the whole list)."""
        seen = -1
        while True:
            async with self._changed:
                while self._version == seen:
                    await self._changed.wait()
                seen, slots = self._version, self._slots
            yield slots

    async def run(self) -> None:
        """Until cancelled: serve, register, and on a kubelet restart do both again."""
        await self._first.wait()
        while True:
            try:
                server = await self._serve()
            except OSError as exc:
                log.warning("device plugin %s cannot serve, retrying: %s", RESOURCE, exc)
                await asyncio.sleep(self._retry_s)
                continue
            try:
                taken, kubelet = await self._register_until_taken()
                if taken:
                    await self._watch(kubelet)
                    log.info("kubelet restarted: registering %s again", RESOURCE)
            finally:
                self.registered.clear()
                # Stopping unlinks the socket path: stop before a new server binds it.
                await server.stop(STOP_GRACE_S)

    async def _serve(self) -> Any:
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        # A stale socket there is replaced; a regular file makes the bind fail (say so).
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        return server

    async def _register_until_taken(self) -> tuple[bool, tuple[int, int] | None]:
        """Register until kubelet takes it: (True, which file kubelet.sock was then); (False, None)
        when our socket went away meanwhile (a kubelet starting removes it): serve again."""
        kubelet = self.directory / KUBELET_SOCKET
        while True:
            kubelet_file = await asyncio.to_thread(_identity, kubelet)
            try:
                await self.register()
            except RegistrationFailed as exc:
                log.warning("registering %s with kubelet failed, retrying: %s", RESOURCE, exc)
                if not await asyncio.to_thread(self.socket_path.exists):
                    return False, None
                await asyncio.sleep(self._retry_s)
                continue
            self.registrations += 1
            self.registered.set()
            log.info("registered %s with kubelet (%d slots)", RESOURCE, len(self._slots))
            return True, kubelet_file

    async def register(self) -> None:
        """One Register call on kubelet.sock. Raises RegistrationFailed."""
        target = f"unix://{self.directory / KUBELET_SOCKET}"
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=ENDPOINT,
            resource_name=RESOURCE,
            options=api_pb2.DevicePluginOptions(),
        )
        try:
            async with asyncio.timeout(REGISTER_TIMEOUT_S + STOP_GRACE_S):
                async with grpc.aio.insecure_channel(target) as channel:
                    stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                    await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            raise RegistrationFailed(f"{name}: {exc.details() or ''}"[:300], code=name) from None
        except TimeoutError:
            raise RegistrationFailed("kubelet did not answer", code="DEADLINE_EXCEEDED") from None

    async def _watch(self, kubelet_file: tuple[int, int] | None) -> None:
        """Return when kubelet restarted: our socket is gone (kubelet's start removes the
        plugins' sockets) or kubelet.sock is another file than the one we registered with."""
        kubelet = self.directory / KUBELET_SOCKET
        while True:
            await asyncio.sleep(self._poll_s)
            ours = await asyncio.to_thread(os.path.exists, self.socket_path)
            now = await asyncio.to_thread(_identity, kubelet)
            if not ours or (now is not None and now != kubelet_file):
                return


@contextlib.asynccontextmanager
async def running(plugin: DevicePlugin) -> AsyncIterator[asyncio.Task[None]]:
    """`plugin.run()` as a task for the block's length (tests and gpu-check)."""
    task = asyncio.create_task(plugin.run(), name="device-plugin")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
