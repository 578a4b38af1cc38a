"""`mpsched webhook`: serve the admission webhook, and its /metrics on a plain-HTTP port.

Owns the command line and process wiring: configuration, TLS from `--tls-cert`/`--tls-key`
with certificate reload (without both it serves plain HTTP, for local testing, and warns once),
the event loop, and a prompt exit on SIGTERM. The configuration is read once at start: a
changed ConfigMap takes effect when the Deployment rolls.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Final

from aiohttp import web

from extender import logs
from extender.commands.common import configured, stop_signal
from extender.tls import CertificateReloader
from extender.webhook.admission import AdmissionSettings
from extender.webhook.app import make_app, make_metrics_app
from extender.webhook.metrics import WebhookMetrics

log = logging.getLogger("mpsched.webhook")

DEFAULT_HOST: Final = "0.0.0.0"
#: 8443: the webhook's fixed port.
DEFAULT_PORT: Final = 8443
#: Plain-HTTP /metrics for Prometheus (the extender's is 9464, the agent's 9465).
DEFAULT_METRICS_PORT: Final = 9466
#: Seconds in-flight reviews get on SIGTERM: a review takes milliseconds, and the API server
#: retries elsewhere once this replica's endpoint is gone.
SHUTDOWN_GRACE_S: Final = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (8443)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help="plain-HTTP port of /metrics, on the same address (9466; 0: none)",
    )
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
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if not 0 <= port <= 65535:
            print(f"mpsched: usage error: {flag} {port} is not a TCP port", file=sys.stderr)
            return 2
    if args.metrics_port != 0 and args.metrics_port == args.port:
        print("mpsched: usage error: --metrics-port must differ from --port", file=sys.stderr)
        return 2
    config = configured(args.config, log_level=args.log_level, say=_say)
    if config is None:
        return 1
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
    metrics = WebhookMetrics(cert_file=args.tls_cert)
    listeners = _Listeners(args.host, args.port, args.metrics_port)
    try:
        asyncio.run(_serve(AdmissionSettings.from_config(config), listeners, tls, metrics))
    except OSError as exc:
        _say(f"cannot listen on {args.host}:{listeners.opening}: {exc.strerror or exc}")
        return 1
    return 0


class _Listeners:
    """The two ports, and which one is being opened (for the error naming the one that failed)."""

    def __init__(self, host: str, port: int, metrics_port: int) -> None:
        self.host, self.port, self.metrics_port = host, port, metrics_port
        self.opening = port


async def _serve(
    settings: AdmissionSettings,
    listeners: _Listeners,
    tls: CertificateReloader | None,
    metrics: WebhookMetrics,
) -> None:
    host, port = listeners.host, listeners.port
    app = make_app(settings, metrics=metrics)
    if tls is not None:
        reloader = tls
        app.cleanup_ctx.append(lambda _app: reloader.running())
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    metrics_runner = web.AppRunner(make_metrics_app(metrics), access_log=None, handle_signals=False)
    await metrics_runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls.context if tls else None)
        await site.start()
        log.info("webhook serving on %s://%s:%d", "https" if tls else "http", host, port)
        if listeners.metrics_port:
            listeners.opening = listeners.metrics_port
            await web.TCPSite(metrics_runner, host, listeners.metrics_port).start()
            log.info("webhook metrics on http://%s:%d/metrics", host, listeners.metrics_port)
        await stop_signal().wait()
    finally:
        await metrics_runner.cleanup()
        await runner.cleanup()
