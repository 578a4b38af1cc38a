"""`kubectl mpsched`: the kubectl plugin (the `kubectl-mpsched` console script; also `mpsched
kubectl`). It finds the extender through the API server, as `mpsched status --kubeconfig` does
(the Service's `metrics` port through the service proxy, with the kubeconfig's credentials), or
at `--url` directly:

- `kubectl mpsched status`: the allocation table (or `-o json`, the `/status` document);
- `kubectl mpsched why POD [-n NS]`: the reason per node that the extender's latest filter call
  for the pod gave (`/status/why`), for a pod that is pending;
- `kubectl mpsched top [-n NS | -A]`: per pod and GPU, what its MPS clients use against its
  share. The share comes from the extender (`/status`); the use from the node agents, which
  publish it on their `/metrics` (`mpsched_agent_pod_*`), read through the API server's pod
  proxy. The agents measure memory and clients per pod; SM (threads) use per pod is not
  measurable under MPS, so the threads column is the share alone.

Owns the flags and the output; every failure is one line on stderr (exit 1), bad usage exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import orjson

from extender.cluster import ClusterError
from extender.commands.common import positive_seconds
from extender.commands.kubectl_tables import (
    AgentMetricsError,
    Usage,
    format_top,
    format_why,
    parse_agent_metrics,
)
from extender.commands.status import (
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    DEFAULT_TIMEOUT_S,
    SERVICE_PORT,
    count,
    decode_status,
    http_url,
)
from extender.commands.status_table import DEFAULT_MAX_PODS_PER_GPU, format_status

PROG: Final = "kubectl mpsched"
#: Where deploy/ runs the node agents, and how their pods are labelled.
AGENT_NAMESPACE: Final = "mpsched-node"
AGENT_SELECTOR: Final = "app.kubernetes.io/name=mpsched-agent"
#: The agents' metrics port (agent.metricsPort); the pod proxy takes a number.
AGENT_PORT: Final = "9465"


class PluginError(Exception):
    """Something the plugin could not get or make sense of: one line, exit 1."""


class UsageError(Exception):
    """Bad usage: exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _reach(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The flags that find the extender. Given before or after the verb, as kubectl's own
    flags may be: the verb's copies leave the value alone unless given there."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    reach = parser.add_argument_group("finding the extender")
    reach.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=default(None),
        help="kubeconfig (default: KUBECONFIG, ~/.kube/config)",
    )
    reach.add_argument(
        "--context", metavar="NAME", default=default(None), help="kubeconfig context to use"
    )
    reach.add_argument(
        "--extender-namespace",
        default=default(DEFAULT_NAMESPACE),
        metavar="NS",
        help=f"namespace of the extender's Service (default {DEFAULT_NAMESPACE})",
    )
    reach.add_argument(
        "--extender-service",
        default=default(DEFAULT_SERVICE),
        metavar="NAME",
        help=f"the extender's Service (default {DEFAULT_SERVICE})",
    )
    reach.add_argument(
        "--url",
        type=http_url,
        default=default(None),
        help="the extender's /status listener directly, not through the API server",
    )
    reach.add_argument(
        "--timeout",
        type=positive_seconds,
        default=default(DEFAULT_TIMEOUT_S),
        metavar="S",
        help=f"seconds for the whole command (default {DEFAULT_TIMEOUT_S:g})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _reach(parser, defaults=True)
    verbs = parser.add_subparsers(dest="verb", required=True)
    status = verbs.add_parser("status", help="the allocation table of the extender")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.add_argument(
        "--max-pods",
        type=count,
        default=DEFAULT_MAX_PODS_PER_GPU,
        help=f"pods named per GPU row before '+N more' (default {DEFAULT_MAX_PODS_PER_GPU})",
    )
    why = verbs.add_parser("why", help="why a pending pod is pending: filter's reason per node")
    why.add_argument("pod", metavar="POD", help="the pod's name")
    why.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's)")
    top = verbs.add_parser("top", help="per pod: use against share, from the node agents")
    top.add_argument("-n", "--namespace", help="pods of this namespace (default: the context's)")
    top.add_argument("-A", "--all-namespaces", action="store_true", help="pods of every namespace")
    top.add_argument("--agent-namespace", default=AGENT_NAMESPACE, metavar="NS")
    top.add_argument("--agent-selector", default=AGENT_SELECTOR, metavar="LABELS")
    top.add_argument("--agent-port", default=AGENT_PORT, metavar="PORT")
    for verb in (status, why, top):
        _reach(verb, defaults=False)
    parser.set_defaults(_kubectl_usage=parser.error)


# -- reaching the extender and the agents --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    body: bytes
    where: str


Get = Callable[[str], Awaitable[Answer]]


def _json(answer: Answer) -> Any:
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError as exc:
        raise PluginError(f"{answer.where} did not answer with JSON: {exc}") from None


def _refusal(answer: Answer) -> PluginError:
    try:
        doc = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        doc = None
    text = doc.get("Error") if isinstance(doc, dict) else None
    text = text or answer.body[:200].decode("utf-8", "replace").strip()
    return PluginError(f"{answer.where} answered HTTP {answer.code}: {text}")


async def _direct(http: aiohttp.ClientSession, base: str, path: str) -> Answer:
    url = base.rstrip("/") + "/" + path
    try:
        async with http.get(url) as resp:
            return Answer(resp.status, await resp.read(), url)
    except aiohttp.ClientError as exc:
        raise PluginError(f"cannot reach {url}: {exc}") from None


@dataclass(slots=True)
class Session:
    """The open ways: to the extender (`extender`), and the API (`api`, None with --url)."""

    extender: Get
    api: Any
    namespace: str


async def _run_verb(args: argparse.Namespace, verb: Callable[[Session], Awaitable[str]]) -> str:
    if args.url is not None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=args.timeout)) as http:
            session = Session(
                lambda path: _direct(http, args.url, path),
                None,
                getattr(args, "namespace", None) or "default",
            )
            return await verb(session)
    # Imported here: `--url` never loads the Kubernetes client.
    from extender.kube.plugin import connected, context_namespace

    namespace = getattr(args, "namespace", None) or await asyncio.to_thread(
        context_namespace, args.kubeconfig, args.context
    )
    async with connected(
        kubeconfig=args.kubeconfig, context=args.context, timeout_s=args.timeout
    ) as api:

        async def extender(path: str) -> Answer:
            got = await api.service_get(
                args.extender_namespace, args.extender_service, SERVICE_PORT, path
            )
            return Answer(got.code, got.body, got.where)

        return await verb(Session(extender, api, namespace or "default"))


