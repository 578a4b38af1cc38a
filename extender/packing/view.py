"""What a scoring policy is shown: a node's `NodeState` read from the ledger and a pod's
`PodShape`. `serve` (the evaluator) and `simulate` (the replay engine, the trace and dump
readers) build both with these functions only, so that a simulated cluster ranks nodes as the
extender would (docs/design.md, Architecture).

Owns three rules:

- **a GPU's free share** (`gpu_free`): the thread percent a new share could still use there,
  the one number per GPU that policies count in, read off the share fit (`ledger.share_cause`);
- **a pod's shape** (`pod_shape`): its CPU, its per-GPU thread percent and its GPU count, with
  the GPU the thread share is taken on chosen by the caller (see there why it varies);
- **a share's GPU** (`share_gpu`): the policy's choice, else the tightest candidate.

Pure: no I/O. `gpu_free` runs once per GPU of a node whose usage changed, never per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.packing.ledger import Allocation, GpuUsage, NodeUsage, share_cause
from extender.packing.policies import WHOLE, NodeState, PodShape
from extender.packing.request import ShareRequest, proportional_memory


def gpu_free(g: GpuUsage, *, proportional: bool) -> int:
    """Free thread percent of `g` for new work, 0..100: by the share fit
    (`ledger.share_cause`), the largest t below 100 for which a share of t % threads and one
    MPS client fits, with the pinned memory of t % (`request.proportional_memory`) when memory
    follows threads (`proportional`), else none; UIDs aside (a policy counts in thread percent
    only). 0 where none fits (given out whole, unshareable, no client slot or memory left).

    An idle GPU reads 100, whatever its MPS state: it can at least be given out whole. A GPU
    that holds a share reads at most 99: it is never a whole GPU to a policy (with
    oversubscription, or shares of 0 % threads, its free threads can reach 100 and more).
    """
    if g.idle:
        return WHOLE
    cap = g.capacity
    top = min(cap.threads - g.threads, WHOLE - 1)
    # Whether more threads fit is monotone (a larger share pins no less memory): the free
    # threads themselves nearly always fit; where memory does not hold them, a bisection.
    if top < 0:
        return 0
    if _fits(g, top, proportional=proportional):
        return top
    if not _fits(g, 0, proportional=proportional):
        return 0
    low, high = 0, top  # fits at low, not at high
    while high - low > 1:
        mid = (low + high) // 2
        if _fits(g, mid, proportional=proportional):
            low = mid
        else:
            high = mid
    return low


def _fits(g: GpuUsage, threads: int, *, proportional: bool) -> bool:
    """A share of `threads` % and one client, UIDs aside, fits `g` (`gpu_free`)."""
    memory = proportional_memory(g.capacity.memory_mib, threads) if proportional else 0
    cause = share_cause(g, threads, memory, 1, None, multi_user=True, uid_isolation=False)
    return cause is None


def node_state(usage: NodeUsage, cpu_free: int, *, proportional: bool) -> NodeState:
    """The policy's view of a node: its model (the first GPU's), free CPU, and `gpu_free` per
    GPU in index order."""
    model = usage.gpus[0].info.model if usage.gpus else ""
    free = tuple(gpu_free(g, proportional=proportional) for g in usage.gpus)
    return NodeState(model, cpu_free, free)


def pod_shape(
    request: ShareRequest | Allocation,
    cpu_milli: int,
    *,
    threads: int,
    models: frozenset[str] = frozenset(),
) -> PodShape:
    """The policy's view of a pod, from its request (or its allocation once placed): CPU only
    (0 threads on 0 GPUs), k whole GPUs (100 on k), or a share of one GPU with `threads` percent
    kept within 1..100 (a 100 % share takes all of a GPU, so the policy treats it as whole; an
    ask of 0 % threads still takes a share).

    `threads` is the share's thread percent *on the GPU it is taken on*, which the caller picks,
    because an ask in memory or units is a different share on each GPU model (8 GiB is 10 % of
    an H100 and half of a T4) and a policy sees one number:

    - scoring a node (the extender's evaluator, the replay engine): the demand on that node's
      GPU, from the fit (`Fit.demands`), so that each node is scored for what the pod takes
      there;
    - sizing a pod for a replay (tuning target, reports, learned workload, and the engine's
      grouped cache, which takes only asks that are the same share on every GPU): its demand on
      the cluster's largest GPU;
    - a placed pod: its allocation's threads; a trace pod: its gpu_milli / 10; a pending pod
      for the learned workload: its written asks (`objects.observed_shape`).

    `threads` is ignored for CPU-only and whole-GPU pods."""
    if request.kind == "none":
        return PodShape(cpu_milli, 0, 0, models)
    if request.kind == "whole":
        gpus = request.whole_gpus if isinstance(request, ShareRequest) else len(request.gpus)
        return PodShape(cpu_milli, WHOLE, gpus, models)
    return PodShape(cpu_milli, min(WHOLE, max(1, threads)), 1, models)


def share_gpu(node: NodeState, candidates: Sequence[int], chosen: int | None) -> int:
    """The GPU a share goes to: the policy's choice, or where the policy made none (it treats a
    100 % share as a whole GPU and names no GPU for those) the tightest candidate, the lowest
    index on ties."""
    if chosen is not None and chosen in candidates:
        return chosen
    # A loop, not min() with a key lambda: compiled, a function holding a lambda builds its
    # closure on every call, and every fill calls this.
    free = node.gpu_free
    best = candidates[0]
    for i in candidates:
        if free[i] < free[best] or (free[i] == free[best] and i < best):
            best = i
    return best
