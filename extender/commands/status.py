"""`mpsched status`: fetch a running extender's `GET /status` and print the allocation table.

Two ways to the extender: `--url` (its observability listener, directly; `--cacert` to trust an
https one's certificate), or the Kubernetes API (`--kubeconfig`/`--context`, or `--namespace`/
`--service`): the Service's `metrics` port through the API server's service proxy, with the
kubeconfig's credentials (`extender.kube.proxy`), so it works from a laptop with no route to the
pods. The rendering lives in `extender.commands.status_table` (shared with `mpsched demo`); this
module owns the flags and the round trip, and turns every way it can fail into one readable line
on stderr: exit status 2 for bad usage, 1 when the extender cannot be reached or does not answer
with a status document.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from extender.cluster import ClusterError
from extender.commands.common import number, positive_seconds
from extender.commands.status_table import DEFAULT_MAX_PODS_PER_GPU, format_status

#: The observability listener's default address (server.metricsHost, server.metricsPort).
DEFAULT_URL = "http://127.0.0.1:9464"
#: Where deploy/ puts the extender's Service.
DEFAULT_NAMESPACE = "mpsched-system"
DEFAULT_SERVICE = "mpsched"
#: The Service port that carries /metrics and /status (deploy/: `name: metrics`).
SERVICE_PORT = "metrics"
DEFAULT_TIMEOUT_S = 10.0


class StatusError(Exception):
    """The extender could not be reached or did not answer with a status document."""


@dataclass(frozen=True, slots=True)
class ThroughApi:
    """Reach the extender through the API server's service proxy."""

    kubeconfig: str | None
    context: str | None
    namespace: str
    service: str


@dataclass(frozen=True, slots=True)
class Direct:
    """Reach the extender's listener at `url` (its /status endpoint)."""

    url: str
    ssl: ssl.SSLContext | None = None


def http_url(text: str) -> str:
    """argparse type for `--url`: an absolute http(s) URL with a host."""
    try:
        url = URL(text)
    except (ValueError, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL})"
        )
    return text


