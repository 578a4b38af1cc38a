"""The per-client check (pure): limits read from an environment, and each way a client can be
outside its pod's share; an honest client yields nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.agent.clients import (
    MEMORY_ENV,
    THREADS_ENV,
    Client,
    Limits,
    check,
    container_id_of,
    container_names,
    limits_of,
    pinned_mib,
)
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.request import ContainerDemand

GPU0 = "GPU-4f8a1c2e-9b3d-4e6f-a1b2-7c8d9e0f1a2b"
UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
HONEST = Limits(threads=25.0, memory_mib=1024)


def alloc(*, clients: int = 1, memory_mib: int = 1024, kind: str = "share") -> Allocation:
    return Allocation(
        pod_uid=UID,
        namespace="ml",
        name="trainer",
        node="gpu-1",
        kind=kind,  # type: ignore[arg-type]
        gpus=(GpuRef(0, GPU0),),
        threads=25 if kind == "share" else 0,
        memory_mib=memory_mib if kind == "share" else 0,
        clients=clients if kind == "share" else 0,
        containers=(ContainerDemand("main", 25, memory_mib, clients),) if kind == "share" else (),
    )


def client(pid: int, **changes: object) -> Client:
    base = Client(
        pid=pid,
        server_pid=900,
        gpu_index=0,
        gpu_uuid=GPU0,
        used_mib=100,
        pod_uid=UID,
        limits=HONEST,
        started=pid,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def run(*clients: Client, allocation: Allocation | None = None) -> list[tuple[str, int]]:
    allocations = {UID: allocation or alloc()}
    found = check(clients, allocations, pods={UID: ("ml", "trainer")}, tolerance_mib=0)
    return [(f.kind, f.pid) for f in found]


@pytest.mark.parametrize(
    ("environ", "threads", "memory"),
    [
        (
            {THREADS_ENV: "25", MEMORY_ENV: "0=1024M"},
            25.0,
            1024,
        ),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "12.5"}, 12.5, None),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,1=512M"}, None, 1024),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-abc=2G"}, None, 2048),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "lots"}, None, None),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "150"}, None, None),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1T"}, None, None),
        ({}, None, None),
    ],
)  # fmt: skip
def test_limits_are_read_as_mps_reads_them(
    environ: dict[str, str], threads: float | None, memory: int | None
) -> None:
    limits = limits_of(environ)
    assert (limits.threads, limits.memory_mib) == (threads, memory)


def test_pinned_limits_take_the_largest_entry() -> None:
    assert pinned_mib("0=4096M") == 4096
    assert pinned_mib("0=1G, 1=3G") == 3072
    assert pinned_mib("") is None and pinned_mib("0=") is None


def test_an_honest_client_is_no_finding() -> None:
    assert run(client(1)) == []
    # Stricter than its share is honest too; an unreadable environment says nothing.
    assert run(client(1, limits=Limits(threads=10.0, memory_mib=512))) == []
    assert run(client(1, limits=None)) == []


def test_a_client_without_its_limits_is_found() -> None:
    assert run(client(1, limits=Limits(threads=None, memory_mib=1024))) == [("no-limits", 1)]
    assert run(client(1, limits=Limits(threads=100.0, memory_mib=1024))) == [("no-limits", 1)]
    assert run(client(1, limits=Limits(threads=25.0, memory_mib=None))) == [("no-limits", 1)]
    assert run(client(1, limits=Limits(threads=25.0, memory_mib=80000))) == [("no-limits", 1)]
    [finding] = check(
        [client(1, limits=Limits(threads=None, memory_mib=None))],
        {UID: alloc()},
        pods={},
        tolerance_mib=0,
    )
    assert finding.text == (
        "MPS client pid 1 started without CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: "
        "it may use every SM of the GPU"
    )
    # A whole-GPU pod's processes are no shares: no limits to hold them to.
    assert (
        run(client(1, limits=Limits(threads=None, memory_mib=None)), allocation=alloc(kind="whole"))
        == []
    )


def test_a_client_on_a_gpu_its_pod_was_not_given_is_found() -> None:
    wrong = client(1, gpu_index=2, gpu_uuid="GPU-7d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6")
    assert run(wrong, client(2)) == [("wrong-gpu", 1)]


def test_the_newest_clients_beyond_the_declared_count_are_found() -> None:
    assert run(client(7, started=100), client(3, started=300), client(5, started=200)) == [
        ("too-many-clients", 3),
        ("too-many-clients", 5),
    ]
    assert run(client(7), client(3), allocation=alloc(clients=2)) == []


def test_memory_over_the_share_finds_the_largest_users_until_the_rest_fits() -> None:
    over = (client(1, used_mib=300), client(2, used_mib=900), client(3, used_mib=200))
    assert run(*over, allocation=alloc(clients=3)) == [("over-memory", 2)]
    assert run(client(1, used_mib=1024)) == []
    found = check([client(1, used_mib=1100)], {UID: alloc()}, pods={}, tolerance_mib=100)
    assert found == ()


def test_clients_of_no_pod_or_of_a_pod_without_allocation() -> None:
    other = "2b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
    stray = client(1, pod_uid=other)
    pods = {UID: ("ml", "trainer"), other: ("ml", "sidecar-only")}
    found = check([stray], {UID: alloc()}, pods=pods, tolerance_mib=0)
    assert [(f.kind, f.name) for f in found] == [("no-allocation", "sidecar-only")]
    # Not our daemon's client (NVIDIA's plugin's, say): not ours to judge; nor a host process.
    assert check([replace(stray, server_pid=None)], {}, pods=pods, tolerance_mib=0) == ()
    assert check([client(1, pod_uid=None)], {UID: alloc()}, pods=pods, tolerance_mib=0) == ()


def test_episode_keys_are_per_client_or_per_pod_and_gpu() -> None:
    a = check(
        [client(1, limits=Limits(threads=None, memory_mib=None))],
        {UID: alloc()},
        pods={},
        tolerance_mib=0,
    )
    b = check([client(2), client(3)], {UID: alloc()}, pods={}, tolerance_mib=0)
    c = check([client(2), client(4)], {UID: alloc()}, pods={}, tolerance_mib=0)
    assert a[0].key == ("no-limits", UID, "1")
    assert b[0].key == c[0].key == ("too-many-clients", UID, "0")


CID = "3f" * 32


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n",
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        f"12:memory:/kubepods/pod{UID}/crio-{CID}.scope\n11:cpu:/kubepods/pod{UID}/crio-{CID}.scope",
    ],
)
def test_the_container_id_is_read_from_the_cgroup(cgroup: str) -> None:
    assert container_id_of(cgroup) == CID


def test_no_container_id_where_the_cgroup_names_none() -> None:
    assert container_id_of("0::/system.slice/nvidia-persistenced.service\n") is None
    assert container_id_of(f"0::/kubepods/pod{UID}\n") is None


def test_container_names_come_from_the_pods_statuses() -> None:
    pod = {
        "status": {
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}],
            "ephemeralContainerStatuses": [
                {"name": "debugger", "containerID": "cri-o://" + "ab" * 32}
            ],
            "initContainerStatuses": [{"name": "init"}],  # not started yet: no ID
        }
    }
    assert container_names([pod, {"status": None}]) == {CID: "main", "ab" * 32: "debugger"}


def test_a_client_is_held_to_its_own_containers_share() -> None:
    two = replace(
        alloc(),
        containers=(ContainerDemand("main", 25, 1024, 1), ContainerDemand("big", 50, 2048, 1)),
    )
    looser = Limits(threads=50.0, memory_mib=2048)
    # Where the container is not known, any container's share will do; where it is, its own.
    assert run(client(1, limits=looser), allocation=two) == []
    assert run(client(1, limits=looser, container="big"), allocation=two) == []
    assert run(client(1, limits=looser, container="main"), allocation=two) == [("no-limits", 1)]


def test_a_container_given_no_share_that_reached_mps_is_found() -> None:
    [finding] = check([client(1, container="sidecar")], {UID: alloc()}, pods={}, tolerance_mib=0)
    assert finding.kind == "no-limits"
    assert (
        finding.text == "MPS client pid 1 runs in container 'sidecar', which was given no GPU share"
    )
