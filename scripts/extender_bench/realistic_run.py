"""A realistic-mode run from the parsed command line: generate the empty cluster and the pending
pods (the dump's copy of each one version behind the scheduler's), start an API server for each
of serve and the floor (`--api process`), serve and the floor, measure both, and print or write
the report."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from extender_bench.ablation import serve_config_text
from extender_bench.cluster import generate_cluster
from extender_bench.kube_scheduler import adaptive_candidates
from extender_bench.machine import machine, runtime
from extender_bench.measuring import Target
from extender_bench.processes import counters, free_ports, rss_mb, started, wait_idle
from extender_bench.realistic_driver import REAL_WARMUP, measure_realistic
from extender_bench.realistic_pods import realistic_pods
from extender_bench.report import one_decimal, render_realistic
from extender_bench.runs import progress_log, work_directory, write_report
from extender_bench.servers import ENTRY_SCRIPT, fake_apiserver
from extender_bench.targets import realistic_targets


def _serve_argv(
    python: str,
    port: int,
    cluster_file: Path,
    profile: Path | None = None,
    config: Path | None = None,
    *,
    kubeconfig: str | None = None,
) -> list[str]:
    # cProfile writes its file when serve exits (SIGTERM: a clean exit) at the end of the run.
    wrap = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    configured = ["--config", str(config)] if config is not None else []
    cluster = (
        ["--kubeconfig", kubeconfig]
        if kubeconfig is not None
        else ["--cluster-file", str(cluster_file)]
    )
    return [
        python,
        *wrap,
        "-m",
        "extender",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *cluster,
        "--metrics-port",
        "0",  # /status on the verbs' port; nothing fixed to collide with
        *configured,
    ]


#: The resourceVersion of the pending pods in the dump; the scheduler's copies carry newer ones.
DUMP_POD_VERSION = "7"


def main_realistic(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.pods < 1 or args.block < 1:
        print("bench-extender: --nodes, --pods and --block must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.score_pause_ms <= 1000:
        print("bench-extender: --score-pause-ms must be between 0 and 1000", file=sys.stderr)
        return 2
    candidates = min(args.nodes, args.candidates or adaptive_candidates(args.nodes))
    with contextlib.ExitStack() as stack:
        log = progress_log(args)
        workdir = work_directory(args, stack)
        log(f"generating {args.nodes} empty nodes and {args.pods} pending pods ...", flush=True)
        doc, _ = generate_cluster(args.nodes, 0, args.seed)
        nodes = [i for i in doc["items"] if i["kind"] == "Node"]
        warmup = realistic_pods(REAL_WARMUP, args.seed + 5, first_serial=400_000)
        pods = realistic_pods(args.pods, args.seed + 7)
        # The API server knows every pending pod (bind reads it from the watch, as in
        # production), but the scheduler's copy in each filter body is a newer version of it
        # (the scheduler's own status update, say): its parse is never cached, so every pod is
        # new to the extender when its first filter arrives, as a pod just created is.
        for k, pod in enumerate([*warmup, *pods]):
            dumped = orjson.loads(orjson.dumps(pod))
            dumped["metadata"]["resourceVersion"] = DUMP_POD_VERSION
            doc["items"].append(dumped)
            pod["metadata"]["resourceVersion"] = str(1_000_000 + k)
        pod_kb = sum(len(orjson.dumps(p)) for p in pods) / len(pods) / 1000
        cluster_file = workdir / "cluster.json"
        cluster_file.write_bytes(orjson.dumps(doc))
        del doc
        try:
            serve_runtime = runtime(args.serve_python, workdir)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"bench-extender: --serve-python: {exc}", file=sys.stderr)
            return 2
        serve_config = args.serve_config.resolve() if args.serve_config else None
        if args.off:
            try:
                text = serve_config_text(serve_config, args.off)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                print(f"bench-extender: --serve-config: {exc}", file=sys.stderr)
                return 2
            serve_config = workdir / "serve-config.yaml"
            serve_config.write_text(text)
        serve_port, floor_port, serve_api_port, floor_api_port = free_ports(4)
        floor_argv = [args.serve_python, ENTRY_SCRIPT, "--floor-server", str(floor_port)]
        cpus = args.server_cpus
        if cpus is not None:
            # The driver's bind threads and the API servers started below inherit the rest.
            os.sched_setaffinity(0, os.sched_getaffinity(0) - cpus)
        kubeconfig = None
        if args.api == "process":
            log("starting an API server for each of serve and the floor ...", flush=True)
            api_argv = [args.serve_python, ENTRY_SCRIPT, "--api-server"]
            try:
                apis = [
                    stack.enter_context(
                        started(
                            f"apiserver-{who}",
                            [*api_argv, str(port), "--api-dump", str(cluster_file)],
                            port,
                            workdir,
                            args.ready_timeout,
                        )
                    )
                    for who, port in (("serve", serve_api_port), ("floor", floor_api_port))
                ]
            except RuntimeError as exc:
                print(f"bench-extender: {exc}", file=sys.stderr)
                return 1
            kubeconfig = fake_apiserver().kubeconfig(workdir, f"http://127.0.0.1:{apis[0].port}")
            floor_argv += ["--floor-api", f"http://127.0.0.1:{apis[1].port}"]
        log(f"starting mpsched serve on 127.0.0.1:{serve_port} ...", flush=True)
        try:
            serve = stack.enter_context(
                started(
                    "serve",
                    _serve_argv(
                        args.serve_python,
                        serve_port,
                        cluster_file,
                        args.profile_serve.resolve() if args.profile_serve else None,
                        serve_config,
                        kubeconfig=kubeconfig,
                    ),
                    serve_port,
                    workdir,
                    args.ready_timeout,
                    cpus=cpus,
                )
            )
        except RuntimeError as exc:
            print(f"bench-extender: {exc}", file=sys.stderr)
            return 1
        wait_idle(serve.proc.pid, args.ready_timeout)
        floor = stack.enter_context(
            started("floor", floor_argv, floor_port, workdir, 30, cpus=cpus)
        )
        log(f"measuring the extender and the floor ({args.pods} pods each) ...", flush=True)
        load_before = os.getloadavg()[0]
        targets_ = [
            Target("extender", serve.port, args.prefix, serve.proc.pid),
            Target("floor", floor.port, pid=floor.proc.pid),
        ]
        try:
            measured = measure_realistic(
                targets_,
                nodes,
                warmup,
                pods,
                candidates,
                args.seed,
                block=args.block,
                score_pause_s=args.score_pause_ms / 1000,
            )
        except (RuntimeError, OSError) as exc:
            print(f"bench-extender: {exc}\n{serve.tail()}", file=sys.stderr)
            return 1
        load_after = os.getloadavg()[0]
        rss = rss_mb(serve.proc.pid)
        # Measured pods and the warm-up's alike; the start-up warm-up is counted in neither.
        results = counters(serve.port, ("mpsched_forecast_results", "mpsched_call_results"))
    report: dict[str, Any] = {
        "mode": "realistic",
        "api": args.api,
        "machine": machine() | {"load_1m": [round(load_before, 2), round(load_after, 2)]},
        "runtime": serve_runtime,
        "block": args.block,
        "accelerators_off": list(args.off),
        "score_pause_ms": args.score_pause_ms,
        "server_cpus": sorted(cpus) if cpus is not None else None,
        "cluster": {
            "nodes": args.nodes,
            "pods": args.pods,
            "pod_kb": round(pod_kb, 2),
            "candidates": candidates,
        },
        "serve": {
            "peak_rss_mb": one_decimal(rss),
            "results_ahead": results.get("mpsched_forecast_results"),
            "results_in_calls": results.get("mpsched_call_results"),
        },
        "extender": measured["extender"],
        "floor": measured["floor"],
    }
    report["targets"] = realistic_targets(report)
    return write_report(args, report, render_realistic(report))
