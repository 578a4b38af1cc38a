"""Reader of the openb-family trace CSVs (Alibaba cluster-trace-gpu-v2023, the FGD benchmark):
which columns a file must have and which it may leave out, and what each cell means.

Nodes: `sn, cpu_milli, memory_mib, gpu, model`, all required (a GPU's memory and compute
capability come from the configuration's entry for its model: there is no default model).

Pods come in two column sets: the full one, `name, cpu_milli, memory_mib, num_gpu, gpu_milli,
gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time`, and a short one with
only the first five. Those five are required. The rest are optional, and a missing one means no
constraint: without `gpu_spec` a pod may run on any GPU model. The FGD paper's replay rules
ignore `qos`, `pod_phase` and the times even where a file has them
(arrival order is a seeded shuffle of the name-sorted pods, and nothing departs), so they are
neither required nor read, and a file without them replays exactly as one with them.

Every error is a TraceError naming the file and line, and the column where one is at fault.
Every number has a range (`LIMITS`), far past any real cluster, checked before anything is
built from it: a node line of `gpu=100000000` is one error, not gigabytes of GPUs.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.config_gpus import GpuModel
from extender.packing.bounds import MAX_GPUS_PER_NODE
from extender.packing.model import GpuInfo, NodeInventory, client_limit
from extender.packing.request import ContainerAsk, ShareRequest
from extender.packing.settings import BudgetSettings
from extender.packing.view import pod_shape
from extender.simulate.types import TRACE_USER, SimNode, SimPod, TraceError

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
#: The short pod column set: what every pod file must have.
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
#: Pod columns read where present; absent, the pod may use any GPU model.
POD_OPTIONAL = ("gpu_spec",)
#: The rest of the full pod column set: accepted, not read (the replay rules ignore them).
POD_IGNORED = ("qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
#: The trace counts GPU in milli (1000 per GPU); mpsched in thread percent.
MILLI_PER_THREAD = 10
#: Namespace given to trace pods (the trace has none).
NAMESPACE = "trace"
#: The largest value of each numeric column, and why (node and pod columns alike).
LIMITS: Mapping[str, tuple[int, str]] = {
    "gpu": (MAX_GPUS_PER_NODE, f"a node holds at most {MAX_GPUS_PER_NODE} GPUs"),
    "num_gpu": (
        MAX_GPUS_PER_NODE,
        f"a pod runs on one node, which holds at most {MAX_GPUS_PER_NODE} GPUs",
    ),
    "cpu_milli": (10**9, "a million cores"),
    "memory_mib": (2**32, "4 PiB"),
}
#: GPUs in a whole node file: a thousand times the openb trace's, and each is an object.
MAX_TRACE_GPUS = 1_000_000


@dataclass(frozen=True, slots=True)
class Row:
    """One data row with the header that names its cells."""

    path: Path
    line: int
    cells: tuple[str, ...]
    #: Column name → 0-based position, from the header.
    index: Mapping[str, int]

    def where(self, column: str) -> str:
        """`file:line: column (column n)`, the prefix of an error about one cell."""
        at = self.index.get(column)
        return f"{self.path}:{self.line}: {column}" + ("" if at is None else f" (column {at + 1})")

    def text(self, column: str) -> str:
        """The cell, stripped; "" where the file has no such column."""
        at = self.index.get(column)
        return self.cells[at].strip() if at is not None and at < len(self.cells) else ""

    def integer(self, column: str) -> int:
        """A count or amount: a non-negative integer; an empty cell counts as 0 (no request),
        and an integral float ("1000.0") as that integer."""
        text = self.text(column)
        if not text:
            return 0
        try:
            value = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = float("nan")
            if not number.is_integer():
                raise TraceError(f"{self.where(column)}: {text!r} is not an integer") from None
            value = int(number)
        if value < 0:
            raise TraceError(f"{self.where(column)}: {value} is negative")
        high, why = LIMITS.get(column, (None, ""))
        if high is not None and value > high:
            shown = text if len(text) <= 24 else f"{text[:20]}..."
            raise TraceError(f"{self.where(column)}: {shown} is above {high} ({why})")
        return value


def _header(path: Path, names: Sequence[str], required: Sequence[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for at, raw in enumerate(names):
        name = raw.strip()
        if not name:
            continue  # a trailing comma in the header: a column nobody reads
        if name in index:
            raise TraceError(
                f"{path}:1: {name} (column {at + 1}): duplicate column "
                f"(also column {index[name] + 1})"
            )
        index[name] = at
    missing = [c for c in required if c not in index]
    if missing:
        raise TraceError(
            f"{path}:1: missing column(s) {', '.join(missing)} "
            f"(required: {', '.join(required)}; the header has {', '.join(index) or 'none'})"
        )
    return index


def rows(path: Path, required: Sequence[str]) -> Iterator[Row]:
    """The data rows of a CSV whose header has every `required` column (in any order, others
    allowed). Blank lines are skipped; a row with more cells than the header is an error, one
    with fewer has empty trailing cells."""
    try:
        # utf-8-sig: a byte-order mark would otherwise become part of the first column's name.
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle, strict=True)
        try:
            names = next(reader, None)
            if names is None:
                raise TraceError(
                    f"{path}:1: empty file: expected a header with {', '.join(required)}"
                )
            index = _header(path, names, required)
            for cells in reader:
                if not any(c.strip() for c in cells):
                    continue
                if len(cells) > len(names):
                    raise TraceError(
                        f"{path}:{reader.line_num}: column {len(names) + 1}: {len(cells)} cells, "
                        f"but the header has {len(names)} columns"
                    )
                yield Row(path, reader.line_num, tuple(cells), index)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text: {exc.reason}") from None
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: {exc}") from None


def _unique(seen: dict[str, int], row: Row, column: str, what: str) -> str:
    name = row.text(column)
    if not name:
        raise TraceError(f"{row.where(column)}: empty {what} name")
    first = seen.setdefault(name, row.line)
    if first != row.line:
        raise TraceError(f"{row.where(column)}: {what} {name!r} already on line {first}")
    return name


def model_gpus(
    node: str, model: str, spec: GpuModel, count: int, *, budgets: BudgetSettings
) -> tuple[GpuInfo, ...]:
    """`count` GPUs of `model` (its facts in `spec`) on the trace node `node`, as a replay's
    inventory holds them: uuids made from the node's name, the budgets' default share units
    and client budget (`model.client_limit`, as the extender's inventories from node labels
    have it: the architecture's limit, capped by configuration)."""
    clients = client_limit(spec.compute_capability, budgets.max_clients_per_gpu)
    return tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{node}-{i}",
            model=model,
            memory_mib=spec.memory_mib,
            compute_capability=spec.compute_capability,
            max_clients=clients,
            units=budgets.default_units,
        )
        for i in range(count)
    )


