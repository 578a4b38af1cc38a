"""Usage against shares: cgroup texts as kubelet's two drivers and both cgroup versions write
them, and the over-share decision on samples shaped like the NVML adapter's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from extender.agent.usage import (
    ClientReading,
    GpuReading,
    allocations_of,
    assess,
    pod_uid_from_cgroup,
)
from extender.packing.codec import ALLOCATION_KEY, encode_allocation
from extender.packing.ledger import Allocation, GpuRef
from extender.packing.request import ContainerDemand

UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
UID_ = UID.replace("-", "_")
CTR = "4f1c0a9e8b7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170695a4b3"
GPU0 = "GPU-2f3a6d1c-8b4e-4f7a-9c0d-1e2f3a4b5c6d"
GPU1 = "GPU-7c8d9e0f-1a2b-4c3d-8e4f-5a6b7c8d9e0f"

# A cgroup v1 host (hybrid layout): one line per hierarchy, every one naming the same pod.
V1_CGROUPFS = "\n".join(
    [
        f"12:memory:/kubepods/burstable/pod{UID}/{CTR}",
        f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CTR}",
        f"10:devices:/kubepods/burstable/pod{UID}/{CTR}",
        "1:name=systemd:/system.slice/containerd.service",
        f"0::/kubepods/burstable/pod{UID}/{CTR}",
        "",
    ]
)
V1_SYSTEMD = (
    f"12:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
    f"cri-containerd-{CTR}.scope\n"
    f"4:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
    f"cri-containerd-{CTR}.scope\n"
)


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver (containerd, the default on current distributions)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{CTR}.scope\n",
        # v2, systemd, guaranteed (no QoS slice), CRI-O
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CTR}.scope\n",
        # v2, systemd, besteffort, docker through cri-dockerd
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"docker-{CTR}.scope\n",
        # v2, cgroupfs driver
        f"0::/kubepods/burstable/pod{UID}/{CTR}\n",
        f"0::/kubepods/pod{UID}/{CTR}\n",
        f"0::/kubepods/besteffort/pod{UID}/{CTR}",
        # v1, both drivers
        V1_CGROUPFS,
        V1_SYSTEMD,
        f"12:memory:/kubepods/pod{UID}/{CTR}\n",
        # kubelet with --cgroup-root (kind's nodes): a prefix above kubepods
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CTR}.scope\n",
        f"0::/kubelet/kubepods/burstable/pod{UID}/{CTR}\n",
        # a process in the pod's own cgroup (no container level)
        f"0::/kubepods/burstable/pod{UID}\n",
    ],
)
def test_the_pod_uid_is_read_from_every_kubelet_layout(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",  # a process in its own cgroup namespace: nothing to tell
        "0::/system.slice/nvidia-mps.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # a QoS level, no pod
        f"0::/kubepods/burstable/{CTR}\n",
        # a pod-looking directory kubelet would never make
        f"0::/system.slice/pod{UID}/{CTR}\n",
        f"0::/kubepods/burstable/extra/pod{UID}/{CTR}\n",
        # the UID cut short, upper case, or in the other driver's spelling
        f"0::/kubepods/burstable/pod{UID[:-1]}/{CTR}\n",
        f"0::/kubepods/burstable/pod{UID.upper()}/{CTR}\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice\n",
        f"0::/kubepods/burstable/pod{UID_}/{CTR}\n",
        # two pods at once: the text names no one pod
        f"12:memory:/kubepods/pod{UID}/{CTR}\n"
        f"11:cpu:/kubepods/pod{UID.replace('1b2c', 'ffff')}/{CTR}\n",
        "not a cgroup file at all",
    ],
)
def test_anything_else_names_no_pod(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


USER = "/user.slice/user-1000.slice/user@1000.service/app.slice"


@pytest.mark.parametrize(
    "text",
    [
        # A user's delegated subtree holds directories named like the victim's pod cgroups.
        f"0::{USER}/kubepods-pod{UID_}.slice/x.scope\n",
        f"0::{USER}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{CTR}.scope\n",
        f"0::/user.slice/kubepods-besteffort-pod{UID_}.slice\n",
        f"0::{USER}/kubepods/burstable/pod{UID}/{CTR}\n",
        f"0::/user.slice/kubepods/pod{UID}/{CTR}\n",
        # v1: one hierarchy in the user's subtree, the others not in any pod.
        f"12:memory:{USER}/kubepods/pod{UID}/{CTR}\n11:cpu,cpuacct:/user.slice/user-1000.slice\n",
        f"4:pids:{USER}/kubepods.slice/kubepods-pod{UID_}.slice\n",
        # A slice out of its place: the QoS slice missing, or the pod's parent the wrong one.
        f"0::/kubepods-burstable-pod{UID_}.slice/x.scope\n",
        f"0::/kubepods.slice/kubepods-burstable-pod{UID_}.slice/x.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{UID_}.slice\n",
        # Pods of a kubelet nested in a container runtime's own cgroups (a kind node).
        f"0::/system.slice/docker-{CTR}.scope/kubepods.slice/kubepods-pod{UID_}.slice/x.scope\n",
        f"0::/machine.slice/libpod-{CTR}.scope/kubepods/burstable/pod{UID}/{CTR}\n",
        f"12:memory:/docker/{CTR}/kubepods/besteffort/pod{UID}/{CTR}\n",
        f"0::/docker/kubepods/pod{UID}/{CTR}\n",
        f"0::/system.slice/containerd.service/kubepods/pod{UID}/{CTR}\n",
    ],
)
def test_a_pod_like_cgroup_outside_kubelets_place_names_no_pod(text: str) -> None:
    """Before: every one of these named the victim's UID (the systemd pattern matched anywhere
    on the path, and cgroupfs accepted any directories above `kubepods`)."""
    assert pod_uid_from_cgroup(text) is None


# -- assess ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Client:
    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True, slots=True)
class Sample:
    index: int
    uuid: str
    mps_clients: tuple[Client, ...] = ()


def _share(uid: str, name: str, *, gpu: GpuRef, memory_mib: int, clients: int) -> Allocation:
    return Allocation(
        pod_uid=uid,
        namespace="ml",
        name=name,
        node="gpu-1",
        kind="share",
        gpus=(gpu,),
        threads=25,
        memory_mib=memory_mib,
        clients=clients,
        containers=(ContainerDemand("main", 25, memory_mib, clients),),
    )


A = _share("uid-a", "a", gpu=GpuRef(0, GPU0), memory_mib=8192, clients=1)
B = _share("uid-b", "b", gpu=GpuRef(0, GPU0), memory_mib=4096, clients=2)
# threads only: no memory budget
C = _share("uid-c", "c", gpu=GpuRef(1, GPU1), memory_mib=0, clients=1)
W = Allocation(
    pod_uid="uid-w", namespace="ml", name="w", node="gpu-1", kind="whole", gpus=(GpuRef(1, GPU1),)
)
ALLOCS = {a.pod_uid: a for a in (A, B, C)}


def test_samples_shaped_like_the_nvml_adapters_satisfy_the_protocols() -> None:
    # Checked by mypy: these assignments fail type checking if the protocols drift.
    client: ClientReading = Client(1, None)
    gpu: GpuReading = Sample(0, GPU0, (Client(1, 2),))
    assert client.pid == 1 and gpu.mps_clients[0].used_memory_mib == 2


def test_pods_within_their_share_are_not_over_and_idle_shares_show() -> None:
    samples = [Sample(0, GPU0, (Client(100, 8000), Client(200, 1000), Client(201, 3000)))]
    owners = {100: "uid-a", 200: "uid-b", 201: "uid-b"}
    report = assess(samples, owners, ALLOCS, tolerance_mib=0)
    assert [
        (p.name, p.used_mib, p.allowed_mib, p.clients, p.allowed_clients) for p in report.pods
    ] == [
        ("a", 8000, 8192, 1, 1),
        ("b", 4000, 4096, 2, 2),
    ]
    assert not report.over_share and report.unknown_clients == ()
    # C's GPU sampled too: its share shows, idle.
    both = assess([*samples, Sample(1, GPU1)], owners, ALLOCS, tolerance_mib=0)
    (c,) = [p for p in both.pods if p.name == "c"]
    assert (c.gpu_index, c.used_mib, c.clients, c.allowed_mib, c.over_share) == (
        1,
        0,
        0,
        None,
        False,
    )


def test_memory_over_the_share_is_reported_with_the_numbers_beyond_the_tolerance() -> None:
    samples = [Sample(0, GPU0, (Client(100, 8300),))]
    (a,) = assess(samples, {100: "uid-a"}, {"uid-a": A}, tolerance_mib=0).pods
    assert a.over_share
    assert a.reason == "uses 8300 MiB on GPU 0, allowed 8192 MiB"
    (a,) = assess(samples, {100: "uid-a"}, {"uid-a": A}, tolerance_mib=200).pods
    assert not a.over_share and a.reason == ""
    (a,) = assess(samples, {100: "uid-a"}, {"uid-a": A}, tolerance_mib=100).pods
    assert a.reason == "uses 8300 MiB on GPU 0, allowed 8192 MiB + 100 MiB tolerance"
    # exactly at the limit plus tolerance is within
    (a,) = assess(samples, {100: "uid-a"}, {"uid-a": A}, tolerance_mib=108).pods
    assert not a.over_share


def test_more_clients_than_allocated_is_over_and_both_reasons_are_named() -> None:
    clients = tuple(Client(pid, 3000) for pid in (100, 101, 102))
    (a,) = assess(
        [Sample(0, GPU0, clients)],
        dict.fromkeys((100, 101, 102), "uid-a"),
        {"uid-a": A},
        tolerance_mib=0,
    ).pods
    assert (a.clients, a.used_mib, a.over_share) == (3, 9000, True)
    assert a.reason == "uses 9000 MiB on GPU 0, allowed 8192 MiB; 3 MPS clients on GPU 0, allowed 1"
    assert "\n" not in a.reason


def test_a_share_without_a_memory_budget_is_never_over_on_memory() -> None:
    (c,) = assess(
        [Sample(1, GPU1, (Client(7, 70_000),))], {7: "uid-c"}, ALLOCS, tolerance_mib=0
    ).pods
    assert (c.used_mib, c.allowed_mib, c.over_share, c.reason) == (70_000, None, False, "")


def test_clients_on_a_gpu_the_pod_was_not_given_are_over_its_share() -> None:
    samples = [Sample(0, GPU0, (Client(100, 500),)), Sample(1, GPU1, (Client(101, 700),))]
    report = assess(samples, {100: "uid-a", 101: "uid-a"}, {"uid-a": A}, tolerance_mib=0)
    on0, on1 = report.pods
    assert (on0.gpu_index, on0.over_share) == (0, False)
    assert (on1.gpu_index, on1.used_mib, on1.allowed_mib, on1.allowed_clients) == (1, 700, 0, 0)
    assert on1.over_share
    assert on1.reason == "1 MPS client (700 MiB) on GPU 1, but its allocation is on GPU 0"
    assert report.over_share == (on1,)


def test_gpus_are_matched_by_uuid_so_a_renumbered_gpu_is_not_mistaken() -> None:
    # The node's GPUs were renumbered: GPU0's uuid now sits at index 1.
    samples = [Sample(1, GPU0, (Client(100, 100),))]
    (a,) = assess(samples, {100: "uid-a"}, {"uid-a": A}, tolerance_mib=0).pods
    assert (a.gpu_index, a.over_share) == (1, False)
    # ... and another GPU at A's index is not A's.
    (a, *_) = assess(
        [Sample(0, GPU1, (Client(100, 100),))], {100: "uid-a"}, {"uid-a": A}, tolerance_mib=0
    ).pods
    assert a.over_share and "allocation is on GPU 0" in a.reason


def test_label_derived_stand_in_uuids_are_matched_by_index() -> None:
    alloc = replace(A, gpus=(GpuRef(0, "gpu-1-gpu0"),))
    (a,) = assess(
        [Sample(0, GPU0, (Client(100, 100),))], {100: "uid-a"}, {"uid-a": alloc}, tolerance_mib=0
    ).pods
    assert not a.over_share


def test_a_gpu_given_out_whole_has_no_share_budget() -> None:
    clients = tuple(Client(pid, 40_000) for pid in range(10, 14))
    (w,) = assess(
        [Sample(1, GPU1, clients)],
        dict.fromkeys(range(10, 14), "uid-w"),
        {"uid-w": W},
        tolerance_mib=0,
    ).pods
    assert (w.used_mib, w.allowed_mib, w.clients, w.allowed_clients) == (160_000, None, 4, None)
    assert not w.over_share


def test_clients_of_no_pod_or_of_a_pod_without_an_allocation_are_unknown() -> None:
    samples = [
        Sample(0, GPU0, (Client(100, 10), Client(300, 10), Client(5, 10))),
        Sample(1, GPU1, (Client(4, 10),)),
    ]
    # 300 belongs to a device-plugin pod (no allocation), 5 and 4 to no pod at all.
    report = assess(samples, {100: "uid-a", 300: "uid-dp"}, {"uid-a": A}, tolerance_mib=0)
    assert report.unknown_clients == ((0, 5), (0, 300), (1, 4))
    assert [p.name for p in report.pods] == ["a"]


def test_unknown_memory_counts_zero_and_rows_are_sorted() -> None:
    samples = [Sample(0, GPU0, (Client(200, None), Client(100, 10)))]
    report = assess(samples, {100: "uid-a", 200: "uid-b"}, ALLOCS, tolerance_mib=0)
    assert [(p.name, p.used_mib, p.clients) for p in report.pods] == [("a", 10, 1), ("b", 0, 1)]
    assert assess([], {}, ALLOCS, tolerance_mib=0).pods == ()


# -- allocations_of --------------------------------------------------------------------------


def _pod(
    uid: str, name: str, *, node: str = "gpu-1", phase: str = "Running", alloc: str | None = None
) -> dict[str, Any]:
    annotations = {ALLOCATION_KEY: alloc} if alloc is not None else {}
    return {
        "metadata": {"uid": uid, "namespace": "ml", "name": name, "annotations": annotations},
        "spec": {"nodeName": node, "priority": 7},
        "status": {"phase": phase},
    }


def test_allocations_of_decodes_the_running_pods_of_the_node() -> None:
    pods: list[Any] = [
        _pod("uid-a", "a", alloc=encode_allocation(A)),
        _pod("uid-b", "b", alloc=encode_allocation(B), phase="Succeeded"),  # terminal
        _pod("uid-c", "c", alloc=encode_allocation(C), node="gpu-2"),  # elsewhere
        _pod("uid-d", "d"),  # not mpsched's
        _pod("uid-e", "e", alloc='{"v": 2}'),
        _pod("uid-f", "f", alloc=encode_allocation(replace(A, node="gpu-9"))),
        {"metadata": {"name": "no-uid"}},
        "not even an object",
    ]
    got = allocations_of(pods, "gpu-1")
    assert set(got.by_uid) == {"uid-a"}
    assert got.by_uid["uid-a"] == replace(A, priority=7)
    assert [(u.name, u.pod_uid) for u in got.unreadable] == [("e", "uid-e"), ("f", "uid-f")]
    assert "version 2 is not supported" in got.unreadable[0].reason
    assert got.unreadable[1].reason == "allocation names node 'gpu-9', the pod runs on 'gpu-1'"
