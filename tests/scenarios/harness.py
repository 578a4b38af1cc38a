"""A harness for the acceptance scenarios (issue #7): `mpsched serve --kubeconfig K --config C`
as a subprocess against the fake API server in the test process, driven over loopback HTTP with
kube-scheduler's verbs, read through `/status` and `/metrics`.

The server under test is `sys.executable -m extender` from this checkout, or, when the
environment variable `MPSCHED_UNDER_TEST` names another checkout, the same command with
`PYTHONPATH=<that checkout>`: the same scenarios then measure an older version::

    git -C /work/main worktree add /tmp/old-main 4368312
    MPSCHED_UNDER_TEST=/tmp/old-main pytest tests/scenarios -rA

Every scenario writes one `FIGURE <scenario>: ...` line (shown by `pytest -rA`) with what it
measured, before it asserts, so that a failing run still reports its figure.

Timing: the scenarios set `api: {requestTimeoutSeconds: 1.0, bindTimeoutSeconds: 3.0}` (the
defaults are 4 and 8 s) so that an unanswered call is given up in about a second and an
unanswered bind in about three. An older checkout whose configuration has no `api` section
(it would reject the key) gets the document without it. Every wait polls a condition against
a deadline; nothing assumes the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml

from extender_bench.processes import free_ports
from tests.kube.fake_apiserver import FakeApiServer, serving

#: Settings that keep the scenarios short (defaults: requestTimeoutSeconds 4, bindTimeout 8).
FAST_API: Final = {"requestTimeoutSeconds": 1.0, "bindTimeoutSeconds": 3.0}
#: Seconds serve may take to list the fake and report ready (a cold start on a busy machine).
READY_DEADLINE_S: Final = 60.0
#: Seconds a verb call may take before the harness gives up on it (above any bind deadline).
VERB_TIMEOUT_S: Final = 40.0
#: How often conditions are polled.
POLL_S: Final = 0.05
#: Seconds serve's configuration watch may take to pick up a rewritten file and rebuild
#: (it looks every 2 s).
RELOAD_DEADLINE_S: Final = 30.0
#: serve re-reads its config when (mtime_ns, size) changes; rewrites keep the size distinct.
_ROOT: Final = Path(__file__).resolve().parents[2]


def under_test() -> Path:
    """The checkout whose `extender` package is run: MPSCHED_UNDER_TEST, or this one."""
    other = os.environ.get("MPSCHED_UNDER_TEST")
    return Path(other).resolve() if other else _ROOT


def knows_api_settings(checkout: Path) -> bool:
    """Whether that checkout's configuration has the `api` section (older ones reject it)."""
    try:
        text = (checkout / "extender" / "config.py").read_text()
    except OSError:
        return False
    return '"api": (' in text


def free_port() -> int:
    """A free loopback port below the ephemeral range (see `free_ports`)."""
    (port,) = free_ports(1)
    return port


def figure(scenario: str, **values: object) -> None:
    """Record what a scenario measured (printed; `pytest -rA` shows it, pass or fail)."""
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    print(f"FIGURE {scenario}: {shown} [under test: {under_test()}]", flush=True)


async def wait_for(
    condition: Callable[[], Awaitable[bool] | bool],
    *,
    deadline_s: float,
    what: str,
) -> float:
    """Poll `condition` until it holds; returns the seconds it took. Fails after deadline_s."""
    start = time.monotonic()
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > deadline_s:
            raise AssertionError(f"not within {deadline_s:.0f} s: {what}")
        await asyncio.sleep(POLL_S)


async def seconds_until(
    condition: Callable[[], Awaitable[bool] | bool], *, deadline_s: float, what: str
) -> float | None:
    """`wait_for`, but None instead of failing: for a figure recorded before the asserts."""
    try:
        return await wait_for(condition, deadline_s=deadline_s, what=what)
    except AssertionError:
        return None


