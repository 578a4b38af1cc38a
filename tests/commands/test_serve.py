"""`mpsched serve`: refuses to start without a cluster (exit 1, a message saying what to do),
reports unreadable credentials, a bad cluster file or configuration in one line, and serves an
embedded cluster end to end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from extender.cli import main
from extender_bench.processes import free_ports
from tests.http.kube_objects import gpu_node, pod


def test_no_cluster_exits_1_with_advice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert "no cluster" in err and "--cluster-file PATH" in err and "--kubeconfig" in err
    assert err.count("\n") == 1


def test_unreadable_kubeconfig_exits_1_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--kubeconfig", "/nonexistent/kubeconfig"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the cluster" in err and "/nonexistent/kubeconfig" in err


def test_bad_cluster_file_and_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "List", "items": [')
    assert main(["serve", "--cluster-file", str(bad)]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("budgets:\n  oversubscription: 0.5\n")
    good = tmp_path / "good.json"
    good.write_bytes(orjson.dumps({"kind": "List", "items": []}))
    assert main(["serve", "--cluster-file", str(good), "--config", str(config)]) == 1
    assert "oversubscription" in capsys.readouterr().err
    # A webhook that this release cannot serve is refused, not silently left out.
    hook = tmp_path / "hook.yaml"
    hook.write_text("webhook: {enabled: true}\ntls: {certFile: /c, keyFile: /k}\n")
    assert main(["serve", "--cluster-file", str(good), "--config", str(hook)]) == 1
    assert "webhook.enabled" in capsys.readouterr().err


def test_serves_an_embedded_cluster(tmp_path: Path) -> None:
    dump = tmp_path / "cluster.json"
    items = [gpu_node("n1"), pod("p", threads=30)]
    dump.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    port, metrics_port = free_ports(2)
    config = tmp_path / "mpsched.yaml"
    config.write_text(f"server: {{metricsPort: {metrics_port}}}\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "extender", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cluster-file", str(dump), "--config", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.1)
        body = orjson.dumps({"Pod": items[1], "NodeNames": ["n1"]})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert orjson.loads(r.read())["NodeNames"] == ["n1"]
        # /metrics and /status have a listener of their own; the verbs' port has neither.
        for path in ("/metrics", "/status"):
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}", timeout=5) as r:
                assert r.status == 200
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert missing.value.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_the_verbs_are_not_served_to_anyone_on_a_public_address(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "cluster.json"
    dump.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [gpu_node("n")]}))
    assert main(["serve", "--host", "0.0.0.0", "--cluster-file", str(dump)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "would answer any client" in err and "tls.clientCaFile" in err


def test_a_taken_metrics_port_is_named_as_the_metrics_listener(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The verbs' port is free and the metrics port taken: the one line names the metrics
    listener and its own address, not the verbs' address with the other port's error."""
    dump = tmp_path / "cluster.json"
    dump.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [gpu_node("n")]}))
    port, metrics_port = free_ports(2)
    config = tmp_path / "mpsched.yaml"
    config.write_text(f"server: {{metricsPort: {metrics_port}, metricsHost: 127.0.0.1}}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics_port))
        taken.listen()
        argv = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        code = main([*argv, "--cluster-file", str(dump), "--config", str(config)])
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mpsched: serve:")]
    assert code == 1
    assert len(said) == 1, said
    line = said[0]
    assert f"cannot listen on 127.0.0.1:{metrics_port}" in line, line
    assert "metrics and status listener" in line and "server.metricsPort" in line
    assert str(port) not in line.split("(")[0]
