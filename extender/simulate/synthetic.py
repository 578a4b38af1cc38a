"""Synthetic held-out workloads in the openb pod-CSV format, with size mixes unlike the openb
default trace, to check that a policy tuned on one trace is not tuned to it.

    python -m extender.simulate.synthetic --mix uniform --seed 1 --gpus 6212 > pods.csv
    python -m extender.simulate.synthetic --mix uniform --pin 0.2 --nodes nodes.csv > pods.csv

Each mix draws pods until their GPU request reaches the given number of GPUs (the default
trace asks 98 % of its cluster); CPU and memory follow a per-class distribution.

Model pinning (`--pin FRACTION --nodes NODES_CSV`): that fraction of the GPU pods name one GPU
model in `gpu_spec`, drawn among the cluster's models with a node that can host the pod (GPU
count, CPU, memory), in proportion to each model's GPUs or, with `--skew`, to their square root
(which pins small models beyond their share of the cluster: they become scarce). Pinning draws
from its own random stream, so a pinned mix has the same pods as the unpinned one.

The pinned grid (`GridCell`, `grid_hosts`, `grid_pods`; `--grid-cell NAME` with `--nodes-out`)
varies what a real pinned population varies and the mixes above do not, on a small cluster (138
nodes, 600 GPUs: a seed replays in a fraction of a second) with an unpinned pool of 8-GPU G2
nodes, three small models on 1-2-GPU nodes (T4, P100, A10) and three on 8-GPU nodes (G3,
V100M32, V100M16): the share of GPU pods that pin (`pin`), whether a pin names one model or a
set `A|B[|C]` (`names`), the sizes of pinned pods (`sizes`: mostly whole GPUs, mostly shares,
or drawn like the unpinned ones) and where the pinned models live (`where`: the small nodes or
the 8-GPU ones). Unpinned pods follow the openb default trace's broad proportions (CPU-only,
shares, whole GPUs, a few multi-GPU pods), drawn from simple distributions.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

#: (num_gpu, gpu_milli) of a pod; (0, 0) is CPU-only.
Gpu = tuple[int, int]
#: A pod row: (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec).
Row = tuple[str, int, int, int, int, str]


@dataclass(frozen=True, slots=True)
class Host:
    """One node of the cluster, as far as pinning needs it."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class SizeMix:
    """One mix of pod sizes: a draw below `cpu_only` is a CPU-only pod, below `shares` one share
    of a GPU (its thousandths drawn from `share`), else whole GPUs (the count drawn from
    `whole`)."""

    cpu_only: float
    shares: float
    share: Sequence[int]
    whole: Sequence[int]

    def __call__(self, rng: random.Random) -> Gpu:
        r = rng.random()
        if r < self.cpu_only:
            return 0, 0
        if r < self.shares:
            return 1, rng.choice(self.share)
        return rng.choice(self.whole), 1000


MIXES: Mapping[str, Callable[[random.Random], Gpu]] = MappingProxyType(
    {
        # A quarter CPU-only, half shares of any size 5-95 %, a quarter 1, 2, 4 or 8 whole GPUs.
        "uniform": SizeMix(0.25, 0.75, range(50, 951, 10), [1, 1, 1, 1, 1, 1, 2, 2, 4, 8]),
        # Mostly small shares (1/8 to 1/2 of a GPU), some whole GPUs, few CPU-only pods.
        "small-shares": SizeMix(0.08, 0.78, [125, 200, 250, 250, 330, 400, 500, 500], [1, 1, 1, 2]),
        # Mostly whole GPUs (many multi-GPU), with large shares (60-90 %) and CPU-only pods.
        "whole-heavy": SizeMix(0.15, 0.40, range(600, 901, 10), [1, 1, 1, 1, 2, 4, 8]),
        # openb-like proportions (15 % CPU-only, 35 % shares, half whole GPUs) but other share
        # sizes (20-70 %); its CPU asks (`_cpu`, heavier here) make CPU the scarce resource.
        "cpu-bound": SizeMix(0.15, 0.50, [200, 250, 300, 400, 500, 600, 700], [1] * 30 + [2, 4, 8]),
    }
)


