"""What the generated nodes and pods are drawn from: the GPU models (the node types), the zones,
namespaces, apps, images and users, the share shapes of running pods and the whole-GPU sizes; and
the seeded draws over them (a weighted pick, a UID). The nodes and pods themselves are built in
cluster.py, pods.py and realistic_pods.py."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class GpuModel:
    """One node type of the generated cluster: 8 identical GPUs (NVML's totals)."""

    key: str
    nvml_name: str
    memory_mib: int
    cc: str
    weight: float
    instance_type: str
    cpu: int
    memory_gi: int


MODELS: tuple[GpuModel, ...] = (
    GpuModel("h100", "NVIDIA H100 80GB HBM3", 81559, "9.0", 0.25, "p5.48xlarge", 192, 2048),
    GpuModel("a100-80", "NVIDIA A100-SXM4-80GB", 81920, "8.0", 0.20, "p4de.24xlarge", 96, 1152),
    GpuModel("a100-40", "NVIDIA A100-SXM4-40GB", 40960, "8.0", 0.20, "p4d.24xlarge", 96, 1152),
    GpuModel("l4", "NVIDIA L4", 23034, "8.9", 0.15, "g6.48xlarge", 192, 768),
    GpuModel("v100", "Tesla V100-SXM2-16GB", 16160, "7.0", 0.10, "p3.16xlarge", 64, 488),
    GpuModel("t4", "Tesla T4", 15360, "7.5", 0.10, "g4dn.metal", 96, 384),
)
GPUS_PER_NODE = 8
UNITS_PER_GPU = 4
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
NAMESPACES = ("ml-train", "ml-infer", "research", "batch", "recsys", "vision")
APPS = ("llm-serve", "embedder", "trainer", "notebook", "etl", "ranker", "detector", "asr")
IMAGES = (
    "nvcr.io/nvidia/pytorch:24.05-py3",
    "nvcr.io/nvidia/tritonserver:24.05-py3",
    "nvcr.io/nvidia/tensorflow:24.03-tf2-py3",
    "ghcr.io/example/llm-serve:1.8.2",
    "registry.example.com/research/notebook:2026.11",
)
#: Effective runAsUser of GPU pods: mostly one platform UID, some teams run their own.
USERS: tuple[tuple[int | None, float], ...] = ((1000, 0.7), (2000, 0.2), (None, 0.1))
#: Share shapes of running pods: (threads %, memory as a fraction of the GPU or None, weight).
SHARE_SHAPES: tuple[tuple[int | None, float | None, float], ...] = (
    (5, None, 0.15),
    (10, None, 0.20),
    (20, 0.15, 0.20),
    (25, None, 0.15),
    (30, 0.25, 0.10),
    (50, 0.45, 0.08),
    (None, 0.10, 0.07),  # memory-only: threads follow proportionally
    (None, None, 0.05),  # one share unit (units-style ask)
)
WHOLE_SIZES = (1, 2, 4, 8)


def weighted_pick(rng: random.Random, items: Sequence[tuple[T, float]]) -> T:
    return rng.choices([i for i, _ in items], weights=[w for _, w in items])[0]


def random_uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