def read_nodes(
    path: Path, models: Mapping[str, GpuModel], *, budgets: BudgetSettings
) -> tuple[SimNode, ...]:
    """The nodes, each with `gpu` identical GPUs of `model` (facts from `models`, the
    configuration's `gpuModels`; share units and client budget from `budgets`, `model_gpus`)."""
    nodes: list[SimNode] = []
    seen: dict[str, int] = {}
    total = 0
    for row in rows(path, NODE_COLUMNS):
        name = _unique(seen, row, "sn", "node")
        count = row.integer("gpu")
        total += count
        if total > MAX_TRACE_GPUS:
            raise TraceError(f"{row.where('gpu')}: more than {MAX_TRACE_GPUS:,} GPUs in the file")
        model = row.text("model")
        if count and not model:
            raise TraceError(f"{row.where('model')}: node {name} has {count} GPUs but no model")
        spec = models.get(model) if count else None
        if count and spec is None:
            raise TraceError(
                f"{row.where('model')}: unknown GPU model {model!r}: describe it under gpuModels "
                f"in --config (known: {', '.join(sorted(models))})"
            )
        gpus = model_gpus(name, model, spec, count, budgets=budgets) if spec is not None else ()
        cpu = row.integer("cpu_milli")
        memory = row.integer("memory_mib")
        inventory = NodeInventory(name, gpus, cpu_milli=cpu, memory_mib=memory)
        nodes.append(SimNode(name, cpu, memory, inventory))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    if not any(n.inventory.gpus for n in nodes):
        # Every figure is a share of the GPU capacity: with none there is nothing to measure.
        raise TraceError(f"{path}: no node has a GPU (column gpu is 0 on every line)")
    return tuple(nodes)


def trace_pod(
    name: str, cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int, spec: str
) -> SimPod:
    """One trace pod: a share of gpu_milli/10 % threads (memory follows proportionally), k
    whole GPUs, or CPU only. `spec`: the allowed models, "|"-separated; "" allows any."""
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    threads = 0
    if num_gpu == 0 or gpu_milli == 0:
        request = ShareRequest(NAMESPACE, name, name, "none")
    elif gpu_milli < 1000:
        threads = max(1, gpu_milli // MILLI_PER_THREAD)
        ask = ContainerAsk("main", threads=threads)
        request = ShareRequest(
            NAMESPACE, name, name, "share", containers=(ask,), run_as_user=TRACE_USER
        )
    else:
        request = ShareRequest(NAMESPACE, name, name, "whole", whole_gpus=num_gpu)
    shape = pod_shape(request, cpu_milli, threads=threads, models=models)
    return SimPod(name, cpu_milli, memory_mib, shape, request)


def read_pods(path: Path) -> tuple[SimPod, ...]:
    """The pods, from either column set. gpu_milli is per GPU: below 1000 only for one-GPU
    sharing pods. Names must be unique (a pod's name is its identity in the ledger)."""
    pods: list[SimPod] = []
    seen: dict[str, int] = {}
    for row in rows(path, POD_COLUMNS):
        name = _unique(seen, row, "name", "pod")
        num_gpu = row.integer("num_gpu")
        gpu_milli = row.integer("gpu_milli")
        if gpu_milli > 1000 or (0 < gpu_milli < 1000 and num_gpu > 1):
            raise TraceError(
                f"{row.where('gpu_milli')}: {gpu_milli} with num_gpu {num_gpu} "
                "(gpu_milli is per GPU: at most 1000, below 1000 only for one GPU)"
            )
        cpu = row.integer("cpu_milli")
        memory = row.integer("memory_mib")
        pods.append(trace_pod(name, cpu, memory, num_gpu, gpu_milli, row.text("gpu_spec")))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)
