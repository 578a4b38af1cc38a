"""kubelet for the agent's tests, over real gRPC (grpcio's asyncio API) on unix sockets.

`FakeKubelet`: the PodResources endpoint, serving `/v1.PodResourcesLister/List` through a
generic handler and answering with `encode_list_response` (the generated messages). Other
methods of the service (`Get`, `GetAllocatableResources`) answer UNIMPLEMENTED, as an
unregistered method does on any gRPC server.

`FakeDeviceManager`: kubelet's device-plugin side (further below).

Fault injection, each knob a plain attribute:

- `pods`: what List answers (kubelet's view of its pods and their devices).
- `raw`: bytes answered instead of the encoded `pods` (a malformed answer).
- `delay_s`: each call waits this long before it answers (a kubelet in trouble).
- `fail_next`: gRPC status codes the next calls are answered with, one each (kubelet's rate
  limiter answers RESOURCE_EXHAUSTED "rejected by rate limit").

`calls` counts the List calls served, `requests` holds their request bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from extender.agent.podresources import PodResources
from extender.agent.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from extender.agent.proto.podresources.v1 import api_pb2 as podresources_pb2

SERVICE = "v1.PodResourcesLister"


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    """The wire form of a ListPodResourcesResponse holding `pods` (what the fake kubelet answers;
    the agent only decodes them)."""
    message = podresources_pb2.ListPodResourcesResponse(
        pod_resources=[
            podresources_pb2.PodResources(
                name=pod.name,
                namespace=pod.namespace,
                containers=[
                    podresources_pb2.ContainerResources(
                        name=c.name,
                        devices=[
                            podresources_pb2.ContainerDevices(
                                resource_name=d.resource_name, device_ids=list(d.device_ids)
                            )
                            for d in c.devices
                        ],
                    )
                    for c in pod.containers
                ],
            )
            for pod in pods
        ]
    )
    data: bytes = message.SerializeToString()
    return data


class FakeKubelet:
    def __init__(self, socket_path: Path, pods: Sequence[PodResources] = ()) -> None:
        self.socket_path = socket_path
        self.pods: list[PodResources] = list(pods)
        self.raw: bytes | None = None
        self.delay_s = 0.0
        self.fail_next: list[grpc.StatusCode] = []
        self.calls = 0
        self.requests: list[bytes] = []
        self._server: Any = None

    async def _list(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next:
            code = self.fail_next.pop(0)
            await context.abort(code, "rejected by rate limit")
        return self.raw if self.raw is not None else encode_list_response(self.pods)

    async def start(self) -> None:
        server = grpc.aio.server()
        # No (de)serializers: the handler takes and returns the wire bytes.
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        )
        server.add_generic_rpc_handlers((handler,))
        if server.add_insecure_port(f"unix:{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            # grace 0: calls still waiting (delay_s) are cancelled, as when kubelet restarts.
            await self._server.stop(0)
            self._server = None

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


# -- the device manager ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registered:
    """One Register call kubelet accepted."""

    version: str
    endpoint: str
    resource_name: str


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, manager: FakeDeviceManager) -> None:
        self._manager = manager

    async def Register(self, request: Any, context: Any) -> Any:  # noqa: N802
        return await self._manager.register(request, context)


class FakeDeviceManager:
    """kubelet's device manager as a plugin sees it: the Registration service on
    `<directory>/kubelet.sock`. Register does what kubelet does: checks the version and the
    resource name (INVALID_ARGUMENT otherwise, kubelet's wording), dials the plugin's endpoint
    in the same directory and asks its options before answering (a plugin not yet serving
    fails the call), then follows its ListAndWatch stream in the background: `devices` holds
    the latest list (ID → health), `lists` counts the messages. `allocate(ids)` calls the
    plugin's Allocate as kubelet does at pod admission (one container request).

    `restart()` is kubelet restarting: its server stops (the stream ends), every socket in the
    directory but a new kubelet.sock is removed, and a new kubelet.sock (another inode) serves.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket_path = directory / "kubelet.sock"
        self.registered: list[Registered] = []
        self.devices: dict[str, str] = {}
        self.lists = 0
        self.options: Any = None
        self._changed = asyncio.Condition()
        self._server: Any = None
        self._channel: Any = None
        self._stream: asyncio.Task[None] | None = None

    async def register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'requested API version "{request.version}" is not supported by kubelet. '
                "Supported version is [v1beta1]",
            )
        name = request.resource_name
        if "/" not in name or name.startswith("kubernetes.io/") or "/" in request.endpoint:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f'the ResourceName "{name}" is invalid'
            )
        await self._disconnect()
        channel = grpc.aio.insecure_channel(f"unix://{self.directory / request.endpoint}")
        try:
            async with asyncio.timeout(10):  # kubelet's dial-back budget
                await channel.channel_ready()
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            self.options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            await channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        self._channel = channel
        self._stream = asyncio.create_task(self._follow(stub))
        async with self._changed:
            self.registered.append(Registered(request.version, request.endpoint, name))
            self._changed.notify_all()
        return api_pb2.Empty()

    async def _follow(self, stub: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    self.devices = {d.ID: d.health for d in response.devices}
                    self.lists += 1
                    self._changed.notify_all()

    async def wait_for(self, predicate: Any, timeout_s: float = 10.0) -> None:
        """Wait until `predicate(self)` holds (after a registration or a device list)."""
        async with asyncio.timeout(timeout_s):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

    async def wait_registered(self, count: int, timeout_s: float = 10.0) -> None:
        await self.wait_for(lambda k: len(k.registered) >= count, timeout_s)

    async def allocate(self, ids: Sequence[str]) -> Any:
        """The plugin's AllocateResponse for one container holding `ids`."""
        stub = api_pb2_grpc.DevicePluginStub(self._channel)  # type: ignore[no-untyped-call]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
        )
        return await stub.Allocate(request, timeout=10)

    async def _disconnect(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stream
            self._stream = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        await self._disconnect()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self, *, remove_sockets: bool = True) -> None:
        """`remove_sockets` False: only kubelet.sock is new (a kubelet that does not clean the
        directory, or whose cleanup the plugin has not seen yet)."""
        await self.stop()
        # kubelet's start: remove the plugins' sockets (not its checkpoint), serve afresh.
        for path in self.directory.iterdir():
            if path.is_socket() and (remove_sockets or path == self.socket_path):
                path.unlink()
        self.devices = {}
        await self.start()

    async def __aenter__(self) -> FakeDeviceManager:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
