"""The bench's child processes (serve, the floor, the API servers): free loopback ports,
starting one and waiting for its /readyz, stopping it, what /proc says of it (peak and
current RSS, CPU time, whether it has gone idle), and counters serve's /metrics exports."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: Where the kernel picks the local ports of outgoing connections (and of bind to port 0).
EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port handed out: above the well-known and most registered ones.
LOWEST_PORT: Final = 20000


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports for the servers a run starts, below the ephemeral
    range. A port from that range (bind to port 0), released until its server binds it, may
    meanwhile become the local port of a connection the run opens (serve lists and watches its
    API server before it listens): its server then fails with "address already in use". Ports
    below the range are never given to connections. Each is checked free, and all are held
    while the others are chosen, so that they differ."""
    rng = random.Random()
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default range starts here
    # With no room below the range, the kernel chooses (0).
    top = low - 1 if low - LOWEST_PORT >= 100 * count else 0
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(100 * count):
            if len(ports) == count:
                break
            s = stack.enter_context(socket.socket())
            try:
                s.bind(("127.0.0.1", rng.randint(LOWEST_PORT, top) if top else 0))
            except OSError:
                continue  # taken: another
            ports.append(int(s.getsockname()[1]))
        if len(ports) < count:
            raise RuntimeError(f"no {count} free loopback ports found")
        return ports


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_ready(server: Server, timeout_s: float) -> None:
    """Poll /readyz until 200; fail with the server's last log lines if it exits or stalls."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with status {server.proc.returncode}:\n{server.tail()}"
            )
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout_s:.0f}s:\n{server.tail()}")


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list as taskset writes one ("1", "2-3", "0,2-3"), checked against the CPUs this
    process may run on: ValueError names what is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a CPU number or range") from None
        if first < 0 or last < first:
            raise ValueError(f"{part.strip()!r} is not a CPU range")
        cpus.update(range(first, last + 1))
    usable = os.sched_getaffinity(0)
    if not cpus <= usable:
        missing = ",".join(str(c) for c in sorted(cpus - usable))
        raise ValueError(f"CPU {missing} is not one this process may run on")
    if cpus == usable:
        raise ValueError("it names every CPU: none is left for the driver and the API servers")
    return frozenset(cpus)


@contextlib.contextmanager
def started(
    name: str,
    argv: list[str],
    port: int,
    workdir: Path,
    ready_s: float,
    *,
    cpus: frozenset[int] | None = None,
) -> Iterator[Server]:
    """Start a server and wait until it is ready; on `cpus` only, where given."""
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        # Run from the work directory, not the checkout: with an installed build (the
        # compiled one), the checkout's sources on sys.path would shadow it.
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            # In the child before it runs the server: its threads inherit the set.
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )
    server = Server(name, proc, port, log)
    try:
        wait_ready(server, ready_s)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def rss_mb(pid: int, field: str = "VmHWM") -> float | None:
    """A memory figure of a live process from /proc/<pid>/status, in MB: VmHWM (peak resident
    set) by default, or VmRSS (now). None where /proc has no answer."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def counters(port: int, names: tuple[str, ...], timeout_s: float = 10.0) -> dict[str, float]:
    """The values of the unlabelled counters `names` (`<name>_total`) on serve's /metrics at
    `port`; those it does not export, or all of them where it does not answer, are left out."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode() if response.status == 200 else ""
    except OSError:
        return {}
    finally:
        conn.close()
    wanted = {f"{name}_total": name for name in names}
    found = {}
    for line in text.splitlines():
        metric, _, value = line.partition(" ")
        if metric in wanted:
            with contextlib.suppress(ValueError):
                found[wanted[metric]] = float(value)
    return found


def wait_idle(pid: int, timeout_s: float, *, busy_below: float = 0.05) -> float:
    """Wait until the process has used less than `busy_below` of a core for two seconds in a
    row (an extender may keep warming caches after /readyz says yes; measuring the floor or the
    extender while it does would measure the warm-up). Returns the seconds waited."""
    t0 = time.monotonic()
    calm = 0
    last = cpu_seconds(pid)
    while last is not None and time.monotonic() - t0 < timeout_s and calm < 2:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now is None:
            break
        calm = calm + 1 if now - last < busy_below else 0
        last = now
    return time.monotonic() - t0
