"""kubelet's PodResources API (v1, `k8s.io/kubelet/pkg/apis/podresources/v1`): which devices the
device plugins gave each pod, read over kubelet's unix socket. The agent asks it which GPUs pods
hold through NVIDIA's device plugin (`nvidia.com/gpu`): those GPUs are not mpsched's to share
(truth rule 3 of docs/design.md).

Owns the one call (`/v1.PodResourcesLister/List`, gRPC through grpcio's asyncio API) and the
translation of kubelet's messages (code generated from `proto/podresources/v1/api.proto` by
scripts/gen-proto) into the plain records below, holding just what the agent reads: pod name and
namespace, container names, and each container's device IDs by resource. Fields the agent does
not read (cpu_ids, memory, topology, dynamic_resources, fields added later) are skipped by
protobuf's parser. An answer that does not parse raises `MalformedResponse`; a failed call
raises `PodResourcesError` carrying the gRPC status code.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Final

import grpc
from google.protobuf.message import DecodeError

from extender.agent.proto.podresources.v1 import api_pb2

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
GPU_RESOURCE: Final = "nvidia.com/gpu"
#: kubelet's own PodResources client allows 16 MiB answers (grpc's default is 4 MiB): a node
#: with many pods and many CPU IDs per container can pass 4 MiB.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Beyond the gRPC deadline, time for the channel to close before the call counts as hung.
_CLOSE_GRACE_S: Final = 1.0


# -- the messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerDevices:
    """Devices of one resource a device plugin gave a container."""

    resource_name: str
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# -- errors ------------------------------------------------------------------------------------


class PodResourcesError(Exception):
    """The List call failed. `code` is the gRPC status code's name ("UNAVAILABLE": kubelet
    does not listen on the socket; "RESOURCE_EXHAUSTED": kubelet's rate limit or an answer over
    `MAX_MESSAGE_BYTES`; "UNIMPLEMENTED": a kubelet without the v1 API), or "MALFORMED" for an
    answer that does not parse."""

    default_code: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str, *, code: str | None = None, socket_path: str = "") -> None:
        super().__init__(f"kubelet PodResources at {socket_path}: {message}")
        self.code = self.default_code if code is None else code
        self.socket_path = socket_path


class PodResourcesTimeout(PodResourcesError):
    """kubelet did not answer within the timeout."""

    default_code = "DEADLINE_EXCEEDED"


class MalformedResponse(PodResourcesError):
    """The answer is not a ListPodResourcesResponse; `where` names the message at fault."""

    default_code = "MALFORMED"

    def __init__(self, where: str, problem: str, *, socket_path: str = "") -> None:
        super().__init__(f"malformed answer: {where}: {problem}", socket_path=socket_path)
        self.where = where
        self.problem = problem


def _rpc_error(exc: grpc.aio.AioRpcError, socket_path: str) -> PodResourcesError:
    code = exc.code()
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    details = exc.details() or ""
    cls = PodResourcesTimeout if code == grpc.StatusCode.DEADLINE_EXCEEDED else PodResourcesError
    return cls(f"{name}: {details}"[:300], code=name, socket_path=socket_path)


# -- the call ----------------------------------------------------------------------------------


async def list_pod_resources(
    socket_path: str = DEFAULT_SOCKET, *, timeout_s: float
) -> tuple[PodResources, ...] | None:
    """Every pod kubelet runs, with its containers' devices; None when the socket does not
    exist (kubelet's pod-resources directory not mounted into the agent, or no kubelet)."""
    # A stat is a syscall: not on the loop either (a hung hostPath mount would stall it).
    target = await asyncio.to_thread(_target, socket_path)
    if target is None:
        return None
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        # The gRPC deadline bounds the call; the outer timeout bounds connecting and closing.
        async with asyncio.timeout(timeout_s + _CLOSE_GRACE_S):
            async with grpc.aio.insecure_channel(target, options=options) as channel:
                # The answer comes as bytes and is parsed here, so that a malformed one is told
                # apart (MalformedResponse) from a failed call.
                call = channel.unary_unary(
                    LIST_METHOD,
                    request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                )
                data = await call(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise _rpc_error(exc, socket_path) from None
    except TimeoutError:
        raise PodResourcesTimeout(
            f"no answer within {timeout_s + _CLOSE_GRACE_S:g} s", socket_path=socket_path
        ) from None
    if not isinstance(data, bytes):
        raise MalformedResponse(
            "ListPodResourcesResponse", f"got {type(data).__name__}", socket_path=socket_path
        )
    try:
        return decode_list_response(data)
    except MalformedResponse as exc:
        raise MalformedResponse(exc.where, exc.problem, socket_path=socket_path) from None


def _target(socket_path: str) -> str | None:
    """gRPC's name for the socket (`unix:<absolute path>`), or None when nothing is there."""
    return "unix:" + os.path.abspath(socket_path) if os.path.exists(socket_path) else None


async def device_plugin_gpus(
    socket_path: str = DEFAULT_SOCKET, *, timeout_s: float, resource: str = GPU_RESOURCE
) -> dict[str, tuple[str, ...]] | None:
    """Pod "namespace/name" → the IDs of the `resource` devices its containers hold, for every
    pod that holds at least one; None when the socket does not exist. Raises
    PodResourcesError (PodResourcesTimeout, MalformedResponse)."""
    pods = await list_pod_resources(socket_path, timeout_s=timeout_s)
    return None if pods is None else devices_by_pod(pods, resource=resource)


def devices_by_pod(
    pods: Iterable[PodResources], *, resource: str = GPU_RESOURCE
) -> dict[str, tuple[str, ...]]:
    """Pod key → its `resource` device IDs, each once, in the order first seen (kubelet hands
    an init container's devices on to the app containers, so one ID can show twice)."""
    ids: dict[str, dict[str, None]] = {}
    for pod in pods:
        held = ids.setdefault(pod.key, {})
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name == resource:
                    held.update(dict.fromkeys(devices.device_ids))
    return {key: tuple(held) for key, held in ids.items() if held}


# -- the messages, to and from the generated code --------------------------------------------


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """The pods of a ListPodResourcesResponse in its wire form. Raises MalformedResponse."""
    where = "ListPodResourcesResponse"
    try:
        message = api_pb2.ListPodResourcesResponse.FromString(data)
    except DecodeError as exc:
        raise MalformedResponse(where, str(exc) or "does not parse") from None
    return tuple(
        PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=tuple(
                ContainerResources(
                    name=c.name,
                    devices=tuple(
                        ContainerDevices(
                            resource_name=d.resource_name, device_ids=tuple(d.device_ids)
                        )
                        for d in c.devices
                    ),
                )
                for c in pod.containers
            ),
        )
        for pod in message.pod_resources
    )
