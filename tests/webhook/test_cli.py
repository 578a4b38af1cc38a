"""`mpsched webhook`: bad usage exits 2 and a bad configuration or certificate 1, each with one
readable stderr line; run as a process it serves reviews over plain HTTP (saying so in one
warning line) and exits promptly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from extender.cli import main
from extender_bench.processes import free_ports
from tests.webhook.reviews import container, pod_object, review


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["webhook", "--tls-cert", "/c.pem"], 2, "--tls-cert and --tls-key go together"),
        (["webhook", "--port", "99999"], 2, "--port 99999 is not a TCP port"),
        (["webhook", "--port", "x"], 2, "invalid int value"),
        (["webhook", "--metrics-port", "-1"], 2, "--metrics-port -1 is not a TCP port"),
        (["webhook", "--metrics-port", "8443"], 2, "--metrics-port must differ from --port"),
        (["webhook", "--bogus"], 2, "unrecognized arguments"),
        (["webhook", "--config", "/nonexistent.yaml"], 1, "cannot read /nonexistent.yaml"),
        (["webhook", "--tls-cert", "/no.crt", "--tls-key", "/no.key"], 1, "TLS certificate"),
    ],
)
def test_usage_and_failures_are_one_line(
    argv: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_invalid_configuration_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("webhook: {pipeDirectory: relative, serviceAccount: ''}\n")
    assert main(["webhook", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "webhook.pipeDirectory" in err and "webhook.serviceAccount" in err
    assert err.count("\n") == 1


def test_serves_as_a_process_and_exits_on_sigterm() -> None:
    port, metrics_port = free_ports(2)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "extender", "webhook", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the webhook did not start"
            time.sleep(0.05)
        body = orjson.dumps(review(pod_object(container(limits={"mpsched.io/threads": "5"}))))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/mutate", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert orjson.loads(r.read())["response"]["patchType"] == "JSONPatch"
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        counted = 'mpsched_webhook_admissions_total{endpoint="mutate",outcome="allowed"} 1.0'
        assert counted in text
        assert "mpsched_webhook_certificate_expiry_seconds" not in text  # no TLS, no certificate
    finally:
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    _, err = proc.communicate()
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "plain HTTP" in warnings[0], err
