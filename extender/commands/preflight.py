"""`mpsched preflight`: check a cluster before and after installing mpsched, through its API
(a kubeconfig, or in-cluster credentials), and print one row per check: ✓, ✗ with what to do,
or – where a check does not apply yet.

The checks themselves are pure (`extender.commands.preflight_checks`, `preflight_versions`,
`preflight_webhook`); the reading is `extender.kube.survey`. This module owns the flags, the one
connection, the checks' order and the output (a table, or `-o json`). Exit status: 0 when
nothing failed, 1 when a check failed or the cluster could not be reached, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from collections.abc import Sequence

from extender.cluster import ClusterError
from extender.commands.common import positive_seconds
from extender.commands.preflight_checks import (
    Check,
    check_agent,
    check_extender,
    check_gpu_nodes,
    check_pod_security,
    check_runtime,
)
from extender.commands.preflight_versions import SUPPORTED_MINORS, check_versions
from extender.commands.preflight_webhook import (
    check_certificates,
    check_webhook,
    check_webhook_endpoints,
)
from extender.kube.survey import Survey

#: Seconds for each call to the API server (a list page has several times as long).
DEFAULT_TIMEOUT_S = 10.0
MARKS = {"ok": "✓", "fail": "✗", "skip": "–"}


def _minor(text: str) -> int:
    """argparse type for --scheduler-version: "1.31" or "31", within the supported range."""
    minor = text.removeprefix("v").removeprefix("1.")
    if not minor.isdigit() or int(minor) not in SUPPORTED_MINORS:
        first, last = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Kubernetes minor from 1.{first} to 1.{last}"
        )
    return int(minor)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig (default: KUBECONFIG, ~/.kube/config, else in-cluster credentials)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    parser.add_argument(
        "--scheduler-version",
        type=_minor,
        metavar="1.N",
        help="before install: the kube-scheduler minor you mean to run in own-scheduler mode "
        "(default: deploy/own-scheduler's); after install the running image is checked",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds for each API call (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output format"
    )


def format_table(checks: Sequence[Check]) -> str:
    """One row per check; a failed one's fix on the line below it."""
    width = max(len(c.name) for c in checks)
    lines = []
    for check in checks:
        lines.append(f"{MARKS[check.status]} {check.name:<{width}}  {check.detail}")
        if check.fix:
            lines.append(f"  {'':<{width}}  → {check.fix}")
    failed = sum(c.status == "fail" for c in checks)
    lines.append(f"{failed} check{'s' * (failed != 1)} failed" if failed else "all checks passed")
    return "\n".join(lines)


def format_json(checks: Sequence[Check]) -> str:
    doc = {
        "ok": not any(c.status == "fail" for c in checks),
        "checks": [
            {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def run_checks(
    survey: Survey, *, now: dt.datetime, planned_scheduler_minor: int | None = None
) -> list[Check]:
    """Every check, in the order the table shows them."""
    return [
        check_versions(survey, planned_scheduler_minor=planned_scheduler_minor),
        check_gpu_nodes(survey),
        check_agent(survey),
        check_runtime(survey),
        check_webhook(survey),
        check_webhook_endpoints(survey),
        check_certificates(survey, now=now),
        check_pod_security(survey),
        check_extender(survey),
    ]


async def preflight(
    *, kubeconfig: str | None, context: str | None, timeout_s: float, scheduler_minor: int | None
) -> list[Check]:
    """Connect, read the cluster once, and run every check. Raises ClusterError when the
    credentials cannot be loaded."""
    # Imported here: `mpsched --help` and the other commands never load the Kubernetes client.
    from extender.kube.survey import read_cluster

    found = await read_cluster(kubeconfig=kubeconfig, context=context, request_timeout_s=timeout_s)
    now = dt.datetime.now(dt.UTC)
    return run_checks(found, now=now, planned_scheduler_minor=scheduler_minor)


def run(args: argparse.Namespace) -> int:
    try:
        checks = asyncio.run(
            preflight(
                kubeconfig=args.kubeconfig,
                context=args.context,
                timeout_s=args.timeout,
                scheduler_minor=args.scheduler_version,
            )
        )
    except ClusterError as exc:
        print(f"mpsched preflight: {exc}", file=sys.stderr)
        return 1
    print(format_json(checks) if args.output == "json" else format_table(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0
