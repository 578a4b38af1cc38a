"""mpsched's default policy: FGD's descent on a fragmentation measure that also looks ahead,
filling each node with the typical mix of pods; and `typefill`, the same descent looking ahead
one typical pod type at a time (the default until the mix measure replaced it).

Why. On the FGD paper's openb trace, FGD stalls at 95.2 % GPU allocation. At saturation its free
GPU is 190m slivers beside 810m shares (unavoidable: few pods fit there), other slivers, and
whole GPUs on nodes whose CPU has run out. FGD's measure asks only "can a typical pod use this
idle GPU right now"; CPU that is still there now but will be gone after a few more pods is
invisible to it, and so is a leftover that typical sizes will not fill.

What. The same descent (`FgdPolicy`: score = int(100 * sigmoid(ΔF / 1 GPU)), ties to a random
node order) on F = Σ_m w_km * ((1 - w) * F_n(m) + w * X_n(m)), w = `PolicySettings.lookahead`
(0.3), where X is a look-ahead (frag.py):
- default, X = M, the mix look-ahead: the GPU still idle after every GPU of the node keeps
  receiving pods drawn from the typical mix until none fits, with each type's CPU limit. A
  partly used GPU is not lost to whole-GPU types (shares will fill it), and a share's remainder
  counts only as far as typical sizes cannot fill it: a 190m sliver beside an 810m share stays
  nearly all idle, a 530m one beside a 470m share does not;
- `typefill`, X = L: the GPU still idle after the node takes as many pods of type m as fit, by
  GPU room and by CPU, one type at a time. L sees stranded CPU (a 32-core CPU-only pod on an idle
  8-GPU, 96-core node leaves 11-core GPU pods only 5 of its 8 GPUs) but counts every partly used
  GPU as lost to whole-GPU types.

Where typical pods go. FGD weighs type m by its popularity p_m on every node; w_km is instead
the rate at which m's pods are expected on a node of type k (GPU model, GPU count), from which
node types can host m and how much of them the more constrained types take first
(scarcity.py). A type pinned to other models counts 0 on the node (FGD counts all the node's
idle GPU as fragment for it, which draws unpinned pods onto the small models their pinned
pods need); a type pinned to a small model counts many times its popularity there, so other
pods leave those nodes to it. With no pinned or oversized types w_km = p_m: FGD's weighting.

Evidence (scripts/bench-quality; GPU allocated at arrived = 100 %, same workloads and tie
orders, paired; ± is the s.e.).
- openb default trace: default (M) 95.88, typefill (L) 95.62, FGD 95.24 over seeds 42-51;
  default - typefill +0.255 ± 0.029 there and +0.260 ± 0.017 on fresh seeds 52-71; default -
  FGD +0.633 ± 0.034 (42-51), +0.616 ± 0.033 (52-71). The gain is in where shares go: at 100 %
  the slivers other than the 810m ones fall from 77 to 68 GPUs (seeds 42-45), and no whole GPU
  is left on a CPU-exhausted node.
- Synthetic held-out mixes on the same cluster (extender.simulate.synthetic, generator seed 1,
  replay seeds 1-20), default - FGD / default - typefill: CPU-bound with other share sizes
  +1.670 ± 0.026 / -0.238 ± 0.027; small shares +0.004 / +0.002; uniform sizes +0.099 / +0.010;
  whole-GPU-heavy -0.022 / -0.002. Generator seed 2, replay seeds 1-6: CPU-bound +1.82 / -0.12,
  whole-GPU-heavy +0.036 / 0.000.
- Model-pinned mixes (CPU-bound sizes, `--pin`, in proportion to each model's GPUs; seeds 1-20),
  default - FGD / default - typefill: 10 % pinned +1.511 ± 0.045 / -0.057 ± 0.016, 20 % +1.363 ±
  0.059 / -0.084 ± 0.022, 33 % +1.734 ± 0.068 / -0.146 ± 0.024, 33 % skewed to small models
  +1.902 ± 0.061 / -0.336 ± 0.033. (Without the arrival weights the per-type measure lost 0.2 ±
  0.03 pp to FGD on the 20 % mix.)

The cost of M, and when to choose typefill. Where CPU runs out before GPU and multi-GPU pods
are common (the CPU-bound and pinned mixes above), M leaves more whole GPUs on CPU-exhausted
nodes and more 2-8-GPU pods fail than L does (the 95 % typical workload has no multi-GPU type
on either trace, so neither measure sees them; without the CPU-bound mix's multi-GPU pods the
loss is 0.09 ± 0.02). It still beats FGD there by 1.4-1.9 pp. Variants that did not remove the
loss (openb seeds 42-51 / CPU-bound seeds 1-10, against L): the mix's own expected CPU as the
limit (+0.24 to +0.26 / -0.22 to -0.28), including CPU-only pods in that CPU (about -1.6 on
CPU-bound), the mix only for share types (+0.03 on openb), only for whole-GPU types (+0.22 /
-0.25), whole GPUs valued exactly with only partly used GPUs credited (+0.14 / -0.28), the mix
only where the node has the CPU to feed it (+0.18 / -0.23), the mix after one type's fill
(+0.18 / -1.7), the mean or the maximum of L and M (+0.06 / -0.17, +0.02 / -0.16), filling
until the first pod that does not fit (-0.05 / -0.91); M for whole-GPU and CPU-only pods with L
for shares gains +0.10 ± 0.02 on CPU-bound but loses 0.03 on openb and 0.03-0.27 on the
pinned mixes.

Cost: one seed of the openb trace in about 1.6 s (typefill 1.9 s); /prioritize per node 11.5 us
cold and 2.5 us warm (typefill 18.4 and 3.3; scripts/bench_policy.py).
"""

from __future__ import annotations

from extender.packing.policies.base import Workload
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.policies.scarcity import NodeTypes
from extender.packing.policies.settings import PolicySettings


def default_policy(
    workload: Workload, settings: PolicySettings, types: NodeTypes = ()
) -> FgdPolicy:
    """The default policy for this workload on a cluster of these node types: the mix
    look-ahead M (raises ValueError for a bad look-ahead weight)."""
    return FgdPolicy(workload, name="default", lookahead=settings.lookahead, types=types, mix=True)


def typefill_policy(
    workload: Workload, settings: PolicySettings, types: NodeTypes = ()
) -> FgdPolicy:
    """The earlier default: the same descent with the per-type look-ahead L (frag.py). Kept
    for clusters where CPU runs out before GPU and multi-GPU pods are common (see Evidence)."""
    return FgdPolicy(workload, name="typefill", lookahead=settings.lookahead, types=types)
