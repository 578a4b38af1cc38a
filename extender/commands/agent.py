"""`mpsched agent`: the node agent (docs/design.md, Architecture): `--node-name NAME --kubeconfig
PATH --config FILE [--once]`.

Owns the command line and the process wiring: NVML first (on a node without a usable driver the
agent says so in one line and exits 1 before it touches the cluster), then the cluster, the MPS
daemon (multi-user where `isolation.multiUserNodeSelector` selects this node, the rule the
ledger applies), the metrics listener, and a bounded exit on SIGTERM. `--once` discovers,
publishes, prints the inventory JSON and exits, starting no daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from aiohttp import web

from extender import logs
from extender.agent.app import make_app
from extender.agent.deviceplugin import DevicePlugin
from extender.agent.mps import ControlDaemon
from extender.agent.node import NodeAgent, NodeMissing
from extender.agent.nvml import Nvml, NvmlError, load_pynvml
from extender.cluster import ClusterError
from extender.commands.common import configured, stop_signal
from extender.config import Config
from extender.kube.api import KubeCluster

log = logging.getLogger("mpsched.agent")
T = TypeVar("T")

#: Seconds the daemon and the API client get to stop on SIGTERM, within the kubelet's default
#: 30 s grace period.
STOP_TIMEOUT_S = 10.0


class AgentFailed(Exception):
    """A failure worth one line on stderr and exit status 1."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the Node this agent runs on (default: $NODE_NAME)",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (default: in-cluster)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument("--config", metavar="FILE", help="mpsched configuration (YAML)")
    parser.add_argument(
        "--once",
        action="store_true",
        help="discover, publish, print the inventory JSON and exit (no MPS daemon is started)",
    )
    logs.add_level_argument(parser)


def _say(message: str) -> None:
    print(f"mpsched: agent: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        print("mpsched: usage error: --node-name is required (or set NODE_NAME)", file=sys.stderr)
        return 2
    config = configured(args.config, log_level=args.log_level, say=_say)
    if config is None:
        return 1
    try:
        asyncio.run(main_async(args, config))
    except AgentFailed as exc:
        _say(str(exc))
        return 1
    return 0


def build_args(argv: list[str]) -> argparse.Namespace:
    """The agent's flags parsed from `argv` (for tests and embedding)."""
    parser = argparse.ArgumentParser(prog="mpsched agent")
    add_arguments(parser)
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace, config: Config) -> None:
    """The agent's work once flags and configuration are read: `--once`, or run until
    SIGTERM. Raises AgentFailed with one line."""
    async with _nvml(config) as nvml, _cluster(args, config) as cluster:
        if args.once:
            agent = NodeAgent(
                node_name=args.node_name, config=config, nvml=nvml, cluster=cluster, daemon=None
            )
            published = await _guarded(agent.publish())
            if published.inventory is None:
                raise AgentFailed(f"no GPU inventory: {agent.nvml_problem}")
            print(json.dumps(json.loads(published.annotations["mpsched.io/gpus"]), indent=2))
            return
        node = await _guarded(cluster.get_node(args.node_name))
        if node is None:
            raise AgentFailed(f"node {args.node_name!r} does not exist")
        labels = (node.get("metadata") or {}).get("labels") or {}
        daemon = None
        if config.agent.mps.manage:
            daemon = ControlDaemon(
                config.agent.mps,
                pipe_directory=config.webhook.pipe_directory,
                multi_user=config.node_selection().multi_user(labels),
            )
        plugin = None
        if config.agent.device_plugin.enabled:
            plugin = DevicePlugin(
                config.agent.device_plugin, pipe_directory=config.webhook.pipe_directory
            )
        agent = NodeAgent(
            node_name=args.node_name,
            config=config,
            nvml=nvml,
            cluster=cluster,
            daemon=daemon,
            plugin=plugin,
        )
        await _serve(agent, config, daemon)


async def _guarded(call: Awaitable[T]) -> T:
    """Await `call`; the cluster's and NVML's typed failures become one line."""
    try:
        return await call
    except (ClusterError, NodeMissing, NvmlError) as exc:
        raise AgentFailed(str(exc)) from exc


@contextlib.asynccontextmanager
async def _nvml(config: Config) -> AsyncIterator[Nvml]:
    try:
        api = load_pynvml()
    except ImportError as exc:
        raise AgentFailed(f"NVML is not available: cannot import pynvml ({exc})") from exc
    nvml = Nvml(api, timeout_s=config.agent.nvml_timeout_seconds)
    await _guarded(nvml.start())
    try:
        yield nvml
    finally:
        await nvml.close()


@contextlib.asynccontextmanager
async def _cluster(args: argparse.Namespace, config: Config) -> AsyncIterator[KubeCluster]:
    cluster = await _guarded(
        KubeCluster.connect(
            kubeconfig=args.kubeconfig,
            context=args.context,
            request_timeout_s=config.api.request_timeout_seconds,
        )
    )
    try:
        yield cluster
    finally:
        await cluster.close()


async def _serve(agent: NodeAgent, config: Config, daemon: ControlDaemon | None) -> None:
    runner = None
    port = config.agent.metrics_port
    if port is not None:
        runner = web.AppRunner(make_app(agent), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, "0.0.0.0", port).start()
        except OSError as exc:
            await runner.cleanup()
            raise AgentFailed(f"cannot listen on port {port}: {exc.strerror or exc}") from exc
    stop = stop_signal()
    work = asyncio.create_task(agent.run(), name="agent")
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        if daemon is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await daemon.stop()
        if runner is not None:
            await runner.cleanup()
    if work.done() and not work.cancelled() and work.exception() is not None:
        raise AgentFailed(f"the agent stopped: {work.exception()}")
