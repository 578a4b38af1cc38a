"""Synthetic held-out workloads in the openb pod-CSV format, with size mixes unlike the openb
default trace, to check that a policy tuned on one trace is not tuned to it.

    python -m extender.simulate.synthetic --mix uniform --seed 1 --gpus 6212 > pods.csv

Each mix draws pods until their GPU request reaches the given number of GPUs (the default
trace asks 98 % of its cluster); CPU and memory follow a per-class distribution.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TextIO

#: (num_gpu, gpu_milli) of a pod; (0, 0) is CPU-only.
Gpu = tuple[int, int]


def _uniform(rng: random.Random) -> Gpu:
    """A quarter CPU-only, half shares of any size 5-95 %, a quarter 1, 2, 4 or 8 whole GPUs."""
    r = rng.random()
    if r < 0.25:
        return 0, 0
    if r < 0.75:
        return 1, 10 * rng.randint(5, 95)
    return rng.choice([1, 1, 1, 1, 1, 1, 2, 2, 4, 8]), 1000


def _small_shares(rng: random.Random) -> Gpu:
    """Mostly small shares (1/8 to 1/2 of a GPU), some whole GPUs, few CPU-only pods."""
    r = rng.random()
    if r < 0.08:
        return 0, 0
    if r < 0.78:
        return 1, rng.choice([125, 200, 250, 250, 330, 400, 500, 500])
    return rng.choice([1, 1, 1, 2]), 1000


def _whole_heavy(rng: random.Random) -> Gpu:
    """Mostly whole GPUs (many multi-GPU), with large shares (60-90 %) and CPU-only pods."""
    r = rng.random()
    if r < 0.15:
        return 0, 0
    if r < 0.40:
        return 1, 10 * rng.randint(60, 90)
    return rng.choice([1, 1, 1, 1, 2, 4, 8]), 1000


def _cpu_bound(rng: random.Random) -> Gpu:
    """openb-like proportions (15 % CPU-only, 35 % shares, half whole GPUs) but other share
    sizes (20-70 %); its CPU asks (`_cpu`, heavier here) make CPU the scarce resource."""
    r = rng.random()
    if r < 0.15:
        return 0, 0
    if r < 0.50:
        return 1, rng.choice([200, 250, 300, 400, 500, 600, 700])
    return rng.choice([1] * 30 + [2, 4, 8]), 1000


MIXES: Mapping[str, Callable[[random.Random], Gpu]] = MappingProxyType(
    {
        "uniform": _uniform,
        "small-shares": _small_shares,
        "whole-heavy": _whole_heavy,
        "cpu-bound": _cpu_bound,
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


def pods(mix: str, *, seed: int, gpus: float) -> Iterator[tuple[str, int, int, int, int]]:
    """(name, cpu_milli, memory_mib, num_gpu, gpu_milli) until the GPU request reaches `gpus`."""
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


def write_csv(rows: Iterator[tuple[str, int, int, int, int]], out: TextIO) -> None:
    out.write("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n")
    for name, cpu, memory, num, milli in rows:
        out.write(f"{name},{cpu},{memory},{num},{milli},\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mix", choices=sorted(MIXES), required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus", type=float, default=6212 * 0.98, help="GPUs to ask in total")
    args = parser.parse_args(argv)
    write_csv(pods(args.mix, seed=args.seed, gpus=args.gpus), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
