"""A classic-mode run from the parsed command line: generate the half-full cluster and the
pending pods into a cluster file, start serve on it (`--cluster-file`) and the floor, wait for
serve to go idle, measure both, and print or write the report."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from typing import Any

import orjson

from extender_bench.classic_driver import NEW_SHAPES, measure
from extender_bench.cluster import generate_cluster
from extender_bench.kube_scheduler import adaptive_candidates
from extender_bench.machine import machine, runtime
from extender_bench.measuring import Target
from extender_bench.pods import new_shape_pods, pending_pods
from extender_bench.processes import free_ports, rss_mb, started, wait_idle
from extender_bench.report import one_decimal, render
from extender_bench.runs import progress_log, work_directory, write_report
from extender_bench.servers import ENTRY_SCRIPT
from extender_bench.targets import targets


def main_classic(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.pods < 1 or args.block < 1:
        print("bench-extender: --nodes, --pods and --block must be at least 1", file=sys.stderr)
        return 2
    running = args.running_pods if args.running_pods is not None else 12 * args.nodes
    pods_all = args.pods_all if args.pods_all is not None else max(1, args.pods // 4)
    candidates = min(args.nodes, args.candidates or adaptive_candidates(args.nodes))

    with contextlib.ExitStack() as stack:
        log = progress_log(args)
        workdir = work_directory(args, stack)

        log(f"generating {args.nodes} nodes, {running} running pods ...", flush=True)
        t0 = time.perf_counter()
        doc, stats = generate_cluster(args.nodes, running, args.seed)
        pods = pending_pods(args.pods + pods_all, args.seed + 7)
        pods_a, pods_b = pods[: args.pods], pods[args.pods :]
        # The pending pods are in the dump too: kube-scheduler only schedules pods the API
        # server holds, and a bind of a pod the cluster does not know is refused (404).
        doc["items"].extend(pods)
        cluster_file = workdir / "cluster.json"
        cluster_file.write_bytes(orjson.dumps(doc))
        file_mb = cluster_file.stat().st_size / 1e6
        del doc
        generate_s = time.perf_counter() - t0
        node_names = [f"node-{i:05d}" for i in range(args.nodes)]

        try:
            serve_runtime = runtime(args.serve_python, workdir)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"bench-extender: --serve-python: {exc}", file=sys.stderr)
            return 2
        serve_port, floor_port = free_ports(2)
        serve_argv = [
            args.serve_python,
            "-m",
            "extender",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(serve_port),
            "--cluster-file",
            str(cluster_file),
            "--metrics-port",
            "0",  # /status on the verbs' port; nothing fixed to collide with
        ]
        floor_argv = [args.serve_python, ENTRY_SCRIPT, "--floor-server", str(floor_port)]
        log(f"starting mpsched serve on 127.0.0.1:{serve_port} ...", flush=True)
        t0 = time.perf_counter()
        try:
            serve = stack.enter_context(
                started("serve", serve_argv, serve_port, workdir, args.ready_timeout)
            )
        except RuntimeError as exc:
            print(f"bench-extender: {exc}", file=sys.stderr)
            return 1
        ready_s = time.perf_counter() - t0
        rss_ready = rss_mb(serve.proc.pid)
        log("waiting for serve to go idle ...", flush=True)
        settle_s = wait_idle(serve.proc.pid, args.ready_timeout)
        floor = stack.enter_context(started("floor", floor_argv, floor_port, workdir, 30))

        log(f"measuring the extender and the floor ({args.pods} + {pods_all} pods) ...", flush=True)
        # Other work on the machine moves every figure: say how busy it was.
        load_before = os.getloadavg()[0]
        targets_ = [
            Target("extender", serve.port, args.prefix, serve.proc.pid),
            Target("floor", floor.port, pid=floor.proc.pid),
        ]
        try:
            measured = measure(
                targets_,
                node_names,
                pods_a,
                pods_b,
                candidates,
                args.seed,
                block=args.block,
                new_shapes=new_shape_pods(NEW_SHAPES, args.seed + 11),
            )
        except (RuntimeError, OSError) as exc:
            print(f"bench-extender: {exc}\n{serve.tail()}", file=sys.stderr)
            return 1
        load_after = os.getloadavg()[0]
        rss = rss_mb(serve.proc.pid)
        rss_now = rss_mb(serve.proc.pid, "VmRSS")

    report: dict[str, Any] = {
        "machine": machine() | {"load_1m": [round(load_before, 2), round(load_after, 2)]},
        "runtime": serve_runtime,
        "block": args.block,
        "cluster": {
            "nodes": stats.nodes,
            "gpus": stats.gpus,
            "running_pods": stats.running_pods,
            "whole_pods": stats.whole_pods,
            "threads_used_pct": round(stats.threads_used_pct, 1),
            "models": stats.models,
            "file_mb": round(file_mb, 1),
            "generate_s": round(generate_s, 1),
        },
        "serve": {
            "ready_s": round(ready_s, 1),
            "idle_after_s": round(settle_s, 1),
            "peak_rss_mb": one_decimal(rss),
            "peak_rss_at_ready_mb": one_decimal(rss_ready),
            "rss_at_end_mb": one_decimal(rss_now),
        },
        "extender": measured["extender"],
        "floor": measured["floor"],
    }
    report["targets"] = targets(report)
    return write_report(args, report, render(report))
