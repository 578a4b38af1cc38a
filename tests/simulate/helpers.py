"""Helpers for the simulator's tests: tiny openb-format traces and a benchmark config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time"
)
BENCH = """
budgets: {memoryReserveMiB: 0, clientOverheadMiB: 0, preVolta: share}
gpuModels:
  G2: {memoryMiB: 32768, computeCapability: "7.0"}
  P100: {memoryMiB: 16280, computeCapability: "6.0"}
  T4: {memoryMiB: 15109, computeCapability: "7.5"}
"""

#: A small cluster: two 8-GPU nodes, two 2-GPU nodes (one pre-Volta, short of CPU).
NODES = [
    "n-a,96000,393216,8,G2",
    "n-b,96000,393216,8,G2",
    "n-c,16000,65536,2,P100",
    "n-d,104000,524288,2,T4",
]


def pod_rows(count: int) -> list[str]:
    """`count` pods cycling through CPU-only, shares of several sizes and whole GPUs."""
    kinds = [
        (4000, 8192, 0, 0),
        (3152, 8192, 1, 810),
        (8000, 16384, 1, 470),
        (11300, 30000, 1, 1000),
        (4000, 8192, 1, 230),
        (20000, 65536, 2, 1000),
        (6000, 12288, 1, 320),
    ]
    rows = []
    for i in range(count):
        cpu, mem, num, milli = kinds[i % len(kinds)]
        rows.append(f"pod-{i:04d},{cpu},{mem},{num},{milli},,LS,Running,0,,")
    return rows


def write_csv(path: Path, header: str, rows: Sequence[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path