# -- status ------------------------------------------------------------------------------------


async def _status_doc(session: Session) -> dict[str, Any]:
    answer = await session.extender("status")
    if answer.code != 200:
        raise _refusal(answer)
    return decode_status(answer.body, answer.where)


def _status(args: argparse.Namespace) -> Callable[[Session], Awaitable[str]]:
    async def verb(session: Session) -> str:
        doc = await _status_doc(session)
        if args.output == "json":
            return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
        return format_status(doc, max_pods_per_gpu=args.max_pods)

    return verb


# -- why ---------------------------------------------------------------------------------------


def _why(args: argparse.Namespace) -> Callable[[Session], Awaitable[str]]:
    async def verb(session: Session) -> str:
        namespace, name = session.namespace, args.pod
        pod = None
        if session.api is not None:
            pod = await session.api.get_pod(namespace, name)
            if pod is None:
                raise PluginError(f'pod "{name}" not found in namespace "{namespace}"')
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                return f"{namespace}/{name} is not pending: it is bound to node {node}\n"
        answer = await session.extender(f"status/why/{quote(namespace)}/{quote(name)}")
        if answer.code != 200:
            raise _refusal(answer)
        doc = _json(answer)
        if not isinstance(doc, dict):
            raise PluginError(f"{answer.where} answered with a JSON {type(doc).__name__}")
        return format_why(doc, pod=pod)

    return verb


# -- top ---------------------------------------------------------------------------------------


async def agent_usage(session: Session, args: argparse.Namespace) -> dict[Any, Usage]:
    """Every running agent's published per-pod usage, read through the pod proxy."""
    api = session.api
    if api is None:
        return {}
    pods = await api.list_pods(args.agent_namespace, args.agent_selector)
    names = [
        p["metadata"]["name"]
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and "metadata" in p
    ]

    async def one(name: str) -> dict[Any, Usage]:
        got = await api.pod_get(args.agent_namespace, name, args.agent_port, "metrics")
        if got.code != 200:
            raise PluginError(f"{got.where} answered HTTP {got.code}")
        try:
            return parse_agent_metrics(got.body.decode("utf-8", "replace"))
        except AgentMetricsError as exc:
            raise PluginError(f"{got.where}: {exc}") from None

    return {k: v for found in await asyncio.gather(*map(one, names)) for k, v in found.items()}


def _top(args: argparse.Namespace) -> Callable[[Session], Awaitable[str]]:
    async def verb(session: Session) -> str:
        status, usage = await asyncio.gather(_status_doc(session), agent_usage(session, args))
        namespace = None if args.all_namespaces else session.namespace
        return format_top(status, usage, namespace=namespace)

    return verb


# -- entry points ------------------------------------------------------------------------------

VERBS: Final = {"status": _status, "why": _why, "top": _top}


def run(args: argparse.Namespace) -> int:
    verb = VERBS[args.verb](args)
    try:
        out = asyncio.run(asyncio.wait_for(_run_verb(args, verb), args.timeout + 1))
    except (PluginError, ClusterError) as exc:
        print(f"{PROG} {args.verb}: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"{PROG} {args.verb}: no answer within {args.timeout:g} s", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The `kubectl-mpsched` console script."""
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except UsageError as exc:
        print(f"{PROG}: usage error: {exc} (see '{PROG} --help')", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
