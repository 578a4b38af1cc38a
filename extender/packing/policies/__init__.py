"""Node scoring policies for the packing core: the API (`NodeState`, `PodShape`, `Policy`,
`make_policy`), the FGD paper's baselines and mpsched's default policy. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from extender.packing.policies.base import (
    WHOLE,
    NodeState,
    PodShape,
    Policy,
    TypicalPod,
    Workload,
    canonical,
    fits,
    share_candidates,
)
from extender.packing.policies.bestfit import BestFitPolicy, SpreadPolicy
from extender.packing.policies.default import default_policy, typefill_policy
from extender.packing.policies.fgd import FgdPolicy
from extender.packing.policies.scarcity import NodeType, NodeTypes, node_types
from extender.packing.policies.settings import PolicySettings
from extender.packing.policies.workload import all_shapes, typical_workload

_FACTORIES: Mapping[str, Callable[[Workload, PolicySettings, NodeTypes, Workload], Policy]] = (
    MappingProxyType(
        {
            "default": default_policy,
            "fgd": lambda w, s, t, d: FgdPolicy(w),
            "bestfit": lambda w, s, t, d: BestFitPolicy(),
            "spread": lambda w, s, t, d: SpreadPolicy(),
            "typefill": typefill_policy,
        }
    )
)

#: Every policy name `make_policy` accepts.
POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_policy(
    name: str,
    *,
    workload: Workload,
    settings: PolicySettings,
    types: NodeTypes = (),
    demand: Workload = (),
) -> Policy:
    """Build the named policy for this workload on a cluster of these node types (the default
    policy weighs task types by where they can go, and how much of each node type pinned pods
    need by `demand`, every shape seen: `all_shapes`; the paper's baselines ignore both);
    raise ValueError naming the known policies."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return factory(workload, settings, types, demand)


__all__ = [
    "POLICY_NAMES",
    "WHOLE",
    "NodeState",
    "NodeType",
    "NodeTypes",
    "PodShape",
    "Policy",
    "PolicySettings",
    "TypicalPod",
    "Workload",
    "all_shapes",
    "canonical",
    "fits",
    "make_policy",
    "node_types",
    "share_candidates",
    "typical_workload",
]
