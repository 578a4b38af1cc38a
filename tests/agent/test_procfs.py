"""Client PIDs to pods through a /proc tree laid out like the host's (under tmp_path)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from extender.agent import procfs
from extender.agent.procfs import owners_of

UID_A = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
UID_B = "0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9"
CTR = "0f" * 32


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    b_ = UID_B.replace("-", "_")
    _proc(root, 1, "0::/init.scope\n")
    _proc(root, 4242, f"0::/kubepods/burstable/pod{UID_A}/{CTR}\n")
    _proc(root, 4243, f"0::/kubepods/burstable/pod{UID_A}/{CTR}\n")
    _proc(
        root,
        5000,
        f"0::/kubepods.slice/kubepods-pod{b_}.slice/cri-containerd-{CTR}.scope\n",
    )
    # The MPS server runs beside the agent, in no pod.
    _proc(root, 777, "0::/system.slice/containerd.service\n")
    # Not a process: /proc has other entries too.
    (root / "self").mkdir()
    return root


async def test_owners_maps_pids_in_pods_and_leaves_out_the_rest(proc: Path) -> None:
    got = await owners_of([4242, 4243, 5000, 777, 1], proc_root=str(proc))
    assert got == {4242: UID_A, 4243: UID_A, 5000: UID_B}


async def test_a_vanished_pid_is_simply_absent(proc: Path) -> None:
    # 9999 never existed; 4243's directory is there but its cgroup file is gone (exiting).
    (proc / "4243" / "cgroup").unlink()
    got = await owners_of([9999, 4242, 4243, 4242, 0, -1], proc_root=str(proc))
    assert got == {4242: UID_A}
    assert await owners_of([], proc_root=str(proc)) == {}


async def test_other_read_errors_are_not_hidden(proc: Path) -> None:
    # /proc/<pid>/cgroup as a directory: EISDIR, a fault of the tree, not a vanished pid.
    (proc / "6000" / "cgroup").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        await owners_of([6000], proc_root=str(proc))


async def test_the_batch_is_read_in_one_worker_thread(
    proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[int] = set()
    real = procfs._read_cgroup

    def spy(path: Path) -> str | None:
        threads.add(threading.get_ident())
        return real(path)

    monkeypatch.setattr(procfs, "_read_cgroup", spy)
    loop_thread = threading.get_ident()
    got = await asyncio.wait_for(owners_of([4242, 5000, 777], proc_root=str(proc)), 5)
    assert len(got) == 2
    assert len(threads) == 1 and loop_thread not in threads


async def test_a_user_process_in_a_pod_named_slice_is_no_pods(proc: Path) -> None:
    """A process in a user's own cgroup subtree, under directories named like pod B's slices,
    is no pod's client (it is reported as an unknown client, not blamed on B)."""
    b_ = UID_B.replace("-", "_")
    user = "/user.slice/user-1000.slice/user@1000.service"
    _proc(proc, 7000, f"0::{user}/kubepods.slice/kubepods-pod{b_}.slice/x.scope\n")
    _proc(proc, 7001, f"0::{user}/kubepods/pod{UID_B}/{CTR}\n")
    got = await owners_of([5000, 7000, 7001], proc_root=str(proc))
    assert got == {5000: UID_B}