def _cpu(rng: random.Random, gpu: Gpu, mix: str) -> int:
    """Millicores: per GPU 2-16 cores (cpu-bound: 8-16, near a G2 node's 12 per GPU), CPU-only
    pods 1-32 cores (cpu-bound: 8-32)."""
    num, milli = gpu
    heavy = mix == "cpu-bound"
    if num == 0:
        return 1000 * rng.choice([8, 12, 16, 32] if heavy else [1, 2, 4, 8, 16, 32])
    per_gpu = rng.choice(
        [8000, 11000, 12000, 16000] if heavy else [2000, 4000, 6000, 8000, 12000, 16000]
    )
    return max(500, per_gpu * num * (milli if num == 1 else 1000) // 1000)


def _pod_rows(mix: str, *, seed: int, gpus: float) -> Iterator[tuple[str, int, int, int, int]]:
    draw = MIXES[mix]
    rng = random.Random(f"{mix}/{seed}")
    asked = 0
    k = 0
    while asked < gpus * 1000:
        num, milli = draw(rng)
        cpu = _cpu(rng, (num, milli), mix)
        memory = cpu // 1000 * 4096 or 2048
        asked += num * milli
        yield f"{mix}-{seed}-{k:05d}", cpu, memory, num, milli
        k += 1


def pin_weights(hosts: Iterable[Host], *, skew: bool) -> dict[str, float]:
    """Each model's weight in the draw of a pinned model: its GPUs, or their square root."""
    capacity: dict[str, int] = {}
    for h in hosts:
        if h.gpus and h.model:
            capacity[h.model] = capacity.get(h.model, 0) + h.gpus
    return {m: math.sqrt(c) if skew else float(c) for m, c in sorted(capacity.items())}


def _hostable(hosts: Sequence[Host], cpu: int, memory: int, num: int) -> frozenset[str]:
    return frozenset(
        h.model
        for h in hosts
        if h.model and h.gpus >= num and h.cpu_milli >= cpu and h.memory_mib >= memory
    )


def pods(
    mix: str,
    *,
    seed: int,
    gpus: float,
    pin: float = 0.0,
    hosts: Sequence[Host] = (),
    skew: bool = False,
) -> Iterator[Row]:
    """(name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec) until the GPU request
    reaches `gpus`; a fraction `pin` of the GPU pods name one model of `hosts` that can host
    them (none when no model can)."""
    if not 0.0 <= pin <= 1.0:
        raise ValueError(f"pin must be in [0, 1], got {pin}")
    if pin and not hosts:
        raise ValueError("pinning needs the cluster's nodes")
    weights = pin_weights(hosts, skew=skew)
    hostable: dict[tuple[int, int, int], list[str]] = {}
    rng = random.Random(f"{mix}/{seed}/pin")
    for name, cpu, memory, num, milli in _pod_rows(mix, seed=seed, gpus=gpus):
        spec = ""
        if pin and num and rng.random() < pin:
            key = (cpu, memory, num)
            models = hostable.get(key)
            if models is None:
                models = hostable[key] = sorted(_hostable(hosts, cpu, memory, num))
            if models:
                spec = rng.choices(models, weights=[weights[m] for m in models])[0]
        yield name, cpu, memory, num, milli, spec


#: The grid's cluster: (model, GPUs per node, CPU millicores, memory MiB, nodes).
GRID_CLUSTER: tuple[tuple[str, int, int, int, int], ...] = (
    ("G2", 8, 96_000, 393_216, 40),
    ("T4", 2, 104_000, 524_288, 50),
    ("P100", 2, 64_000, 262_144, 20),
    ("A10", 1, 32_000, 131_072, 12),
    ("G3", 8, 128_000, 786_432, 8),
    ("V100M32", 8, 96_000, 786_432, 5),
    ("V100M16", 8, 64_000, 262_144, 3),
)
#: The models pinned pods name, by where they live.
GRID_PINNED: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"small": ("T4", "P100", "A10"), "8gpu": ("G3", "V100M32", "V100M16")}
)
GRID_PINS: tuple[float, ...] = (0.05, 0.15, 0.25, 0.35)
GRID_NAMES: tuple[str, ...] = ("one", "set")
GRID_SIZES: tuple[str, ...] = ("whole", "shares", "like")
#: GPU the grid's pods ask in all, as a share of the cluster's (the openb trace asks 98 %).
GRID_LOAD = 0.98


