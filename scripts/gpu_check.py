"""The GPU check behind `scripts/gpu-check`, for a machine with an NVIDIA GPU and driver.

1. Discovery as the agent does it (`extender.agent.nvml`, the inventory it would publish).
2. An MPS control daemon started as the agent starts it (`extender.agent.mps.ControlDaemon`),
   in a pipe and log directory of its own under a temporary directory, so that nothing else on
   the machine is touched (the compute mode is left as it is).
3. Clients under that daemon with the env the webhook injects, through the CUDA driver API
   (ctypes on libcuda: nothing to install beyond the project's environment):
   - the SM count a client sees without a thread limit, and with
     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 (expected: about a quarter, and fewer than without);
   - with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M, a 512 MiB allocation succeeds and a
     2048 MiB one fails.
4. The device plugin's delivery: the agent's plugin registers with a stand-in kubelet (the
   tests' fake device manager, real gRPC) and its Allocate answer is applied as a container
   runtime would: the daemon and every client run with CUDA_MPS_PIPE_DIRECTORY from the answer
   and, where the check runs as root with unshare(1), each in a mount namespace of its own with
   the answer's shm directory (a tmpfs, as the DaemonSet's init container mounts it) bound at
   /dev/shm, so that MPS works only if server and clients really meet in that directory.
5. The agent's client check: a client started without its limits and an honest one hold a
   context; the agent's gather (the daemon's client list, NVML, /proc) and check find the
   first (and only it) as `no-limits`; NVML's view of each client is printed; then the daemon's
   `terminate_client` ends it while the honest one goes on.
Exit status 0 when everything holds, 1 when something does not (or a step fails), with what was
seen.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 2**20
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CUDA_ERROR_OUT_OF_MEMORY = 2
THREADS = 25
LIMIT_MIB = 1024


# -- the client: runs in its own process, under the env given to it --------------------------


def client(alloc_mib: int) -> int:
    """Print a JSON line: the SM count this process sees and whether `alloc_mib` MiB could be
    allocated (with the CUDA error code when not)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    out: dict[str, object] = {}

    def check(name: str, code: int) -> None:
        if code != 0:
            out["error"] = f"{name} returned CUDA error {code}"
            print(json.dumps(out))
            raise SystemExit(3)

    check("cuInit", cuda.cuInit(0))
    device = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    context = ctypes.c_void_p()
    check("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    # Under MPS the attribute reflects the client's active thread percentage (MPS doc §2.3.5.2),
    # read once a context exists.
    sms = ctypes.c_int()
    check(
        "cuDeviceGetAttribute",
        cuda.cuDeviceGetAttribute(
            ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device
        ),
    )
    out["sms"] = sms.value
    pointer = ctypes.c_uint64()
    code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(alloc_mib * MIB))
    out["alloc_mib"] = alloc_mib
    out["alloc_ok"] = code == 0
    out["alloc_code"] = code
    if code == 0:
        cuda.cuMemFree_v2(pointer)
    cuda.cuCtxDestroy_v2(context)
    print(json.dumps(out))
    return 0


def hold(seconds: float) -> int:
    """A client that holds a context (and 64 MiB) for `seconds`, printing a JSON line once it
    does; it syncs every 0.2 s and exits 4 printing the CUDA error as soon as one comes (the
    daemon's terminate_client makes every later call fail)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for name, code in (
        ("cuInit", cuda.cuInit(0)),
        ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)),
        ("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(64 * MIB))),
    ):
        if code != 0:
            print(json.dumps({"error": f"{name} returned CUDA error {code}"}), flush=True)
            return 3
    print(json.dumps({"holding": os.getpid()}), flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = cuda.cuCtxSynchronize()
        if code != 0:
            print(json.dumps({"ended_with": code}), flush=True)
            return 4
        time.sleep(0.2)
    return 0


def client_command(args: list[str], binds: list[tuple[str, str]]) -> list[str]:
    """This script with `args`, in a mount namespace of its own where each (host path,
    container path) pair is bound, as the container runtime applies a device plugin's mounts
    (no namespace when `binds` is empty)."""
    command = [sys.executable, __file__, *args]
    return namespaced(command, binds)


def namespaced(command: list[str], binds: list[tuple[str, str]]) -> list[str]:
    binds = [(h, c) for h, c in binds if h != c]
    if not binds:
        return command
    mounts = " && ".join(f"mount --bind {shlex.quote(h)} {shlex.quote(c)}" for h, c in binds)
    # unshare without --fork execs: the client keeps the pid the check knows it by.
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'{mounts} && exec "$@"',
        "sh",
        *command,
    ]


def can_bind() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def run_client(
    env: dict[str, str], alloc_mib: int, binds: list[tuple[str, str]] | None = None
) -> dict[str, object]:
    started = time.monotonic()
    done = subprocess.run(
        client_command(["--client", str(alloc_mib)], binds or []),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, object] = json.loads(lines[-1]) if lines else {}
    result["exit"] = done.returncode
    result["seconds"] = round(time.monotonic() - started, 2)
    if done.returncode != 0 and done.stderr:
        result["stderr"] = done.stderr.strip()[-400:]
    return result


# -- the check --------------------------------------------------------------------------------


def _log_tail(path: Path) -> str:
    """The last 600 characters of the MPS server's log, or "" when it wrote none."""
    return path.read_text(errors="replace")[-600:] if path.exists() else ""


