"""`mpsched webhook`: serve the admission webhook (DESIGN §2).

Owns the command line and process wiring: configuration, TLS from `--tls-cert`/`--tls-key`
with certificate reload (without both it serves plain HTTP, for local testing, and warns once),
the event loop, and a prompt exit on SIGTERM. The configuration is read once at start: a
changed ConfigMap takes effect when the Deployment rolls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Final

from aiohttp import web

from extender.config import Config, ConfigError, load_config
from extender.http import logs
from extender.http.tls import CertificateReloader
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app

log = logging.getLogger("mpsched.webhook")

DEFAULT_HOST: Final = "0.0.0.0"
#: 8443: the port DESIGN §2 fixes for `webhook`.
DEFAULT_PORT: Final = 8443
#: Seconds in-flight reviews get on SIGTERM: a review takes milliseconds, and the API server
#: retries elsewhere once this replica's endpoint is gone.
SHUTDOWN_GRACE_S: Final = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (8443)")
    parser.add_argument("--config", metavar="FILE", help="mpsched configuration (YAML)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    logs.add_level_argument(parser)


def _say(message: str) -> None:
    print(f"mpsched: webhook: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        print("mpsched: usage error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"mpsched: usage error: --port {args.port} is not a TCP port", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config) if args.config else Config.default()
    except ConfigError as exc:
        _say(f"invalid configuration {args.config}: " + "; ".join(exc.problems))
        return 1
    logs.configure(config.logging, level=args.log_level)
    tls = None
    if args.tls_cert is not None:
        try:
            tls = CertificateReloader(args.tls_cert, args.tls_key)
        except (OSError, ValueError) as exc:
            _say(f"cannot load the TLS certificate: {exc}")
            return 1
    else:
        log.warning(
            "no --tls-cert/--tls-key: serving plain HTTP, for local testing only "
            "(kube-apiserver calls webhooks over HTTPS)"
        )
    try:
        asyncio.run(_serve(AdmissionSettings.from_config(config), args.host, args.port, tls))
    except OSError as exc:
        _say(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    return 0


async def _serve(
    settings: AdmissionSettings, host: str, port: int, tls: CertificateReloader | None
) -> None:
    app = make_app(settings)
    if tls is not None:
        reloader = tls
        app.cleanup_ctx.append(lambda _app: reloader.running())
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls.context if tls else None)
        await site.start()
        log.info("webhook serving on %s://%s:%d", "https" if tls else "http", host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