@dataclass(frozen=True, slots=True)
class GridCell:
    """One cell of the pinned grid (module docstring)."""

    pin: float
    names: str
    sizes: str
    where: str

    @property
    def name(self) -> str:
        return f"pin{round(100 * self.pin):02d}-{self.names}-{self.sizes}-{self.where}"

    @classmethod
    def parse(cls, name: str) -> GridCell:
        """The cell `name` names (as `GridCell.name` writes it); ValueError when none."""
        parts = name.split("-")
        if len(parts) == 4 and parts[0].startswith("pin") and parts[0][3:].isdigit():
            cell = cls(int(parts[0][3:]) / 100, parts[1], parts[2], parts[3])
            if cell.names in GRID_NAMES and cell.sizes in GRID_SIZES and cell.where in GRID_PINNED:
                return cell
        raise ValueError(
            f"bad grid cell {name!r}: expected pinNN-{{{','.join(GRID_NAMES)}}}-"
            f"{{{','.join(GRID_SIZES)}}}-{{{','.join(GRID_PINNED)}}}"
        )


def grid_cells() -> tuple[GridCell, ...]:
    """Every cell of the pinned grid."""
    return tuple(
        GridCell(pin, names, sizes, where)
        for where in GRID_PINNED
        for sizes in GRID_SIZES
        for names in GRID_NAMES
        for pin in GRID_PINS
    )


def grid_hosts() -> tuple[Host, ...]:
    """The grid's cluster, node by node."""
    return tuple(
        Host(model, gpus, cpu, memory)
        for model, gpus, cpu, memory, count in GRID_CLUSTER
        for _ in range(count)
    )


def grid_node_rows() -> Iterator[tuple[str, int, int, int, str]]:
    """(sn, cpu_milli, memory_mib, gpu, model) of the grid's nodes."""
    for k, h in enumerate(grid_hosts()):
        yield f"grid-node-{k:04d}", h.cpu_milli, h.memory_mib, h.gpus, h.model


def _grid_gpu(rng: random.Random, sizes: str) -> Gpu:
    """(num_gpu, gpu_milli) of a GPU pod: `like` the unpinned pods (about 45 % shares, the rest
    whole GPUs, 2 % of them 2-8 GPUs), mostly `whole` GPUs (85 %) or mostly `shares` (85 %)."""
    share = {"like": 0.45, "whole": 0.15, "shares": 0.85}[sizes]
    if rng.random() < share:
        return 1, rng.choice([230, 320, 470, 470, 500, 650, 810, 810, 810])
    return rng.choice([1] * 48 + [2, 4, 8]), 1000


def _grid_cpu(rng: random.Random, num: int, milli: int) -> int:
    """Millicores: shares 1-12 cores, whole GPUs 4-16 cores each, CPU-only pods 4-32 cores."""
    if num == 0:
        return 1000 * rng.choice([4, 8, 12, 12, 16, 32])
    if milli < 1000:
        return 1000 * rng.choice([1, 3, 3, 4, 6, 8, 11])
    return 1000 * num * rng.choice([4, 8, 11, 11, 12, 16])


