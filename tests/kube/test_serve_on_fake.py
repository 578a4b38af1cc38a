"""`mpsched serve --kubeconfig` as a subprocess against the fake API server in the test process
(the setup of the whole-service tests): it takes the Lease, lists, reports ready, binds through
the API, and on SIGTERM hands the Lease over and exits promptly."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from extender_bench.processes import free_ports
from tests.http.kube_objects import gpu_node, pod
from tests.kube.fake_apiserver import FakeApiServer, serving


async def test_serve_takes_the_lease_binds_and_releases_on_sigterm(tmp_path: Path) -> None:
    fake = FakeApiServer()
    fake.put(gpu_node("gpu-a", gpus=1))
    fake.put(pod("first", uid="uid-first", threads=60))
    async with serving(fake, tmp_path) as served:
        (port,) = free_ports(1)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "extender",
            "serve",
            "--metrics-port",
            "0",
            "--kubeconfig",
            served.kubeconfig,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(300):
                    try:
                        async with http.get(f"{base}/readyz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("serve never became ready")
                lease = fake.leases[("kube-system", "mpsched")]
                assert lease["spec"]["holderIdentity"]
                args = {
                    "PodName": "first",
                    "PodNamespace": "default",
                    "PodUID": "uid-first",
                    "Node": "gpu-a",
                }
                async with http.post(f"{base}/bind", json=args) as resp:
                    assert resp.status == 200
                    assert (await resp.json()).get("Error", "") == ""
            assert fake.binds == [("default", "first", "gpu-a")]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert fake.leases[("kube-system", "mpsched")]["spec"]["holderIdentity"] == ""