def count(text: str) -> int:
    return number(text, int, lambda v: v >= 0, " is not a whole number >= 0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    direct = parser.add_argument_group("directly, to the extender's listener")
    direct.add_argument(
        "--url",
        type=http_url,
        default=None,
        help=f"base URL of the extender's /status listener (default {DEFAULT_URL})",
    )
    direct.add_argument(
        "--cacert",
        metavar="FILE",
        help="CA certificate(s), PEM, to verify an https --url (default: the system's)",
    )
    api = parser.add_argument_group(
        "through the Kubernetes API server (the Service's port 'metrics', service proxy)"
    )
    api.add_argument(
        "--kubeconfig", metavar="PATH", help="kubeconfig (default: KUBECONFIG, ~/.kube/config)"
    )
    api.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    api.add_argument(
        "--namespace",
        default=None,
        help=f"namespace of the extender's Service (default {DEFAULT_NAMESPACE})",
    )
    api.add_argument(
        "--service", default=None, help=f"the extender's Service (default {DEFAULT_SERVICE})"
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds for the whole exchange (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="the allocation table (default), or the raw /status document",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="same as -o json"
    )
    parser.add_argument(
        "--max-pods",
        type=count,
        default=DEFAULT_MAX_PODS_PER_GPU,
        help=f"pods named per GPU row before '+N more' (default {DEFAULT_MAX_PODS_PER_GPU})",
    )
    parser.set_defaults(_status_usage=parser.error)


def status_url(base: str) -> str:
    """The status endpoint under `base`; a URL that already ends in /status is used as is."""
    base = base.rstrip("/")
    return base if base.endswith("/status") else base + "/status"


def route(args: argparse.Namespace) -> Direct | ThroughApi:
    """Which way to the extender the flags ask for. Raises ValueError (bad usage) for flags of
    both ways, or --cacert where it cannot apply; OSError (ssl.SSLError among them) for an
    unreadable --kubeconfig or --cacert (read here, before the event loop starts: blocking file
    reads)."""
    api_flags = [
        flag
        for flag, value in (
            ("--kubeconfig", args.kubeconfig),
            ("--context", args.context),
            ("--namespace", args.namespace),
            ("--service", args.service),
        )
        if value is not None
    ]
    if api_flags:
        if args.url is not None:
            raise ValueError(f"--url or {'/'.join(api_flags)}, not both")
        if args.cacert is not None:
            raise ValueError(
                "--cacert is for an https --url; through the API server the kubeconfig's "
                "certificate authority is used"
            )
        if args.kubeconfig is not None:
            # Opened here to say plainly what is wrong with it: the client's own report of a
            # missing file is a complaint about a missing key.
            with open(args.kubeconfig, "rb"):
                pass
        return ThroughApi(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace or DEFAULT_NAMESPACE,
            service=args.service or DEFAULT_SERVICE,
        )
    url = status_url(args.url or DEFAULT_URL)
    if args.cacert is None:
        return Direct(url)
    if URL(url).scheme != "https":
        raise ValueError(f"--cacert needs an https:// --url, not {url}")
    return Direct(url, ssl.create_default_context(cafile=args.cacert))


def decode_status(body: bytes, where: str) -> dict[str, Any]:
    """The status document in `body`; anything else is a StatusError."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise StatusError(f"{where} did not answer with JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StatusError(f"{where} answered with a JSON {type(doc).__name__}, not an object")
    return doc


def _refusal(where: str, code: int, body: bytes, reason: str = "") -> StatusError:
    text = body[:200].decode("utf-8", "replace").strip()
    return StatusError(f"{where} answered HTTP {code}: {text or reason}")


async def fetch_status(
    url: str, timeout_s: float, *, ssl_context: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """GET `url` and return the decoded document; any failure becomes a StatusError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, ssl=ssl_context if ssl_context is not None else True) as resp,
        ):
            body = await resp.read()
            if resp.status != 200:
                raise _refusal(url, resp.status, body, resp.reason or "")
    except TimeoutError:
        raise StatusError(f"{url} did not answer within {timeout_s:g}s") from None
    except aiohttp.InvalidURL:
        raise StatusError(f"{url} is not a valid URL") from None
    except aiohttp.ClientError as exc:
        raise StatusError(f"cannot reach {url}: {exc}") from None
    return decode_status(body, url)


async def fetch_status_through_api(way: ThroughApi, timeout_s: float) -> dict[str, Any]:
    """The document from the Service's `metrics` port through the API server's service proxy;
    any failure (credentials, the API server's refusal, no answer in time) is a StatusError."""
    # Imported here, not at the top: `status --url` never loads the Kubernetes client.
    from extender.kube.proxy import get_through_service_proxy

    try:
        answer = await get_through_service_proxy(
            kubeconfig=way.kubeconfig,
            context=way.context,
            namespace=way.namespace,
            service=way.service,
            port=SERVICE_PORT,
            path="status",
            timeout_s=timeout_s,
        )
    except ClusterError as exc:
        raise StatusError(str(exc)) from None
    if answer.code != 200:
        raise _refusal(answer.where, answer.code, answer.body)
    return decode_status(answer.body, answer.where)


def run(args: argparse.Namespace) -> int:
    try:
        way = route(args)
    except ValueError as exc:
        args._status_usage(str(exc))  # raises the dispatcher's usage error (exit status 2)
        return 2
    except OSError as exc:  # ssl.SSLError included
        flag = "--kubeconfig" if args.kubeconfig is not None else "--cacert"
        name = args.kubeconfig if args.kubeconfig is not None else args.cacert
        print(f"mpsched status: cannot use {flag} {name}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        if isinstance(way, Direct):
            doc = asyncio.run(fetch_status(way.url, args.timeout, ssl_context=way.ssl))
        else:
            doc = asyncio.run(fetch_status_through_api(way, args.timeout))
    except StatusError as exc:
        print(f"mpsched status: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_status(doc, max_pods_per_gpu=args.max_pods))
    return 0
