"""An unreachable API server, as `mpsched serve` meets it: one log line per failed attempt (JSON
when the configuration says so: every line parses, none is a traceback), retried with backoff,
and the failures counted on /metrics (no answer, watch restarts, not ready, not leader)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.kube.fake_apiserver import kubeconfig
from tests.observability.served import free_port, samples, scrape, serve, value, wait_for

RUN_S = 3.5


async def test_one_json_line_per_failure_and_the_failures_counted(tmp_path: Path) -> None:
    dead = kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    config = tmp_path / "config.yaml"
    config.write_text("logging: {level: info, format: json}\n")
    async with serve("--kubeconfig", dead, "--config", str(config)) as proc:
        await wait_for(f"{proc.metrics}/healthz")
        await wait_for(f"{proc.metrics}/readyz", status=503)
        await asyncio.sleep(RUN_S)
        found = samples(await scrape(proc.metrics))
    assert proc.proc.stderr is not None
    err = (await proc.proc.stderr.read()).decode()
    assert proc.proc.returncode == 0, err[-2000:]
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    assert "Traceback" not in err
    listing = [r for r in lines if r["logger"] == "extender.kube.watch"]
    # Backoff 1 s, 2 s, ...: three or four attempts in RUN_S, not one per event-loop turn.
    assert 2 <= len(listing) <= 5, listing
    assert all(r["level"] == "warning" and "retrying in" in r["message"] for r in listing)
    assert all("error" not in r for r in lines)
    assert value(found, "mpsched_ready") == 0
    assert value(found, "mpsched_leader") == 0
    assert value(found, "mpsched_watch_restarts_total") >= len(listing) - 1
    refused = value(found, "mpsched_api_requests_total", verb="list", resource="nodes", code="none")
    assert refused >= 2
