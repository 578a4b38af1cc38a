"""The sharing strategies a capacity plan compares, each a rewrite of the pods' GPU requests in
front of one and the same placement (the replay engine, the packing core's fit and a policy):

- `whole`: no sharing. A share of a GPU becomes one whole GPU.
- `equal:N`: the equal split of NVIDIA's and GKE's MPS sharing: every GPU is cut into N equal
  units, and a share takes the fewest units that cover it, k = ceil(share × N). Its threads and
  its pinned memory are then both k/N of the GPU (a share of 100·k//N % threads, memory
  following in proportion, which is the same budget the core books for a `units: k` ask on a
  GPU of N units), its client limit the GPU's own (48 from Volta on, 16 before). k = N is a
  whole GPU.
- mpsched: the request as asked, placed by one of mpsched's policies.

Whole and equal pods are placed by `policy` (mpsched's default policy unless named, as
`whole@bestfit`), so that the strategies differ in what each pod takes and in nothing else.
CPU-only and whole-GPU pods are the same under every strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from extender.packing.policies import POLICY_NAMES, WHOLE
from extender.packing.request import ContainerAsk
from extender.packing.view import pod_shape
from extender.simulate.types import SimPod

StrategyKind = Literal["mpsched", "whole", "equal"]
#: The most units `equal:N` cuts a GPU into (one thread percent each).
MAX_UNITS = 100


class StrategyError(ValueError):
    """A strategy spec cannot be read; the message names it and what is allowed."""


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way of sharing GPUs: `kind`, units per GPU (equal only) and the scoring policy."""

    kind: StrategyKind
    policy: str
    units: int = 0

    @property
    def name(self) -> str:
        """As given on the command line: `whole`, `equal:4`, `fgd`; `@policy` where not the
        default one."""
        if self.kind == "mpsched":
            return self.policy
        base = "whole" if self.kind == "whole" else f"equal:{self.units}"
        return base if self.policy == "default" else f"{base}@{self.policy}"

    @property
    def is_mpsched(self) -> bool:
        return self.kind == "mpsched"

    def units_for(self, threads: int) -> int:
        """Units of `equal:N` a share of `threads` % takes: the fewest covering it."""
        return max(1, math.ceil(threads * self.units / WHOLE))

    def transform(self, pod: SimPod) -> SimPod:
        """The pod as this strategy asks for it (unchanged unless it is a share)."""
        if self.kind == "mpsched" or not pod.shape.is_share:
            return pod
        threads = pod.shape.threads
        if self.kind == "equal":
            k = self.units_for(threads)
            if k < self.units:
                share = (WHOLE * k) // self.units
                ask = ContainerAsk("main", threads=share)
                request = replace(pod.request, kind="share", containers=(ask,), whole_gpus=0)
                shape = pod_shape(request, pod.cpu_milli, threads=share, models=pod.shape.models)
                return replace(pod, request=request, shape=shape)
        request = replace(pod.request, kind="whole", containers=(), whole_gpus=1)
        shape = pod_shape(request, pod.cpu_milli, threads=WHOLE, models=pod.shape.models)
        return replace(pod, request=request, shape=shape)


def parse_strategy(text: str, *, default_policy: str = "default") -> Strategy:
    """`whole`, `equal:N` (1 <= N <= 100), a policy name, each of the first two optionally
    `@POLICY`. Raises StrategyError."""
    spec = text.strip()
    base, _, policy = spec.partition("@")
    policy = policy.strip() or default_policy
    if policy not in POLICY_NAMES:
        raise StrategyError(
            f"{spec!r}: unknown policy {policy!r}; known: {', '.join(POLICY_NAMES)}"
        )
    if base == "whole":
        return Strategy("whole", policy)
    if base.startswith("equal:"):
        count = base.removeprefix("equal:")
        if not count.isdigit() or not 1 <= int(count) <= MAX_UNITS:
            raise StrategyError(f"{spec!r}: equal:N needs a whole N from 1 to {MAX_UNITS}")
        return Strategy("equal", policy, int(count))
    if base in POLICY_NAMES and "@" not in spec:
        return Strategy("mpsched", base)
    raise StrategyError(
        f"{spec!r}: expected whole, equal:N or an mpsched policy "
        f"({', '.join(POLICY_NAMES)}); whole and equal:N may end in @POLICY"
    )


def parse_strategies(text: str) -> list[Strategy]:
    """A comma-separated list, duplicates dropped. Raises StrategyError."""
    out: list[Strategy] = []
    for part in text.split(","):
        if part.strip():
            strategy = parse_strategy(part)
            if strategy not in out:
                out.append(strategy)
    if not out:
        raise StrategyError(f"{text!r}: no strategy named")
    return out