def grid_pods(cell: GridCell, *, seed: int) -> Iterator[Row]:
    """The pods of one grid cell until they ask GRID_LOAD of the grid cluster's GPUs: 13 % are
    CPU-only; a GPU pod pins with probability `cell.pin`, its size drawn by `cell.sizes`; an
    unpinned one is drawn `like`. A pin names one of the `where` models able to host the pod
    (in proportion to their GPUs) or, for `set`, two or three of them (fewer where fewer can)."""
    hosts = grid_hosts()
    gpus = GRID_LOAD * sum(h.gpus for h in hosts)
    group = GRID_PINNED[cell.where]
    capacity = {m: sum(h.gpus for h in hosts if h.model == m) for m in group}
    rng = random.Random(f"grid/{cell.name}/{seed}")
    asked = 0
    k = 0
    while asked < gpus * 1000:
        spec = ""
        if rng.random() < 0.13:
            num, milli = 0, 0
        elif rng.random() < cell.pin:
            num, milli = _grid_gpu(rng, cell.sizes)
            cpu = _grid_cpu(rng, num, milli)
            hostable = _hostable(hosts, cpu, cpu // 1000 * 4096 or 2048, num)
            able = [m for m in group if m in hostable]
            if able:
                if cell.names == "one":
                    spec = rng.choices(able, weights=[capacity[m] for m in able])[0]
                else:
                    spec = "|".join(sorted(rng.sample(able, min(len(able), rng.choice([2, 3])))))
        else:
            num, milli = _grid_gpu(rng, "like")
        if not spec:
            cpu = _grid_cpu(rng, num, milli)
        memory = cpu // 1000 * 4096 or 2048
        asked += num * milli
        yield f"{cell.name}-{seed}-{k:05d}", cpu, memory, num, milli, spec
        k += 1


def read_hosts(path: Path) -> tuple[Host, ...]:
    """The nodes of an openb node CSV (`sn, cpu_milli, memory_mib, gpu, model`)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return tuple(
            Host(
                (row.get("model") or "").strip(),
                int(row.get("gpu") or 0),
                int(row.get("cpu_milli") or 0),
                int(row.get("memory_mib") or 0),
            )
            for row in csv.DictReader(handle)
        )


def write_nodes_csv(rows: Iterable[tuple[str, int, int, int, str]], out: TextIO) -> None:
    out.write("sn,cpu_milli,memory_mib,gpu,model\n")
    out.writelines(",".join(map(str, row)) + "\n" for row in rows)


def write_csv(rows: Iterable[Row], out: TextIO) -> None:
    out.write("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n")
    out.writelines(",".join(map(str, row)) + "\n" for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mix", choices=sorted(MIXES))
    parser.add_argument(
        "--grid-cell",
        metavar="NAME",
        help="a pinned grid cell's pods instead, e.g. pin25-set-whole-small",
    )
    parser.add_argument(
        "--nodes-out", type=Path, help="with --grid-cell: write the grid's nodes here"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus", type=float, default=6212 * 0.98, help="GPUs to ask in total")
    parser.add_argument("--pin", type=float, default=0.0, help="fraction of GPU pods pinned")
    parser.add_argument("--nodes", type=Path, help="the cluster's node CSV (for --pin)")
    parser.add_argument("--skew", action="store_true", help="pin small models beyond share")
    args = parser.parse_args(argv)
    if args.grid_cell is not None:
        try:
            cell = GridCell.parse(args.grid_cell)
        except ValueError as exc:
            parser.error(str(exc))
        if args.nodes_out is not None:
            with args.nodes_out.open("w", encoding="utf-8") as out:
                write_nodes_csv(grid_node_rows(), out)
        write_csv(grid_pods(cell, seed=args.seed), sys.stdout)
        return 0
    if args.mix is None:
        parser.error("need --mix or --grid-cell")
    if args.pin and args.nodes is None:
        parser.error("--pin needs --nodes")
    hosts = read_hosts(args.nodes) if args.nodes is not None else ()
    rows = pods(args.mix, seed=args.seed, gpus=args.gpus, pin=args.pin, hosts=hosts, skew=args.skew)
    write_csv(rows, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
