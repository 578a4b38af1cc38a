"""Settings of the scoring policies: which one runs, and the knobs of the default policy.
`extender.config` builds this from the `policy:` section of the YAML document."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """The `policy:` section. Every field has a default that is right for most clusters."""

    #: Which policy scores nodes: one of POLICY_NAMES ("default", "fgd", "bestfit", "spread").
    name: str = "default"
    #: Share of pods (by count) the typical-pod workload must cover, as a fraction. 0.95 is the
    #: FGD paper's threshold: the rare shapes left out change the measure little and cost time.
    workload_coverage: float = 0.95
