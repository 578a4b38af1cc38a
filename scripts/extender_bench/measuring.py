"""What both drivers measure with: a server under test (`Target`), the scheduler's keep-alive
connection to it, which times each POST (`Client`), its filter call (`post_filter`), the body of
its bind calls (`binding_body`), and the nearest-rank quantile the summaries report (`pct`)."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extender.http.wire import field as wire_field


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule (no interpolation): a p99 that really occurred."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Client:
    """One keep-alive HTTP/1.1 connection, as kube-scheduler's serial loop uses, written on a
    bare socket: http.client's header parsing costs more than a floor request itself, and the
    harness must not hide the extender's latency under its own. Blocking on purpose: the serial
    phase runs no event loop."""

    def __init__(self, port: int, prefix: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.prefix = prefix.rstrip("/")
        self.buf = b""

    def post(self, verb: str, body: bytes) -> tuple[float, bytes]:
        head = (
            f"POST {self.prefix}/{verb} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        self.sock.sendall(head + body)
        status, data = self._response()
        ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            raise RuntimeError(f"{verb} answered HTTP {status}: {data[:200]!r}")
        return ms, data

    def _read_until(self, mark: bytes) -> bytes:
        while (i := self.buf.find(mark)) < 0:
            self._fill()
        out, self.buf = self.buf[:i], self.buf[i + len(mark) :]
        return out

    def _read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _response(self) -> tuple[int, bytes]:
        lines = self._read_until(b"\r\n\r\n").split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            headers[key.strip().lower()] = value.strip()
        if b"content-length" in headers:
            return status, self._read_exact(int(headers[b"content-length"]))
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            while size := int(self._read_until(b"\r\n").split(b";")[0], 16):
                parts.append(self._read_exact(size))
                self._read_exact(2)
            self._read_until(b"\r\n")
            return status, b"".join(parts)
        raise RuntimeError("response has neither Content-Length nor chunked encoding")

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class Target:
    """One server under test."""

    name: str
    port: int
    prefix: str = ""
    #: The server's process, for its CPU time (None: not measured).
    pid: int | None = None


def post_filter(client: Client, pod: dict[str, Any], names: list[str]) -> tuple[float, list[str]]:
    """Filter `pod` over the candidates `names` (nodeCacheCapable): the call's milliseconds and
    the NodeNames that passed. RuntimeError when the answer carries an Error."""
    ms, raw = client.post("filter", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
    reply = orjson.loads(raw)
    if wire_field(reply, "Error"):
        raise RuntimeError(f"filter returned Error: {wire_field(reply, 'Error')}")
    feasible: list[str] = wire_field(reply, "NodeNames") or []
    return ms, feasible


def binding_body(pod: dict[str, Any], node: str) -> bytes:
    """The ExtenderBindingArgs kube-scheduler sends to bind `pod` to `node`."""
    meta = pod["metadata"]
    return orjson.dumps(
        {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
    )
