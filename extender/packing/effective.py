"""Kubernetes' effective-request rule, the one place it is written.

A pod's containers do not all run at once: init containers run one at a time, in order, before
the app containers; a restartable init container (a sidecar, `restartPolicy: Always`) starts in
init order and keeps running beside every later init container and the app containers. So the
pod needs, per resource, the largest of

- each init container plus the sidecars started before it (a sidecar counts itself), and
- the app containers plus every sidecar.

Shares (threads, memory, clients), whole GPUs, CPU, memory and device-plugin GPUs are all
combined by `effective`: the webhook, the ledger and the simulator cannot disagree on a pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Role(Enum):
    """How a container runs within its pod."""

    APP = "app"
    INIT = "init"
    SIDECAR = "sidecar"


def role_of(*, init: bool, sidecar: bool) -> Role:
    """The role of a container listed under `initContainers` (`init`) and restartable
    (`sidecar`, which implies `init`)."""
    if sidecar:
        return Role.SIDECAR
    return Role.INIT if init else Role.APP


def effective(parts: Iterable[tuple[Role, tuple[int, ...]]], width: int) -> tuple[int, ...]:
    """The pod's effective request, per resource, from each container's role and load (a tuple
    of `width` figures). Init containers and sidecars must come in their `initContainers`
    order; where app containers come does not matter."""
    app = [0] * width
    sidecars = [0] * width
    peak = [0] * width
    for role, load in parts:
        if role is Role.APP:
            for i in range(width):
                app[i] += load[i]
        elif role is Role.SIDECAR:
            for i in range(width):
                sidecars[i] += load[i]
                peak[i] = max(peak[i], sidecars[i])
        else:
            for i in range(width):
                peak[i] = max(peak[i], sidecars[i] + load[i])
    return tuple(max(app[i] + sidecars[i], peak[i]) for i in range(width))