async def check() -> int:
    from extender.agent.inventory import inventory_from_discovery
    from extender.agent.mps import ControlDaemon
    from extender.agent.nvml import Nvml, NvmlError, load_pynvml
    from extender.config import Config
    from extender.config_agent import MpsDaemonSettings
    from extender.packing.codec import encode_inventory

    config = Config.default()
    nvml = Nvml(load_pynvml(), timeout_s=30.0)
    try:
        await nvml.start()
        discovery = await nvml.discover()
    except NvmlError as exc:
        print(f"FAIL discovery: {exc}")
        return 1
    inventory = inventory_from_discovery(
        os.uname().nodename, discovery, labels={}, budgets=config.budgets, mps="ready"
    )
    print(f"driver {discovery.driver_version}, CUDA {discovery.cuda_version}")
    print("inventory the agent would publish:")
    print(json.dumps(json.loads(encode_inventory(inventory)), indent=2))
    await nvml.close()

    with tempfile.TemporaryDirectory(prefix="mpsched-gpu-check-") as tmp:
        pipe, logs = Path(tmp, "pipe"), Path(tmp, "log")
        settings = MpsDaemonSettings(
            log_directory=str(logs),
            exclusive_process=False,
            health_interval_seconds=0.5,
            command_timeout_seconds=10.0,
            foreign_pipe_directories=(),
        )
        daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
        supervisor = asyncio.create_task(daemon.run())
        try:
            async with asyncio.timeout(60):
                while daemon.health().state != "ready":
                    await daemon.changed()
        except TimeoutError:
            print(f"FAIL the MPS daemon did not become ready: {daemon.health()}")
            supervisor.cancel()
            await daemon.stop()
            return 1
        print(f"MPS control daemon ready (pid {daemon.health().pid}, pipe {pipe})")
        base = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        base.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            full = await asyncio.to_thread(run_client, base, 64)
            quarter = await asyncio.to_thread(
                run_client, {**base, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(THREADS)}, 64
            )
            limited = {**base, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={LIMIT_MIB}M"}
            inside = await asyncio.to_thread(run_client, limited, LIMIT_MIB // 2)
            past = await asyncio.to_thread(run_client, limited, LIMIT_MIB * 2)
            servers = await daemon.command("get_server_list")
        finally:
            supervisor.cancel()
            await daemon.stop()
            tail = await asyncio.to_thread(_log_tail, Path(logs, "server.log"))
    print(f"client without a thread limit: {json.dumps(full)}")
    print(f"client with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={THREADS}: {json.dumps(quarter)}")
    print(f"client with a {LIMIT_MIB} MiB pinned limit, {LIMIT_MIB // 2} MiB: {json.dumps(inside)}")
    print(f"client with a {LIMIT_MIB} MiB pinned limit, {LIMIT_MIB * 2} MiB: {json.dumps(past)}")
    print(f"MPS servers seen by the daemon: {servers.split() or 'none'}")
    if tail:
        print("server.log (tail):\n" + tail)
    failures = []
    full_sms, quarter_sms = full.get("sms"), quarter.get("sms")
    if not isinstance(full_sms, int) or not isinstance(quarter_sms, int):
        failures.append("a client could not read its SM count")
    else:
        expected = full_sms * THREADS / 100
        print(
            f"SMs: {full_sms} without a limit, {quarter_sms} at {THREADS} % "
            f"(expected ≈ {expected:.0f})"
        )
        if not (quarter_sms < full_sms and abs(quarter_sms - expected) <= max(2, 0.1 * full_sms)):
            failures.append(f"{THREADS} % of threads gave {quarter_sms} of {full_sms} SMs")
    if inside.get("alloc_ok") is not True:
        failures.append(f"{LIMIT_MIB // 2} MiB under a {LIMIT_MIB} MiB limit failed")
    if past.get("alloc_ok") is not False:
        failures.append(f"{LIMIT_MIB * 2} MiB past a {LIMIT_MIB} MiB limit did not fail")
    for failure in failures:
        print(f"FAIL {failure}")
    print("gpu-check: " + ("FAILED" if failures else "OK: the thread and memory limits hold"))
    return 1 if failures else 0


async def main() -> int:
    # Imported here: that module uses this one's client helpers.
    from gpu_check_delivery import delivery_and_checks

    limits = await check()
    delivered = await delivery_and_checks()
    return 1 if limits or delivered else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        sys.exit(client(int(sys.argv[2])))
    if len(sys.argv) == 3 and sys.argv[1] == "--hold":
        sys.exit(hold(float(sys.argv[2])))
    sys.exit(asyncio.run(main()))
