"""mpsched's default policy: FGD's descent on a fragmentation measure that also looks ahead,
filling each node with the typical mix of pods that may run there; and `typefill`, the same
descent looking ahead one typical pod type at a time (the default before the mix measure).

Why. FGD's measure asks only "can a typical pod use this idle GPU right now". CPU that will be
gone after a few more pods is invisible to it, and so is a leftover that typical sizes will not
fill (a 190m sliver beside an 810m share); at saturation that is most of what FGD leaves idle.

What. The same descent (`FgdPolicy`: score = int(100 * sigmoid(ΔF / 1 GPU)), ties to a random
node order) on F = Σ_m p_m * ((1 - w) * F_n(m) + w * X_n(m)), w = `PolicySettings.lookahead`,
p_m the popularities as in FGD, X a look-ahead (frag.py): the mix look-ahead M for `default`
(every GPU keeps receiving pods drawn from the typical mix the node can host, until none
fits), the per-type fill L for `typefill`.

Where pods are pinned to GPU models. On a node type that pinned pods may use, the look-ahead
gives way to FGD's measure as far as they need it (none where they alone would fill it; every
shape seen counts there, since the typical workload's cut drops the rare pinned shapes), and
FGD's score bounds the rest: no uncontested node scores below it, no contested one above
(scarcity.py says why: the look-ahead can otherwise outweigh FGD's weak pull that keeps
unpinned pods off the pinned models' nodes). A node type the pinned pods alone would
fill is the last place for a pod that may run elsewhere. Without pinned types both policies
look ahead on every node. The evidence, and how to regenerate it, is in docs/packing-quality.md.
"""

from __future__ import annotations

from extender.packing.policies.base import Workload
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.policies.scarcity import NodeTypes
from extender.packing.policies.settings import PolicySettings


def default_policy(
    workload: Workload, settings: PolicySettings, types: NodeTypes = (), demand: Workload = ()
) -> FgdPolicy:
    """The default policy for this workload on a cluster of these node types, pinned loads from
    `demand` (every shape seen; () takes the workload's): the mix look-ahead M (raises
    ValueError for a bad look-ahead weight)."""
    return FgdPolicy(
        workload,
        name="default",
        lookahead=settings.lookahead,
        types=types,
        mix=True,
        demand=demand,
    )


def typefill_policy(
    workload: Workload, settings: PolicySettings, types: NodeTypes = (), demand: Workload = ()
) -> FgdPolicy:
    """The earlier default: the same descent with the per-type look-ahead L (frag.py). Kept
    for clusters where CPU runs out before GPU and multi-GPU pods are common (it packs those
    slightly better: docs/packing-quality.md)."""
    return FgdPolicy(
        workload, name="typefill", lookahead=settings.lookahead, types=types, demand=demand
    )
