"""Which task types each node type can host, and how much of each node type pinned pods need.

A pod that names GPU models (`gpu_spec`, one model or a set) can only land on nodes of those
models; the others may go anywhere. The default policy's look-ahead (frag.py) fills a node with
the typical pods that may run there (`can_host`), and weighs the look-ahead on a node type
down as pinned pods need it (`pinned_load`: the share of its GPUs the pinned pods that may use
it would take; at 1 or more, FGD's measure alone). The loads count every pod shape seen, not
only the typical ones: the typical cut drops the rarest shapes, and pinned shapes, each split
over the models it names, are rarer than the unpinned ones, so the typical set alone says the
pinned models are needed less than they are.

Why. Unpinned pods should leave the pinned models' GPUs to the pods that have nowhere else to
go. FGD does that only weakly: a type pinned elsewhere counts every idle GPU of a node as
fragment, so taking GPU there lowers its measure a little, while on the nodes the pinned type
may use the same pod changes nothing for it. The pull is worth about a point of FGD's integer
score; any systematic change to the score (a look-ahead, a weighting by node type, even a
tie-break) can outweigh it and send unpinned pods onto the pinned models. So the look-ahead
gives way to FGD's measure on a node type as far as pinned pods need it, and where some node
type is contested (`contested`: a pinned type may use it) FGD's score bounds the others
(`FgdPolicy`): an uncontested node scores no lower than FGD scores it, a contested one no
higher. So for any pod the look-ahead never makes a contested node more attractive against
an uncontested one than FGD does: pinned capacity is kept at least as well as FGD keeps it.
A node type the pinned pods alone are expected to fill (pinned load 1 or more:
`Fragmentation.reserved`) is the last place for a pod that some other node type can host:
there every GPU or core such a pod takes is one a pinned pod with nowhere else to go will
miss, while FGD still sends it there whenever that fills a GPU exactly, and bounds on each
decision cannot stop the run from offering such slots later. Where no typical type is
pinned, the look-ahead runs everywhere, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from extender.packing.policies.base import WHOLE, PodShape, Workload


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


def pinned_load(node: NodeType, workload: Workload, types: NodeTypes) -> float:
    """The share of the node type's GPUs that the pinned types of `workload` (every shape
    seen, `all_shapes`) which may use it would take, each with its expected demand spread over
    all the node types that can host it: the workload's GPU demand scaled to the cluster's GPUs
    (the cluster filling up), each type's share by popularity times GPU ask. 0 where no pinned
    type may use the node type."""
    capacity = [t.capacity * WHOLE for t in types]
    mean_ask = sum(tp.popularity * _gpu_ask(tp.shape) for tp in workload)
    if mean_ask <= 0.0:
        return 0.0
    load = 0.0
    for tp in workload:
        if not (pinned(tp.shape, types) and can_host(node, tp.shape)):
            continue
        hosts = sum(c for t, c in zip(types, capacity, strict=True) if can_host(t, tp.shape))
        if hosts <= 0:
            continue  # `node` is not one of `types`: nothing to spread the demand over
        demand = sum(capacity) * tp.popularity * _gpu_ask(tp.shape) / mean_ask
        load += demand / hosts
    return load


def _gpu_ask(task: PodShape) -> int:
    return min(task.threads, WHOLE) * task.gpus if task.threads else 0


def contested(node: NodeType, workload: Workload, types: NodeTypes) -> bool:
    """Some pinned GPU task type of the workload may use this node type: its pinned load is
    above 0 (the rule the look-ahead policies bound their scores by)."""
    return pinned_load(node, workload, types) > 0.0


def pinned(task: PodShape, types: NodeTypes) -> bool:
    """A GPU task type whose allowed models leave out a node type that could host it."""
    if not task.models or task.gpus == 0 or task.threads == 0:
        return False
    anywhere = replace(task, models=frozenset())
    return any(can_host(t, anywhere) and not task.allows(t.model) for t in types)
