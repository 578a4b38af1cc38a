"""An extender served over real loopback HTTP through `listener.serving`, as `mpsched serve`
runs it, over an embedded cluster of GPU nodes; and raw-socket helpers for the abuse tests."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from extender.cluster.embedded import EmbeddedCluster
from extender.config import Config
from extender.http.app import make_app
from extender.http.keys import HttpSettings
from extender.http.listener import GuardedSite, serving
from extender.service import ExtenderService
from tests.http.kube_objects import gpu_node, pod

Json = dict[str, Any]


def node_names(count: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(count)]


@dataclass
class Served:
    service: ExtenderService
    site: GuardedSite
    names: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.site.port}"

    def filter_body(self, p: Json | None = None, names: Sequence[str] | None = None) -> bytes:
        chosen = list(self.names if names is None else names)
        return orjson.dumps({"Pod": p or pod("probe", threads=10), "NodeNames": chosen})


@contextlib.asynccontextmanager
async def served(
    settings: HttpSettings, *, nodes: int = 50, objects: Sequence[Json] = ()
) -> AsyncIterator[Served]:
    names = node_names(nodes)
    cluster = EmbeddedCluster.from_objects([*(gpu_node(n, gpus=2) for n in names), *objects])
    service = ExtenderService(cluster=cluster, config=Config.default())
    async with serving(make_app(service, settings), settings, host="127.0.0.1", port=0) as site:
        await asyncio.wait_for(service.wait_ready(), 10)
        yield Served(service, site, names)


def raise_fd_limit(wanted: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `wanted`, or skip the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"needs {wanted} file descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def closed_by_peer(reader: asyncio.StreamReader) -> bytes:
    """Read until the server closes the connection; what it sent before."""
    seen = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            seen += chunk
    return seen
