"""Clusters of any size for a capacity search: the given node pool scaled with its mix kept, or
a count of one node type; and the search for the smallest size that hosts a workload.

Scaling keeps the mix by node type (GPU model, GPU count, CPU, memory): the pool is put in an
order in which every prefix holds each type as close to its share of the pool as whole nodes
allow (the Sainte-Laguë sequence: the next node is of the type with the largest
count / (2 × taken + 1), ties to the type seen first in the file), and a cluster of size n is
the first n nodes of that order. A larger cluster contains a smaller one, so the search moves
over one axis. Past the pool's own size the order goes on with copies (`NAME~2`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from extender.config_gpus import GpuModel
from extender.packing.model import NodeInventory
from extender.packing.settings import BudgetSettings
from extender.simulate.trace import model_gpus
from extender.simulate.types import SimNode


class PoolError(ValueError):
    """A node type spec cannot be read; the message names it."""


def type_key(node: SimNode) -> tuple[str, int, int, int]:
    return (node.model, len(node.inventory.gpus), node.cpu_milli, node.memory_mib)


def scaled_order(nodes: Sequence[SimNode], size: int) -> list[SimNode]:
    """The first `size` nodes of the pool's mix-keeping order (module docstring)."""
    members: dict[tuple[str, int, int, int], list[SimNode]] = {}
    for node in nodes:
        members.setdefault(type_key(node), []).append(node)
    kinds = list(members.values())
    taken = [0] * len(kinds)
    out: list[SimNode] = []
    while len(out) < size and kinds:
        best = max(range(len(kinds)), key=lambda k: (len(kinds[k]) / (2 * taken[k] + 1), -k))
        group = kinds[best]
        j = taken[best]
        taken[best] += 1
        node = group[j % len(group)]
        out.append(
            node if j < len(group) else copy_node(node, f"{node.name}~{j // len(group) + 1}")
        )
    return out


def copy_node(node: SimNode, name: str) -> SimNode:
    """The node under another name (its GPUs with UUIDs of that name)."""
    gpus = tuple(replace(g, uuid=f"GPU-{name}-{g.index}") for g in node.inventory.gpus)
    return SimNode(
        name, node.cpu_milli, node.memory_mib, replace(node.inventory, name=name, gpus=gpus)
    )


def copies(template: SimNode, count: int, *, prefix: str = "") -> list[SimNode]:
    """`count` nodes of the template's type, named PREFIX-1..count (prefix: the type's name)."""
    base = prefix or template.name
    return [copy_node(template, f"{base}-{i}") for i in range(1, count + 1)]


def gpu_count(nodes: Sequence[SimNode]) -> int:
    return sum(len(n.inventory.gpus) for n in nodes)


def parse_node_type(
    spec: str, pool: Sequence[SimNode], models: Mapping[str, GpuModel], *, budgets: BudgetSettings
) -> SimNode:
    """A node type: the name of a node of `pool` (more like it), or
    `MODEL:GPUS[:CPU_MILLI:MEMORY_MIB]`: without CPU and memory, those of the most common node
    of that model and GPU count in `pool`; the model's GPU facts from the configuration's
    gpuModels. Raises PoolError."""
    for node in pool:
        if node.name == spec.strip():
            return node
    parts = [p.strip() for p in spec.split(":")]
    if len(parts) not in (2, 4) or not all(p.isdigit() for p in parts[1:]) or not parts[0]:
        raise PoolError(
            f"{spec!r}: expected MODEL:GPUS, MODEL:GPUS:CPU_MILLI:MEMORY_MIB (e.g. G2:8) or the "
            "name of a node"
        )
    model, gpus = parts[0], int(parts[1])
    spec_model = models.get(model)
    if spec_model is None:
        raise PoolError(
            f"{spec!r}: unknown GPU model {model!r}: describe it under gpuModels in --config "
            f"(known: {', '.join(sorted(models)) or 'none'})"
        )
    if gpus < 1:
        raise PoolError(f"{spec!r}: a node type needs at least one GPU")
    if len(parts) == 4:
        cpu, memory = int(parts[2]), int(parts[3])
    else:
        alike = [n for n in pool if n.model == model and len(n.inventory.gpus) == gpus]
        if not alike:
            raise PoolError(
                f"{spec!r}: no {gpus}-GPU {model} node in the pool to take CPU and memory from; "
                "give them: MODEL:GPUS:CPU_MILLI:MEMORY_MIB"
            )
        counts: dict[tuple[int, int], int] = {}
        for n in alike:
            counts[(n.cpu_milli, n.memory_mib)] = counts.get((n.cpu_milli, n.memory_mib), 0) + 1
        cpu, memory = max(counts, key=lambda k: (counts[k], k))
    name = f"{model}x{gpus}"
    infos = model_gpus(name, model, spec_model, gpus, budgets=budgets)
    inventory = NodeInventory(name, infos, cpu_milli=cpu, memory_mib=memory)
    return SimNode(name, cpu, memory, inventory)


@dataclass(frozen=True, slots=True)
class Found:
    """The search's result: the smallest size that hosted (None: not even `limit`), and every
    size tried with its answer."""

    size: int | None
    tried: dict[int, bool]


def smallest(hosts: Callable[[int], bool], *, start: int, limit: int, below: bool) -> Found:
    """The smallest size in 1..limit for which `hosts` is true, taking it as monotone (a size
    that hosts means every larger one does). Starts at `start`; looks below it only where
    `below` (the start is a lower bound when no pod may wait). Galloping, then bisection."""
    tried: dict[int, bool] = {}

    def test(size: int) -> bool:
        if size not in tried:
            tried[size] = hosts(size)
        return tried[size]

    start = max(1, min(start, limit))
    if test(start):
        hi, lo, step = start, start - 1 if not below else 0, 1
        while below and hi - step >= 1:
            if test(hi - step):
                hi -= step
                step *= 2
            else:
                lo = hi - step
                break
        lo = max(lo, 0)
    else:
        lo, step = start, 1
        while True:
            probe = min(limit, lo + step)
            if probe == lo:
                return Found(None, tried)
            if test(probe):
                hi = probe
                break
            lo, step = probe, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid
    return Found(hi, tried)
