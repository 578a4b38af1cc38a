"""The two servers the bench runs in processes of their own beside serve, each started by
re-launching the entry script: the floor (`--floor-server PORT`, and `--floor-api URL` where it
binds through an API server), the least an extender can do over HTTP; and the Kubernetes API
server (`--api-server PORT --api-dump FILE`), the project's fake holding the cluster dump. Both
run on the event loop `mpsched serve --loop auto` picks."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

Json = dict[str, Any]


#: The entry script, scripts/bench_extender.py beside this package: the bench re-launches it
#: by its path to run the floor and the API servers.
ENTRY_SCRIPT = str(Path(__file__).parents[1] / "bench_extender.py")


def _lower_keys(doc: Any) -> dict[str, Any]:
    return {k.lower(): v for k, v in doc.items()} if isinstance(doc, dict) else {}


#: Seconds the floor's Binding POST may take (every network call has a timeout).
FLOOR_BIND_TIMEOUT_S = 10.0


def binding_body(name: str, namespace: str, uid: str, node: str) -> bytes:
    """The Binding an extender that binds must POST (what kube-scheduler's binder would)."""
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


def floor_app(api_url: str | None = None, token: str = "") -> web.Application:
    """The least an extender can do over HTTP: parse the request, accept every candidate, and
    for bind create the Binding at the API server at `api_url` with the bearer `token`
    (kube-scheduler leaves that to a binding extender); with no API server, bind only answers."""
    api = web.AppKey("api", aiohttp.ClientSession)

    async def client(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=FLOOR_BIND_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            app[api] = session
            yield

    async def filter_(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        body: Json = {
            "NodeNames": args.get("nodenames") or [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def prioritize(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        body = [{"Host": n, "Score": 0} for n in args.get("nodenames") or []]
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def bind(request: web.Request) -> web.Response:
        args = _lower_keys(orjson.loads(await request.read()))
        error = ""
        if api_url is not None:
            name, namespace = str(args.get("podname")), str(args.get("podnamespace"))
            body = binding_body(name, namespace, str(args.get("poduid")), str(args.get("node")))
            url = f"{api_url}/api/v1/namespaces/{namespace}/pods/{name}/binding"
            try:
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
                async with request.app[api].post(url, data=body, headers=headers) as resp:
                    answer = await resp.read()
                    if resp.status != 201:
                        error = f"binding answered {resp.status}: {answer[:200]!r}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"binding failed: {exc!r}"
        return web.Response(body=orjson.dumps({"Error": error}), content_type="application/json")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    # The same body limit as serve's default (8 MiB); aiohttp's own default is 1 MiB.
    app = web.Application(client_max_size=8 << 20)
    if api_url is not None:
        app.cleanup_ctx.append(client)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    app.router.add_post("/bind", bind)
    app.router.add_get("/readyz", readyz)
    return app


async def _forever(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # until the bench terminates this process


def _run(main: Coroutine[Any, Any, None]) -> int:
    """Run a server on the same event loop `mpsched serve --loop auto` picks: uvloop when it
    is installed, asyncio otherwise, so that the comparison is of the servers, not the loops."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
    return 0


def serve_floor(port: int, api_url: str | None) -> int:
    token = fake_apiserver().TOKEN if api_url is not None else ""
    return _run(_forever(floor_app(api_url, token), port))


def fake_apiserver() -> Any:
    """The project's fake API server module (tests/kube/fake_apiserver.py), from the checkout
    this package is in: the bench's API server and its kubeconfig."""
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.append(root)  # after the installed build, which must stay the one imported
    return importlib.import_module("tests.kube.fake_apiserver")


def serve_api(port: int, cluster_file: Path) -> int:
    """A Kubernetes API server in its own process, holding the cluster dump: the project's
    fake (tests/kube/fake_apiserver.py: resourceVersions, paged lists, watches, the Binding
    subresource's answers), as production has the API server outside the extender's process.
    /readyz answers once the dump is loaded."""
    FakeApiServer = fake_apiserver().FakeApiServer  # noqa: N806 (a class)
    items = orjson.loads(cluster_file.read_bytes())["items"]

    async def main() -> None:
        fake = FakeApiServer()
        for item in items:
            fake.put(item)
        app = fake.app()

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/readyz", readyz)
        await _forever(app, port)

    return _run(main())
