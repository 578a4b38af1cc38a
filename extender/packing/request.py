"""What a pod asks for: per-container share asks, the pod-level request, and its concrete demand
on one particular GPU (threads %, pinned MiB, clients) after units and proportional rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from extender.packing.effective import effective, role_of
from extender.packing.model import GpuInfo
from extender.packing.settings import BudgetSettings

RequestKind = Literal["none", "share", "whole"]


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One container's `mpsched.io/*` ask, as written (None = not asked)."""

    name: str
    #: An init container: runs before the app containers (in the order of this tuple).
    init: bool = False
    #: A restartable init container (`restartPolicy: Always`): started in init order and then
    #: kept running beside the app containers. Implies `init`.
    sidecar: bool = False
    threads: int | None = None
    memory_mib: int | None = None
    units: int | None = None
    gpus: int | None = None
    clients: int = 1

    @property
    def asks_share(self) -> bool:
        return self.threads is not None or self.memory_mib is not None or self.units is not None


@dataclass(frozen=True, slots=True)
class Demand:
    """A concrete load on one GPU."""

    threads: int
    memory_mib: int
    clients: int


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """One container's part of an allocation, for the env vars the webhook wires in."""

    name: str
    threads: int
    memory_mib: int
    clients: int


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """A pod's whole GPU request. `kind` says which budget applies:
    "share" → one GPU shared through MPS, "whole" → `whole_gpus` GPUs exclusively, "none"."""

    namespace: str
    name: str
    pod_uid: str
    kind: RequestKind
    containers: tuple[ContainerAsk, ...] = ()
    whole_gpus: int = 0
    #: Effective runAsUser of the share containers (None: the image's user, treated as one UID).
    run_as_user: int | None = None
    priority: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _container_demand(ask: ContainerAsk, gpu: GpuInfo, budgets: BudgetSettings) -> ContainerDemand:
    base = max(0, gpu.memory_mib - budgets.memory_reserve_mib)
    threads: int
    memory: int
    if ask.units is not None:
        units = max(1, gpu.units)
        threads = (100 * ask.units) // units
        memory = (base * ask.units) // units
    elif ask.threads is not None and ask.memory_mib is not None:
        threads, memory = ask.threads, ask.memory_mib
    elif ask.threads is not None:
        threads = ask.threads
        memory = proportional_memory(base, threads) if budgets.proportional else 0
    else:
        # Round the derived thread share up: a pod that pins 1/3 of the memory needs at least
        # 1/3 of the SMs to be worth placing there.
        memory = ask.memory_mib or 0
        threads = -(-100 * memory // base) if budgets.proportional and base else 0
    clients = ask.clients if ask.asks_share else 0
    return ContainerDemand(ask.name, threads, memory, clients)


def proportional_memory(pinnable_mib: int, threads: int) -> int:
    """The pinned memory a share of `threads` % takes where memory follows threads, on a GPU
    with `pinnable_mib` MiB pinnable. Rounded down, so that shares summing to 100 % never
    exceed it."""
    return (pinnable_mib * threads) // 100


def container_demands(
    request: ShareRequest, gpu: GpuInfo, budgets: BudgetSettings
) -> tuple[ContainerDemand, ...]:
    """Per-container demands on `gpu`, app containers then init containers."""
    return tuple(_container_demand(a, gpu, budgets) for a in request.containers if a.asks_share)


def demand_on(request: ShareRequest, gpu: GpuInfo, budgets: BudgetSettings) -> Demand:
    """The pod's effective demand on `gpu`: its share containers' demands combined by
    Kubernetes' effective-request rule (`effective.effective`), per resource."""
    threads, memory, clients = effective(
        (
            (role_of(init=ask.init, sidecar=ask.sidecar), _load(ask, gpu, budgets))
            for ask in request.containers
            if ask.asks_share
        ),
        3,
    )
    return Demand(threads, memory, clients)


def _load(ask: ContainerAsk, gpu: GpuInfo, budgets: BudgetSettings) -> tuple[int, int, int]:
    d = _container_demand(ask, gpu, budgets)
    return (d.threads, d.memory_mib, d.clients)