def pod_threads(obj: Mapping[str, Any]) -> int:
    """The mpsched.io/threads a pod asks for (the builders' pods: one container)."""
    total = 0
    for c in obj["spec"]["containers"]:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(limits.get("mpsched.io/threads", "0"))
    return total


def threads_given_out(fake: FakeApiServer, node: str) -> int:
    """Threads the API server shows given out on `node`: every bind the fake applied there, at
    what its pod asked (the scenarios use one-GPU nodes, so the node's figure is its GPU's)."""
    total = 0
    for namespace, name, bound in fake.binds:
        obj = fake.pods.get((namespace, name))
        if bound == node and obj is not None:
            total += pod_threads(obj)
    return total


def bound_names(fake: FakeApiServer) -> list[str]:
    return [name for _, name, _ in fake.binds]


def binding_requests(fake: FakeApiServer, name: str) -> int:
    """How many Binding requests for pod `name` reached the fake (answered or not)."""
    suffix = f"/pods/{name}/binding"
    return sum(1 for r in fake.requests if r.startswith("POST ") and r.endswith(suffix))


def config_document(
    *,
    budgets: Mapping[str, Any] | None = None,
    api: Mapping[str, Any] | None = None,
    checkout: Path | None = None,
) -> dict[str, Any]:
    """An mpsched configuration: no leader election, the fast API settings (where the checkout
    under test knows them), and the given budgets."""
    doc: dict[str, Any] = {
        "apiVersion": "mpsched.io/v1alpha1",
        "kind": "MpschedConfig",
        "leaderElection": {"enabled": False},
        "budgets": dict(budgets or {}),
        "logging": {"level": "info", "format": "text"},
    }
    if knows_api_settings(checkout or under_test()):
        doc["api"] = {**FAST_API, **(api or {})}
        doc["server"] = {"metricsPort": None}  # /status and /metrics on the verbs port
    return doc


