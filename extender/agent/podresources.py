"""kubelet's PodResources API (v1, `k8s.io/kubelet/pkg/apis/podresources/v1`): which devices the
device plugins gave each pod, read over kubelet's unix socket. The agent asks it which GPUs pods
hold through NVIDIA's device plugin (`nvidia.com/gpu`): those GPUs are not mpsched's to share
(DESIGN §5a rule 3).

Owns the one call (`/v1.PodResourcesLister/List`, gRPC through grpcio's asyncio API) and the
protobuf wire form of just the fields it reads, written out by hand so that the agent needs no
generated code and no protobuf runtime:

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }

Every other field (cpu_ids, memory, topology, dynamic_resources, fields added later) is skipped
by its wire type, as a protobuf parser would. An answer that does not parse raises
`MalformedResponse` naming the field at fault; a failed call raises `PodResourcesError` carrying
the gRPC status code.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Final

import grpc

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
GPU_RESOURCE: Final = "nvidia.com/gpu"
#: kubelet's own PodResources client allows 16 MiB answers (grpc's default is 4 MiB): a node
#: with many pods and many CPU IDs per container can pass 4 MiB.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Beyond the gRPC deadline, time for the channel to close before the call counts as hung.
_CLOSE_GRACE_S: Final = 1.0
#: Nested groups deeper than this are not a kubelet answer (and would exhaust the stack).
_MAX_GROUP_DEPTH: Final = 32

# Wire types (protobuf encoding spec).
VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
SGROUP: Final = 3
EGROUP: Final = 4
I32: Final = 5


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
    """The answer is not a ListPodResourcesResponse; `where` names the field at fault."""

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
                # No serializers: the request goes as the bytes given, the answer comes as bytes.
                call = channel.unary_unary(LIST_METHOD)
                # ListPodResourcesRequest has no fields: its encoding is empty.
                data = await call(b"", timeout=timeout_s)
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
    if not os.path.exists(socket_path):
        return None
    return "unix:" + os.path.abspath(socket_path)


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


# -- the wire form: decoding -------------------------------------------------------------------

_WireValue = int | bytes | None


def _varint(data: bytes, pos: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise MalformedResponse(where, "truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise MalformedResponse(where, "varint longer than 10 bytes")


def _field(data: bytes, pos: int, where: str, depth: int = 0) -> tuple[int, int, _WireValue, int]:
    """The field at `pos`: (number, wire type, value, next position). A group is skipped whole
    (value None); an end-group marker is returned for the caller to judge."""
    key, pos = _varint(data, pos, where)
    number, wire = key >> 3, key & 7
    if number == 0:
        raise MalformedResponse(where, "field number 0")
    if wire == VARINT:
        value, pos = _varint(data, pos, where)
        return number, wire, value, pos
    if wire in (I64, I32):
        size = 8 if wire == I64 else 4
        if pos + size > len(data):
            raise MalformedResponse(where, f"field {number} truncated")
        return number, wire, int.from_bytes(data[pos : pos + size], "little"), pos + size
    if wire == LEN:
        length, pos = _varint(data, pos, where)
        if pos + length > len(data):
            raise MalformedResponse(
                where, f"field {number} says {length} bytes, {len(data) - pos} left"
            )
        return number, wire, data[pos : pos + length], pos + length
    if wire == SGROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise MalformedResponse(where, "groups nested too deep")
        while True:
            if pos >= len(data):
                raise MalformedResponse(where, f"group {number} not closed")
            inner, inner_wire, _, pos = _field(data, pos, where, depth + 1)
            if inner_wire == EGROUP:
                if inner != number:
                    raise MalformedResponse(where, f"group {number} closed as {inner}")
                return number, wire, None, pos
    if wire == EGROUP:
        return number, wire, None, pos
    raise MalformedResponse(where, f"field {number} has wire type {wire}, which does not exist")


def _fields(data: bytes, where: str) -> Iterator[tuple[int, int, _WireValue]]:
    pos = 0
    while pos < len(data):
        number, wire, value, pos = _field(data, pos, where)
        if wire == EGROUP:
            raise MalformedResponse(where, f"end of group {number} that never began")
        yield number, wire, value


def _payload(wire: int, value: _WireValue, where: str) -> bytes:
    """A known field's bytes: every field read here is a string or a message."""
    if wire != LEN or not isinstance(value, bytes):
        raise MalformedResponse(where, f"wire type {wire}, expected 2 (length-delimited)")
    return value


def _text(wire: int, value: _WireValue, where: str) -> str:
    try:
        return _payload(wire, value, where).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedResponse(where, "not valid UTF-8") from None


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """A ListPodResourcesResponse from its wire form. Raises MalformedResponse."""
    where = "ListPodResourcesResponse"
    pods: list[PodResources] = []
    for number, wire, value in _fields(data, where):
        if number == 1:
            at = f"{where}.pod_resources[{len(pods)}]"
            pods.append(_decode_pod(_payload(wire, value, at), at))
    return tuple(pods)


def _decode_pod(data: bytes, where: str) -> PodResources:
    name = namespace = ""
    containers: list[ContainerResources] = []
    for number, wire, value in _fields(data, where):
        if number == 1:
            name = _text(wire, value, f"{where}.name")
        elif number == 2:
            namespace = _text(wire, value, f"{where}.namespace")
        elif number == 3:
            at = f"{where}.containers[{len(containers)}]"
            containers.append(_decode_container(_payload(wire, value, at), at))
    return PodResources(name=name, namespace=namespace, containers=tuple(containers))


def _decode_container(data: bytes, where: str) -> ContainerResources:
    name = ""
    devices: list[ContainerDevices] = []
    for number, wire, value in _fields(data, where):
        if number == 1:
            name = _text(wire, value, f"{where}.name")
        elif number == 2:
            at = f"{where}.devices[{len(devices)}]"
            devices.append(_decode_devices(_payload(wire, value, at), at))
    return ContainerResources(name=name, devices=tuple(devices))


def _decode_devices(data: bytes, where: str) -> ContainerDevices:
    resource = ""
    ids: list[str] = []
    for number, wire, value in _fields(data, where):
        if number == 1:
            resource = _text(wire, value, f"{where}.resource_name")
        elif number == 2:
            ids.append(_text(wire, value, f"{where}.device_ids[{len(ids)}]"))
    return ContainerDevices(resource_name=resource, device_ids=tuple(ids))


# -- the wire form: encoding (the fake kubelet answers with it) --------------------------------


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | LEN) + _varint_bytes(len(payload)) + payload


def _string_field(number: int, text: str) -> bytes:
    # proto3 leaves a singular field at its default (the empty string) out of the wire form.
    return _len_field(number, text.encode("utf-8")) if text else b""


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    """The wire form of a ListPodResourcesResponse holding `pods` (fields in number order, as
    protobuf's serializers write them)."""
    return b"".join(_len_field(1, _encode_pod(pod)) for pod in pods)


def _encode_pod(pod: PodResources) -> bytes:
    return b"".join(
        [
            _string_field(1, pod.name),
            _string_field(2, pod.namespace),
            *(_len_field(3, _encode_container(c)) for c in pod.containers),
        ]
    )


def _encode_container(container: ContainerResources) -> bytes:
    return b"".join(
        [
            _string_field(1, container.name),
            *(_len_field(2, _encode_devices(d)) for d in container.devices),
        ]
    )


def _encode_devices(devices: ContainerDevices) -> bytes:
    return b"".join(
        [
            _string_field(1, devices.resource_name),
            # Repeated: every element is written, empty ones too.
            *(_len_field(2, i.encode("utf-8")) for i in devices.device_ids),
        ]
    )
