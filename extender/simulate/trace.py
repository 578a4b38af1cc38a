"""Reader of the openb trace CSVs (Alibaba cluster-trace-gpu-v2023, the FGD benchmark): nodes
`sn, cpu_milli, memory_mib, gpu, model` and pods `name, cpu_milli, memory_mib, num_gpu,
gpu_milli, gpu_spec, ...`. Errors name the file and line."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from pathlib import Path

from extender.config import GpuModel
from extender.packing.model import GpuInfo, NodeInventory, architecture_client_limit
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.view import pod_shape
from extender.simulate.types import SimNode, SimPod, TraceError

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
#: The trace counts GPU in milli (1000 per GPU); mpsched in thread percent.
MILLI_PER_THREAD = 10
#: Namespace given to trace pods (the trace has none).
NAMESPACE = "trace"


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row


def _int(path: Path, line: int, row: Mapping[str, str | None], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text or "0")
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} {text!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: {column} {value} is negative")
    return value


def read_nodes(path: Path, models: Mapping[str, GpuModel], *, units: int) -> tuple[SimNode, ...]:
    """The nodes, each with `gpu` identical GPUs of `model` (facts from `models`, the
    configuration's `gpuModels`) and `units` share units per GPU."""
    nodes: list[SimNode] = []
    for line, row in _rows(path, NODE_COLUMNS):
        name = (row["sn"] or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: empty node name")
        count = _int(path, line, row, "gpu")
        model = (row["model"] or "").strip()
        if count and not model:
            raise TraceError(f"{path}:{line}: node {name} has {count} GPUs but no model")
        spec = models.get(model) if count else None
        if count and spec is None:
            raise TraceError(
                f"{path}:{line}: unknown GPU model {model!r}: describe it under gpuModels in "
                f"--config (known: {', '.join(sorted(models))})"
            )
        gpus = tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=model,
                memory_mib=spec.memory_mib,
                compute_capability=spec.compute_capability,
                max_clients=architecture_client_limit(spec.compute_capability),
                units=units,
            )
            for i in range(count)
            if spec is not None
        )
        cpu = _int(path, line, row, "cpu_milli")
        memory = _int(path, line, row, "memory_mib")
        inventory = NodeInventory(name, gpus, cpu_milli=cpu, memory_mib=memory)
        nodes.append(SimNode(name, cpu, memory, inventory))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def trace_pod(
    name: str, cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int, spec: str
) -> SimPod:
    """One trace pod: a share of gpu_milli/10 % threads (memory follows proportionally), k
    whole GPUs, or CPU only."""
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    threads = 0
    if num_gpu == 0 or gpu_milli == 0:
        request = ShareRequest(NAMESPACE, name, name, "none")
    elif gpu_milli < 1000:
        threads = max(1, gpu_milli // MILLI_PER_THREAD)
        ask = ContainerAsk("main", threads=threads)
        request = ShareRequest(NAMESPACE, name, name, "share", containers=(ask,))
    else:
        request = ShareRequest(NAMESPACE, name, name, "whole", whole_gpus=num_gpu)
    shape = pod_shape(request, cpu_milli, threads=threads, models=models)
    return SimPod(name, cpu_milli, memory_mib, shape, request)


def read_pods(path: Path) -> tuple[SimPod, ...]:
    """The pods. gpu_milli is per GPU: below 1000 only for one-GPU sharing pods."""
    pods: list[SimPod] = []
    for line, row in _rows(path, POD_COLUMNS):
        name = (row["name"] or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: empty pod name")
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if gpu_milli > 1000 or (0 < gpu_milli < 1000 and num_gpu > 1):
            raise TraceError(
                f"{path}:{line}: gpu_milli {gpu_milli} with num_gpu {num_gpu} "
                "(gpu_milli is per GPU: at most 1000, below 1000 only for one GPU)"
            )
        cpu = _int(path, line, row, "cpu_milli")
        memory = _int(path, line, row, "memory_mib")
        pods.append(trace_pod(name, cpu, memory, num_gpu, gpu_milli, row["gpu_spec"] or ""))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)
