"""The agent's HTTP listener on its node: GET /metrics (Prometheus text, computed at scrape
time from the agent's latest snapshot), /healthz (the process answers), /readyz (the node's
facts were published at least once) and /status (JSON: the MPS clients outside their share
found by the last check, and the device plugin's registration)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from extender.agent.metrics import CONTENT_TYPE
from extender.agent.node import NodeAgent

AGENT: Final = web.AppKey("agent", NodeAgent)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[AGENT].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    if agent.published.is_set():
        return web.json_response({"ready": True, "node": agent.node_name})
    return web.json_response({"ready": False, "reason": "not published yet"}, status=503)


async def status(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    plugin = agent.plugin
    body: dict[str, object] = {"node": agent.node_name, "clients": agent.checks.status()}
    if plugin is not None:
        body["devicePlugin"] = {
            "registered": plugin.registered.is_set(),
            "registrations": plugin.registrations,
            "slots": len(plugin.slots),
            "healthySlots": sum(1 for s in plugin.slots if s.healthy),
            "allocations": plugin.allocations,
        }
    return web.json_response(body)


def make_app(agent: NodeAgent) -> web.Application:
    app = web.Application()
    app[AGENT] = agent
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status)
    return app
