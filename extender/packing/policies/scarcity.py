"""Which task types each node type can host, and which node types pinned pods contend for.

A pod that names GPU models (`gpu_spec`, one model or a set) can only land on nodes of those
models; the others may go anywhere. The default policy's look-ahead (frag.py) fills a node with
the typical pods that may run there (`can_host`), and scores a node type that some pinned
typical type may use (`contested`) by FGD's own measure, without the look-ahead.

Why the contested rule. Unpinned pods should leave the pinned models' GPUs to the pods that
have nowhere else to go. FGD does that only weakly: a type pinned elsewhere counts every idle
GPU of a node as fragment, so taking GPU there lowers its measure a little, while on the nodes
the pinned type may use the same pod changes nothing for it. The pull is worth about a point
of FGD's integer score; any systematic change to the score (a look-ahead, a weighting by node
type, even a tie-break) can outweigh it and send unpinned pods onto the pinned models. So a
contested node type is scored by FGD's measure alone, and where some node type is contested
the others' scores are floored at FGD's (`FgdPolicy`): the look-ahead may make an uncontested
node more attractive than FGD finds it, never less, so it never moves a pod from an
uncontested node onto a contested one that FGD would not have chosen. Where no typical type is
pinned nothing is contested, and the look-ahead runs everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from extender.packing.policies.base import PodShape, Workload


@dataclass(frozen=True, slots=True)
class NodeType:
    """The nodes of one GPU model and GPU count: how many, and the most CPU one of them has."""

    model: str
    gpus: int
    #: Allocatable CPU (millicores) of the largest node of the type.
    cpu_milli: int
    #: Nodes of the type.
    count: int

    @property
    def key(self) -> tuple[str, int]:
        return self.model, self.gpus

    @property
    def capacity(self) -> int:
        """GPUs of all nodes of the type."""
        return self.gpus * self.count


#: The cluster as the policies see it, by (model, GPU count).
NodeTypes = tuple[NodeType, ...]


def node_types(nodes: Iterable[tuple[str, int, int | None]]) -> NodeTypes:
    """Group (model, GPU count, allocatable CPU or None) of each GPU node into node types, by
    (model, GPU count), ordered by key. Unknown CPU counts as unbounded (kube-scheduler
    checks CPU itself there); nodes without GPUs are left out."""
    cpu: dict[tuple[str, int], int] = {}
    count: dict[tuple[str, int], int] = {}
    for model, gpus, cpu_milli in nodes:
        if gpus <= 0:
            continue
        key = (model, gpus)
        c = UNBOUNDED_CPU if cpu_milli is None else cpu_milli
        cpu[key] = max(cpu.get(key, 0), c)
        count[key] = count.get(key, 0) + 1
    return tuple(NodeType(m, g, cpu[(m, g)], count[(m, g)]) for m, g in sorted(count))


#: CPU of a node whose allocatable CPU is unknown.
UNBOUNDED_CPU = 1 << 62


def can_host(node: NodeType, task: PodShape) -> bool:
    """An empty node of this type holds one pod of the task type (CPU, model, GPU count)."""
    if node.cpu_milli < task.cpu_milli:
        return False
    if task.gpus == 0 or task.threads == 0:
        return True
    return task.allows(node.model) and node.gpus >= task.gpus


def contested(node: NodeType, workload: Workload, types: NodeTypes) -> bool:
    """Some pinned GPU task type of the workload can run on this node type: one that names
    models and that the names keep off some node type that could host it otherwise."""
    return any(pinned(tp.shape, types) and can_host(node, tp.shape) for tp in workload)


def pinned(task: PodShape, types: NodeTypes) -> bool:
    """A GPU task type whose allowed models leave out a node type that could host it."""
    if not task.models or task.gpus == 0 or task.threads == 0:
        return False
    anywhere = replace(task, models=frozenset())
    return any(can_host(t, anywhere) and not task.allows(t.model) for t in types)
