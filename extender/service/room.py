"""`room_for`: the GPUs where a pod asking for a share would fit now, as filter decides it:
the same parse (`PodParser`, with the cluster's limits) and the same fit (`fit_node`, the
packing core's one rule) over every node of the ledger, for a pod made up from the ask.

Owns the made-up pod (`probe_pod`). It asks through the same resources a real pod would, in
one container, with the `runAsUser` given: where UID isolation is on it fits the GPUs whose MPS
server runs as that user (or none yet); without one its user is unknown, and an unknown user
shares no GPU with anybody, exactly as filter decides for such a pod. Nodes are taken a batch
at a time, yielding to the loop between batches, so a large cluster's answer never stalls
filter calls.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from extender.packing.fit import Fit, ShapeDemands, fit_node
from extender.packing.podspec import CLIENTS, MEMORY, THREADS
from extender.packing.state import DecisionState
from extender.service.status import STATUS_BATCH

#: The made-up pod's name (it never exists in the cluster; no uid, so it is never cached).
PROBE_NAME: Final = "mpsched-room-probe"


class AskError(ValueError):
    """The ask is not one a pod could make (the parser's reason, or no share asked)."""


def probe_pod(
    *,
    threads: str | None,
    memory: str | None,
    clients: str | None,
    namespace: str,
    user: int | None = None,
) -> dict[str, Any]:
    """A pending pod asking for `threads` (percent), `memory` (a quantity: "8Gi", "4096Mi")
    and `clients`, each left out when None: its resources are the ask as written, so that the
    parser judges them exactly as it judges a real pod's."""
    limits = {
        key: value
        for key, value in ((THREADS, threads), (MEMORY, memory), (CLIENTS, clients))
        if value is not None
    }
    spec: dict[str, Any] = {"containers": [{"name": "probe", "resources": {"limits": limits}}]}
    if user is not None:
        spec["securityContext"] = {"runAsUser": user}
    return {"metadata": {"namespace": namespace, "name": PROBE_NAME}, "spec": spec}


async def room_for(
    state: DecisionState, pod: dict[str, Any], *, batch: int = STATUS_BATCH * 4
) -> dict[str, Any]:
    """`{"nodes": [{"node": str, "gpus": [int]}]}`: every node where `pod` fits now and, on
    each, the GPUs that can take it (the candidates filter's fit finds; the policy then picks
    one). Raises AskError for an ask no pod could make or one that asks for no share."""
    parsed = state.parser.parse(pod)
    if parsed.demand is None:
        raise AskError(parsed.error or "invalid request")
    request = parsed.demand.request
    if request.kind != "share":
        raise AskError(f"ask for {THREADS} or {MEMORY}: this ask is for no GPU share")
    budgets = state.settings.budgets
    ledger = state.ledger
    shapes: ShapeDemands = {}
    nodes: list[dict[str, Any]] = []
    names = sorted(ledger.node_names())
    for i in range(0, len(names), batch):
        for name in names[i : i + batch]:
            usage = ledger.get_node(name)
            if usage is None:
                continue
            fit = fit_node(usage, request, budgets, shapes=shapes)
            if isinstance(fit, Fit):
                nodes.append({"node": name, "gpus": list(fit.gpus)})
        await asyncio.sleep(0)
    return {"nodes": nodes}
