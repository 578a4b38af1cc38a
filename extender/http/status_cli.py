"""`mpsched status`: fetch a running extender's `GET /status` and print the allocation table.

The rendering lives in `extender.http.status_table` (shared with `mpsched demo`); this module
only does the HTTP round trip and turns every way it can fail into one readable line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import aiohttp
import orjson

from extender.http.status_table import DEFAULT_MAX_PODS_PER_GPU, format_status

DEFAULT_URL = "http://127.0.0.1:8888"


class StatusError(Exception):
    """The extender could not be reached or did not answer with a status document."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"base URL of the extender (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the raw /status document instead of a table"
    )
    parser.add_argument(
        "--max-pods",
        type=int,
        default=DEFAULT_MAX_PODS_PER_GPU,
        help=f"pods named per GPU row before '+N more' (default {DEFAULT_MAX_PODS_PER_GPU})",
    )


def status_url(base: str) -> str:
    """The status endpoint under `base`; a URL that already ends in /status is used as is."""
    base = base.rstrip("/")
    return base if base.endswith("/status") else base + "/status"


async def fetch_status(url: str, timeout_s: float) -> dict[str, Any]:
    """GET `url` and return the decoded document; any failure becomes a StatusError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url) as resp,
        ):
            body = await resp.read()
            if resp.status != 200:
                text = body[:200].decode("utf-8", "replace").strip()
                raise StatusError(f"{url} answered HTTP {resp.status}: {text or resp.reason}")
    except TimeoutError:
        raise StatusError(f"{url} did not answer within {timeout_s:g}s") from None
    except aiohttp.InvalidURL:
        raise StatusError(f"{url} is not a valid URL") from None
    except aiohttp.ClientError as exc:
        raise StatusError(f"cannot reach {url}: {exc}") from None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise StatusError(f"{url} did not answer with JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StatusError(f"{url} answered with a JSON {type(doc).__name__}, not an object")
    return doc


def run(args: argparse.Namespace) -> int:
    url = status_url(args.url)
    try:
        doc = asyncio.run(fetch_status(url, args.timeout))
    except StatusError as exc:
        print(f"mpsched status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_status(doc, max_pods_per_gpu=args.max_pods))
    return 0
