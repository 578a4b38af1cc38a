"""What of `scripts/gpu-check`'s delivery step runs without a GPU: the agent's plugin answers
the stand-in kubelet's Allocate with the MPS delivery, and the commands that apply the answer's
mounts as a container runtime would bind them in a mount namespace of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gpu_check
import gpu_check_delivery


async def test_the_plugin_answers_the_delivery_the_check_applies(tmp_path: Path) -> None:
    pipe, shm = tmp_path / "pipe", tmp_path / "shm"
    envs, mounts = await gpu_check_delivery._allocate(tmp_path, pipe, shm)
    assert envs == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    assert [(m.host_path, m.container_path) for m in mounts] == [
        (str(pipe), str(pipe)),
        (str(shm), "/dev/shm"),
    ]


def test_mounts_are_bound_in_a_namespace_and_the_pid_is_kept() -> None:
    assert gpu_check.namespaced(["x"], [("/p", "/p")]) == ["x"]  # same path: nothing to bind
    command = gpu_check.namespaced(["prog", "a b"], [("/p", "/p"), ("/s h", "/dev/shm")])
    assert command[:5] == ["unshare", "--mount", "--propagation", "private", "sh"]
    assert "--fork" not in command  # unshare execs: the client keeps the pid it is checked by
    script = command[6]
    assert script == "mount --bind '/s h' /dev/shm && exec \"$@\""
    # The script hands its arguments on intact (run with `true` in place of mount).
    runs = script.replace("mount --bind '/s h' /dev/shm", "true")
    probe = ["sh", "-c", runs, "sh", sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b"]
    out = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['a b']"


def test_the_daemon_wrapper_runs_nvidias_binary_in_the_mounts(tmp_path: Path) -> None:
    assert gpu_check_delivery._wrapper(tmp_path, []) == "nvidia-cuda-mps-control"
    path = Path(gpu_check_delivery._wrapper(tmp_path, [("/s", "/dev/shm")]))
    text = path.read_text()
    assert text.startswith("#!/bin/sh\nexec unshare --mount")
    assert '\'mount --bind /s /dev/shm && exec "$@"\' sh nvidia-cuda-mps-control "$@"' in text
