"""`mpsched serve`: run the extender's HTTP service.

Owns the command line and process wiring: configuration, the cluster (embedded from
`--cluster-file`, or the Kubernetes API), optional TLS, the event loop (uvloop when installed:
it cuts per-request overhead), and the configuration file watch (docs/design.md, Configuration: a
changed file is re-read; an invalid one is reported in /status and /metrics and the last good one
stays). Blocking work (reading the cluster file, the configuration) happens before the loop starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from extender import logs
from extender.build import build
from extender.cluster import AlwaysLeader, Cluster, ClusterError, Leadership
from extender.cluster.embedded import EmbeddedCluster
from extender.cluster.loader import ClusterFileError
from extender.commands.common import configured, number, stop_signal
from extender.config import Config, ConfigError, load_config
from extender.http.app import make_app, make_observability_app
from extender.http.keys import SERVICE, HttpSettings
from extender.http.listener import serving
from extender.kube import connect, credentials_available, leader_elector
from extender.service import ExtenderService
from extender.tls import CertificateReloader

log = logging.getLogger("mpsched.serve")

NO_CLUSTER = (
    "no cluster: pass --cluster-file PATH for an embedded cluster (a 'kubectl get nodes,pods "
    "-A -o json' dump), or --kubeconfig PATH / in-cluster credentials for a real one"
)
#: Seconds between checks of the configuration file for changes.
CONFIG_POLL_S = 2.0
#: Seconds in-flight requests get to finish on SIGTERM before their connections are closed:
#: a bind is bounded by api.bindTimeoutSeconds anyway, and the whole shutdown must stay well
#: inside a pod's terminationGracePeriodSeconds (30 s by default).
SHUTDOWN_GRACE_S = 3.0
#: Container allocations before a young garbage collection, once serving (default 700).
GC_YOUNG_THRESHOLD = 50_000


def tcp_port(text: str) -> int:
    """A listening port, 1-65535 (argparse type: bad usage, exit status 2, one line)."""
    return number(text, int, lambda p: 1 <= p <= 65535, " is not a TCP port (1-65535)")


def metrics_port(text: str) -> int:
    """`--metrics-port`: a port, or 0 for "on the verbs' listener"."""
    return number(
        text,
        int,
        lambda p: 0 <= p <= 65535,
        " is not a TCP port (1-65535, or 0: on the verbs' listener)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default=None,
        help="address to listen on (default 127.0.0.1; any other needs tls.clientCaFile)",
    )
    parser.add_argument("--port", type=tcp_port, default=None, help="TCP port (default 8888)")
    parser.add_argument(
        "--metrics-port",
        type=metrics_port,
        default=None,
        metavar="P",
        help="port of the /metrics and /status listener (default server.metricsPort, 9464; "
        "0: serve them on the verbs' listener)",
    )
    parser.add_argument("--config", metavar="FILE", help="mpsched configuration (YAML)")
    parser.add_argument(
        "--cluster-file",
        metavar="PATH",
        help="serve an embedded cluster loaded from this dump instead of a real cluster",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig of a real cluster")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    parser.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop: uvloop when installed (auto), or force one",
    )
    logs.add_level_argument(parser)


@dataclass(slots=True)
class _Plan:
    config: Config
    config_path: str | None
    #: The embedded cluster, or None to connect to the API server (`kube`) inside the loop.
    cluster: Cluster | None
    kube: tuple[str | None, str | None]
    host: str
    port: int
    tls: CertificateReloader | None


class _Fatal(Exception):
    """Serving cannot start; the message is the one line to print."""


def _cannot_listen(which: str, host: str, port: int, exc: OSError) -> _Fatal:
    """Serve opens two listeners (the verbs', and the metrics and status one): the line names
    the one that failed, with its own address."""
    return _Fatal(f"cannot listen on {host}:{port} ({which}): {exc.strerror or exc}")


def _fail(message: str) -> int:
    print(f"mpsched: serve: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    config = configured(args.config, log_level=args.log_level, say=_fail)
    if config is None:
        return 1
    if args.metrics_port is not None:
        server = dataclasses.replace(config.server, metrics_port=args.metrics_port or None)
        config = dataclasses.replace(config, server=server)
    host = args.host or config.server.host
    exposed = _exposure_problem(host, config)
    if exposed is not None:
        return _fail(exposed)
    cluster: Cluster | None = None
    if args.cluster_file:
        try:
            cluster = EmbeddedCluster.from_file(args.cluster_file)
        except ClusterFileError as exc:
            return _fail(str(exc))
    elif not (args.kubeconfig or args.context or credentials_available(None)):
        return _fail(NO_CLUSTER)
    tls = None
    if config.tls.cert_file and config.tls.key_file:
        try:
            tls = CertificateReloader(
                config.tls.cert_file, config.tls.key_file, client_ca_file=config.tls.client_ca_file
            )
        except (OSError, ValueError) as exc:
            return _fail(f"cannot load the TLS certificate: {exc}")
    plan = _Plan(
        config=config,
        config_path=args.config,
        cluster=cluster,
        kube=(args.kubeconfig, args.context),
        host=host,
        port=args.port or config.server.port,
        tls=tls,
    )
    try:
        _run_loop(_serve(plan), args.loop)
    except _Fatal as exc:
        return _fail(str(exc))
    except OSError as exc:  # a listener's failure is a _Fatal naming it; this is anything else
        return _fail(f"cannot serve: {exc.strerror or exc}")
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _exposure_problem(host: str, config: Config) -> str | None:
    """Why serving the verbs on `host` would let clients other than kube-scheduler decide
    placements (truth rule 4 of docs/design.md), or None."""
    if _is_loopback(host) or config.tls.client_ca_file is not None:
        return None
    return (
        f"the scheduling verbs on {host} would answer any client that reaches the port; "
        "listen on 127.0.0.1 beside kube-scheduler (--host 127.0.0.1), or set tls.certFile, "
        "tls.keyFile and tls.clientCaFile so that only kube-scheduler's client certificate "
        "(its extender tlsConfig.certFile) is accepted"
    )


def _run_loop(main: Any, choice: str) -> None:
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("mpsched: serve: --loop uvloop: uvloop is not installed") from None
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def http_settings(config: Config) -> HttpSettings:
    """The HTTP layer's settings from the configuration's `server` section."""
    server = config.server
    return HttpSettings(
        max_body_bytes=server.max_body_bytes,
        idle_timeout_s=server.idle_timeout_seconds,
        body_timeout_s=server.body_timeout_seconds,
        send_timeout_s=server.send_timeout_seconds,
        max_connections=server.max_connections,
        large_body_bytes=server.large_body_bytes,
        large_body_share=server.large_body_loop_share,
    )


async def _serve(plan: _Plan) -> None:
    cluster = plan.cluster
    if cluster is None:
        kubeconfig, context = plan.kube
        try:
            cluster = await connect(
                kubeconfig=kubeconfig,
                context=context,
                request_timeout_s=plan.config.api.request_timeout_seconds,
            )
        except ClusterError as exc:
            where = kubeconfig or "the default kubeconfig or in-cluster credentials"
            raise _Fatal(f"cannot reach the cluster through {where}: {exc}") from exc
    leadership: Leadership = AlwaysLeader()
    if plan.cluster is None and plan.config.leader_election.enabled:
        identity = f"{socket.gethostname()}_{os.getpid()}"
        leadership = leader_elector(cluster, plan.config.leader_election, identity=identity)
    service = ExtenderService(
        cluster=cluster,
        config=plan.config,
        leadership=leadership,
        config_source=plan.config_path,
    )
    settings = http_settings(plan.config)
    metrics_port = plan.config.server.metrics_port
    app = make_app(service, settings, observability=metrics_port is None)
    if not isinstance(leadership, AlwaysLeader):
        elector = leadership
        app.cleanup_ctx.append(lambda _app: _campaign(elector))
    if plan.tls is not None:
        tls = plan.tls
        app.cleanup_ctx.append(lambda _app: tls.running())
    if plan.config_path is not None:
        path = plan.config_path
        app.cleanup_ctx.append(lambda a: _watch_config(a, path))
    app.cleanup_ctx.append(_freeze_heap)
    ssl_context = plan.tls.context if plan.tls is not None else None
    try:
        async with contextlib.AsyncExitStack() as stack:
            verbs = serving(
                app,
                settings,
                host=plan.host,
                port=plan.port,
                ssl_context=ssl_context,
                shutdown_timeout_s=SHUTDOWN_GRACE_S,
            )
            try:
                site = await stack.enter_async_context(verbs)
            except OSError as exc:
                raise _cannot_listen("the verbs' listener", plan.host, plan.port, exc) from exc
            scheme = "https" if ssl_context else "http"
            log.info(
                "serving on %s://%s:%d (%s; at most %d connections; decision core: %s build)",
                scheme,
                plan.host,
                plan.port,
                cluster.description,
                site.guard.cap,
                build(),
            )
            if metrics_port is not None:
                metrics_host = plan.config.server.metrics_host
                observability = serving(
                    make_observability_app(app),
                    settings,
                    host=metrics_host,
                    port=metrics_port,
                    shutdown_timeout_s=SHUTDOWN_GRACE_S,
                )
                try:
                    await stack.enter_async_context(observability)
                except OSError as exc:
                    which = "the metrics and status listener, server.metricsPort"
                    raise _cannot_listen(which, metrics_host, metrics_port, exc) from exc
                log.info("metrics and status on http://%s:%d", metrics_host, metrics_port)
            await stop_signal().wait()
    finally:
        await cluster.close()


async def _campaign(leadership: Leadership) -> AsyncIterator[None]:
    """Serve only while this replica holds the leader Lease (docs/design.md, Architecture); hand it
    over on exit. An embedded cluster has one replica by construction and runs no election."""
    task = asyncio.get_running_loop().create_task(leadership.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await leadership.release()


async def _freeze_heap(app: web.Application) -> AsyncIterator[None]:
    """Once the ledger is built, move every object alive then out of the garbage collector's
    reach (gc.freeze): with 60,000 pods the ledger is millions of objects, and a full
    collection walking them stalls the event loop for a few hundred milliseconds, in the
    middle of some filter call. The ledger holds no reference cycles that need collecting."""
    service = app[SERVICE]

    async def freeze() -> None:
        await service.wait_ready()
        gc.collect()
        gc.freeze()
        # A request allocates a few thousand short-lived containers (the decoded Pod and node
        # lists) that reference counting frees; at the default threshold (700) the young
        # collection still runs several times per request and walks them all. A high threshold
        # lets them die first: at thousands of nodes, several young collections per filter
        # call become one every few dozen calls.
        gc.set_threshold(GC_YOUNG_THRESHOLD, 50, 100)

    task = asyncio.get_running_loop().create_task(freeze())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _watch_config(app: web.Application, path: str) -> AsyncIterator[None]:
    service = app[SERVICE]

    def stamp() -> tuple[int, int] | None:
        try:
            st = Path(path).stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    async def poll() -> None:
        seen = await asyncio.to_thread(stamp)
        while True:
            await asyncio.sleep(CONFIG_POLL_S)
            now = await asyncio.to_thread(stamp)
            if now == seen:
                continue
            seen = now
            await reload_config(service, path)

    task = asyncio.get_running_loop().create_task(poll())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def reload_config(service: ExtenderService, path: str) -> None:
    """Read `path` and put it in force. Never raises: a document that fails, whatever the
    failure, is logged and reported (`config.error` in /status, `mpsched_config_valid 0`), the
    last good one stays, and the watch goes on to apply a later valid file."""
    try:
        config = await asyncio.to_thread(load_config, path)
    except ConfigError as exc:
        service.config_rejected(exc.problems)
        log.error("configuration %s rejected, keeping the last good one: %s", path, exc)
        return
    except Exception as exc:  # a bug or a resource limit: still one report, not a dead task
        problem = f"cannot load: {type(exc).__name__}: {str(exc)[:200]}"
        service.config_rejected([problem])
        log.exception("configuration %s rejected, keeping the last good one: %s", path, problem)
        return
    try:
        done = await service.reconfigure(config)
        logs.configure(config.logging)
    except Exception as exc:
        problem = f"cannot apply: {type(exc).__name__}: {str(exc)[:200]}"
        service.config_rejected([problem])
        log.exception("configuration %s not applied, keeping the last good one", path)
        return
    if done.needs_restart:
        log.warning(
            "configuration %s reloaded; %s changed and take effect only after a restart",
            path,
            ", ".join(done.needs_restart),
        )
    else:
        log.info("configuration %s reloaded", path)