@dataclass
class Serve:
    """A running `mpsched serve` and an HTTP client for it."""

    proc: asyncio.subprocess.Process
    base: str
    http: aiohttp.ClientSession
    config_path: Path
    log_path: Path
    document: dict[str, Any]
    #: Seconds the last stop() took (None: it did not exit within the cap and was killed).
    exit_s: float | None = None
    exit_code: int | None = None
    _rewrites: int = field(default=0)

    # -- kube-scheduler's verbs -----------------------------------------------------------------

    async def _post(self, verb: str, body: Mapping[str, Any]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=VERB_TIMEOUT_S)
        async with self.http.post(f"{self.base}/{verb}", json=body, timeout=timeout) as resp:
            assert resp.status == 200, f"/{verb}: HTTP {resp.status}: {await resp.text()}"
            answer: dict[str, Any] = await resp.json()
            return answer

    async def filter(self, pod: Mapping[str, Any], nodes: list[str]) -> dict[str, Any]:
        """kube-scheduler's filter call (nodeCacheCapable: node names only)."""
        return await self._post("filter", {"Pod": pod, "NodeNames": nodes})

    async def passes_filter(self, pod: Mapping[str, Any], node: str) -> bool:
        answer = await self.filter(pod, [node])
        return node in (answer.get("NodeNames") or [])

    async def bind(self, pod: Mapping[str, Any], node: str) -> str:
        """kube-scheduler's bind call; returns its `Error` ("" when the bind succeeded)."""
        meta = pod["metadata"]
        answer = await self._post(
            "bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta.get("namespace", "default"),
                "PodUID": meta["uid"],
                "Node": node,
            },
        )
        error: str = answer.get("Error") or ""
        return error

    # -- reading it -----------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        async with self.http.get(f"{self.base}/status") as resp:
            assert resp.status == 200, await resp.text()
            doc: dict[str, Any] = json.loads(await resp.read())
            return doc

    async def gpu(self, node: str, index: int = 0) -> dict[str, Any]:
        """One GPU's entry in /status ({} if /status does not list it)."""
        for n in (await self.status()).get("nodes", []):
            if n.get("name") == node:
                for g in n.get("gpus", []):
                    if g.get("index") == index:
                        found: dict[str, Any] = g
                        return found
        return {}

    async def pod_state(self, node: str, name: str) -> str | None:
        """The state /status gives pod `name`'s share on `node`'s GPU 0 (None: not listed)."""
        for p in (await self.gpu(node)).get("pods", []):
            if p.get("name") == name:
                state: str | None = p.get("state")
                return state
        return None

    async def metrics(self) -> str:
        async with self.http.get(f"{self.base}/metrics") as resp:
            assert resp.status == 200, await resp.text()
            return await resp.text()

    async def metric(self, name: str, labels: str = "") -> float | None:
        """The value of one sample (`labels`: the exact `{...}` text, or "" for none)."""
        pattern = re.compile(rf"^{re.escape(name + labels)} (\S+)$", re.M)
        found = pattern.search(await self.metrics())
        return float(found.group(1)) if found else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- configuration --------------------------------------------------------------------------

    def rewrite_config(self, document: Mapping[str, Any]) -> None:
        """Write a new configuration document; serve notices within its 2 s poll. A comment of
        a growing length keeps (mtime, size) distinct from the last write's."""
        self._rewrites += 1
        self.document = copy.deepcopy(dict(document))
        text = yaml.safe_dump(self.document) + "#" * self._rewrites + "\n"
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config_path)

    async def wait_reloaded(self, count: int = 1) -> float:
        """Wait until serve logged `count` reloads of its configuration; returns seconds."""
        return await wait_for(
            lambda: self.log().count(" reloaded") >= count,
            deadline_s=RELOAD_DEADLINE_S,
            what=f"serve logs {count} configuration reload(s)",
        )

    # -- stopping -------------------------------------------------------------------------------

    async def stop(self, *, cap_s: float = 30.0) -> float | None:
        """SIGTERM, then wait up to `cap_s` for the exit (then SIGKILL). Returns the seconds the
        exit took, or None when it did not exit within the cap."""
        if self.proc.returncode is not None:
            self.exit_code = self.proc.returncode
            return self.exit_s
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), cap_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            self.exit_s = None
        else:
            self.exit_s = time.monotonic() - start
        self.exit_code = self.proc.returncode
        return self.exit_s


@contextlib.asynccontextmanager
async def running(
    fake: FakeApiServer, tmp_path: Path, document: Mapping[str, Any] | None = None
) -> AsyncIterator[Serve]:
    """The fake served on loopback and `mpsched serve` against it with `document` as its
    configuration file, ready (/readyz 200). On exit serve is stopped (SIGTERM, at most 30 s,
    then SIGKILL) and the fake closed."""
    document = dict(document or config_document())
    checkout = under_test()
    env = dict(os.environ)
    if checkout != _ROOT:
        env["PYTHONPATH"] = str(checkout)
    async with serving(fake, tmp_path) as served:
        config_path = tmp_path / "mpsched.yaml"
        config_path.write_text(yaml.safe_dump(document))
        log_path = tmp_path / "serve.log"
        port = free_port()
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "extender",
                "serve",
                "--kubeconfig",
                served.kubeconfig,
                "--config",
                str(config_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
                cwd=str(tmp_path),
            )
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        serve = Serve(
            proc=proc,
            base=f"http://127.0.0.1:{port}",
            http=http,
            config_path=config_path,
            log_path=log_path,
            document=copy.deepcopy(document),
        )
        try:

            async def ready() -> bool:
                if proc.returncode is not None:
                    tail = serve.log()[-3000:]
                    raise AssertionError(f"serve exited ({proc.returncode}):\n{tail}")
                try:
                    async with http.get(f"{serve.base}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_for(ready, deadline_s=READY_DEADLINE_S, what="serve reports ready")
            yield serve
        finally:
            await serve.stop()
            await http.close()
