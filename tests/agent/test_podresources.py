"""kubelet's PodResources List: the generated code's wire form against bytes written out by hand
(so a wrong field number in the .proto shows), malformed answers, and the call over a real gRPC
server on a unix socket (`fake_kubelet`)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import grpc
import pytest

from extender.agent.podresources import (
    ContainerDevices,
    ContainerResources,
    MalformedResponse,
    PodResources,
    PodResourcesError,
    PodResourcesTimeout,
    decode_list_response,
    device_plugin_gpus,
    devices_by_pod,
    list_pod_resources,
)
from tests.agent.fake_kubelet import FakeKubelet, encode_list_response

GPU = "nvidia.com/gpu"


def _pod(
    name: str, *containers: tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]
) -> PodResources:
    return PodResources(
        name=name,
        namespace="ml",
        containers=tuple(
            ContainerResources(
                name=c,
                devices=tuple(ContainerDevices(resource_name=r, device_ids=ids) for r, ids in ds),
            )
            for c, ds in containers
        ),
    )


TRAIN = _pod("train", ("main", ((GPU, ("GPU-a", "GPU-b")),)))
IDLE = _pod("idle")

# ListPodResourcesResponse{pod_resources: [TRAIN, IDLE]}, written out field by field.
# tag byte = field number << 3 | wire type (2: length-delimited), then the length.
TRAIN_DEVICES = (
    b"\x0a\x0e" + b"nvidia.com/gpu"  # ContainerDevices.resource_name (1), 14 bytes
    b"\x12\x05" + b"GPU-a"  # .device_ids (2)
    b"\x12\x05" + b"GPU-b"
)  # 30 bytes
TRAIN_CONTAINER = b"\x0a\x04main" + b"\x12\x1e" + TRAIN_DEVICES  # 6 + 32 = 38 bytes
TRAIN_POD = b"\x0a\x05train" + b"\x12\x02ml" + b"\x1a\x26" + TRAIN_CONTAINER  # 7 + 4 + 40 = 51
IDLE_POD = b"\x0a\x04idle\x12\x02ml"  # 10 bytes
KNOWN = b"\x0a\x33" + TRAIN_POD + b"\x0a\x0a" + IDLE_POD


def test_the_encoder_writes_the_bytes_protobuf_would() -> None:
    assert len(TRAIN_DEVICES) == 0x1E and len(TRAIN_POD) == 0x33
    assert encode_list_response([TRAIN, IDLE]) == KNOWN
    assert encode_list_response([]) == b""


def test_hand_written_bytes_decode_and_fields_it_does_not_read_are_skipped() -> None:
    # What a real kubelet adds: ContainerDevices.topology (3), ContainerResources.cpu_ids (3,
    # packed int64) and .memory (4), plus fields of every other wire type a later API may add.
    devices = TRAIN_DEVICES + b"\x1a\x04" + b"\x0a\x02\x08\x01"  # topology{nodes[{ID: 1}]}
    container = (
        b"\x0a\x04main"
        + b"\x12\x24"
        + devices  # 36 bytes
        + b"\x1a\x02\x02\x03"  # cpu_ids: [2, 3]
        + b"\x22\x0e" + b"\x0a\x06memory" + b"\x10\x80\x80\x80\x80\x01"  # memory{size: 2**28}
    )  # fmt: skip
    pod = (
        b"\x0a\x05train\x12\x02ml"
        + b"\x1a\x40"
        + container  # 64 bytes
        + b"\x48\x96\x01"  # field 9, varint 150
        + b"\x55\x01\x02\x03\x04"  # field 10, fixed32
        + b"\x59" + bytes(8)  # field 11, fixed64
        + b"\x63\x08\x07\x64"  # field 12, a group holding field 1 = 7
    )  # fmt: skip
    assert len(container) == 0x40 and len(pod) == 0x62
    data = b"\x0a\x62" + pod + b"\x0a\x0a" + IDLE_POD + b"\x10\x01"  # field 2 at the top too
    assert decode_list_response(data) == (TRAIN, IDLE)
    assert decode_list_response(KNOWN) == (TRAIN, IDLE)
    assert decode_list_response(b"") == ()


def test_round_trip_keeps_empty_and_non_ascii_values() -> None:
    pods = [
        _pod("ünïcode", ("", ((GPU, ("", "GPU-z")), ("example.com/fpga", ("f0",))))),
        PodResources(name="", namespace=""),
        _pod("two", ("init", ((GPU, ("GPU-1",)),)), ("app", ((GPU, ("GPU-1",)),))),
    ]
    assert decode_list_response(encode_list_response(pods)) == tuple(pods)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x0a", "corrupt"),  # a truncated varint
        (b"\x0a\x05ab", "corrupt"),  # field 1 says 5 bytes, 2 left
        (b"\x0a\x02\x0a\x80", "corrupt"),  # pod_resources[0] truncated inside
        (b"\x0a\x04\x12\x02\xff\xfe", "UTF-8"),  # pod_resources[0].namespace
        (b"\x00\x01", "corrupt"),  # field number 0
        (b"\x0c", "corrupt"),  # end of a group that never began
        (b"\x0b\x08\x01", "corrupt"),  # a group never closed
        (b"\x0e", "corrupt"),  # wire type 6 does not exist
        (b"\x08" + b"\xff" * 10 + b"\x01", "corrupt"),  # a varint longer than 10 bytes
    ],
)
def test_a_malformed_answer_raises_typed(data: bytes, problem: str) -> None:
    with pytest.raises(MalformedResponse) as caught:
        decode_list_response(data)
    assert caught.value.where == "ListPodResourcesResponse"
    assert problem in caught.value.problem
    assert caught.value.code == "MALFORMED"


def test_gpus_by_pod_keeps_only_pods_holding_the_resource_each_id_once() -> None:
    pods = [
        TRAIN,
        IDLE,
        _pod("fpga", ("main", (("example.com/fpga", ("f0",)),))),
        # kubelet hands the init container's GPU on to the app container
        _pod("reuse", ("init", ((GPU, ("GPU-c",)),)), ("app", ((GPU, ("GPU-c", "GPU-d")),))),
    ]
    assert devices_by_pod(pods) == {"ml/train": ("GPU-a", "GPU-b"), "ml/reuse": ("GPU-c", "GPU-d")}
    assert devices_by_pod(pods, resource="example.com/fpga") == {"ml/fpga": ("f0",)}


# -- over the socket ---------------------------------------------------------------------------


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


async def test_device_plugin_gpus_asks_kubelet_over_its_socket(sock: Path) -> None:
    async with FakeKubelet(sock, [TRAIN, IDLE]) as kubelet:
        got = await device_plugin_gpus(str(sock), timeout_s=5)
        assert got == {"ml/train": ("GPU-a", "GPU-b")}
        assert kubelet.calls == 1 and kubelet.requests == [b""]  # an empty ListPodResourcesRequest
        kubelet.pods = []
        assert await device_plugin_gpus(str(sock), timeout_s=5) == {}
        assert await list_pod_resources(str(sock), timeout_s=5) == ()


async def test_no_socket_means_none(sock: Path) -> None:
    assert await device_plugin_gpus(str(sock), timeout_s=5) is None
    assert await list_pod_resources(str(sock), timeout_s=5) is None


async def test_a_stale_socket_nobody_listens_on_is_unavailable(sock: Path) -> None:
    # kubelet died and left its socket file behind.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    started = time.monotonic()
    with pytest.raises(PodResourcesError) as caught:
        await device_plugin_gpus(str(sock), timeout_s=3)
    assert caught.value.code == "UNAVAILABLE"
    assert str(sock) in str(caught.value)
    assert time.monotonic() - started < 3


async def test_a_kubelet_that_does_not_answer_times_out(sock: Path) -> None:
    async with FakeKubelet(sock, [TRAIN]) as kubelet:
        kubelet.delay_s = 10
        started = time.monotonic()
        with pytest.raises(PodResourcesTimeout) as caught:
            await device_plugin_gpus(str(sock), timeout_s=0.2)
        assert caught.value.code == "DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 2


async def test_an_error_status_raises_with_its_code(sock: Path) -> None:
    async with FakeKubelet(sock, [TRAIN]) as kubelet:
        kubelet.fail_next = [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED]
        with pytest.raises(PodResourcesError) as caught:
            await device_plugin_gpus(str(sock), timeout_s=5)
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        assert "rejected by rate limit" in str(caught.value)
        with pytest.raises(PodResourcesError) as caught:
            await device_plugin_gpus(str(sock), timeout_s=5)
        assert caught.value.code == "UNIMPLEMENTED"
        assert not isinstance(caught.value, PodResourcesTimeout)
        # the next call is answered again
        assert await device_plugin_gpus(str(sock), timeout_s=5) == {"ml/train": ("GPU-a", "GPU-b")}


async def test_a_malformed_answer_over_the_wire_raises_typed(sock: Path) -> None:
    async with FakeKubelet(sock) as kubelet:
        kubelet.raw = b"\x0a\x05ab"
        with pytest.raises(MalformedResponse) as caught:
            await device_plugin_gpus(str(sock), timeout_s=5)
        assert caught.value.socket_path == str(sock)
        assert str(caught.value).startswith(
            f"kubelet PodResources at {sock}: malformed answer: ListPodResourcesResponse: "
        )


async def test_the_call_leaves_the_loop_free(sock: Path) -> None:
    async with FakeKubelet(sock, [TRAIN]) as kubelet:
        kubelet.delay_s = 0.3
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            assert await device_plugin_gpus(str(sock), timeout_s=5) == {
                "ml/train": ("GPU-a", "GPU-b")
            }
        finally:
            ticker.cancel()
        assert ticks >= 10
