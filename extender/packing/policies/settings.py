"""Settings of the scoring policies: which one runs, and the knobs of the default policy.
`extender.config` builds this from the `policy:` section of the YAML document."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """The `policy:` section. Every field has a default that is right for most clusters."""

    #: Which policy scores nodes: "default", "fgd", "bestfit", "spread" or "typefill" (the
    #: default's descent with the earlier look-ahead, which fills a node with
    #: one typical pod type at a time; it packs slightly better where CPU binds before GPU).
    name: str = "default"
    #: Share of pods (by count) the typical-pod workload must cover, as a fraction. 0.95 is the
    #: FGD paper's threshold: the rare shapes left out change the measure little and cost time.
    workload_coverage: float = 0.95
    #: Weight, in [0, 1], of the look-ahead fragmentation in the default policy (the other
    #: policies ignore it): the GPU a node would leave idle if it kept receiving a typical pod
    #: type until that no longer fits, counting CPU, blended with FGD's "idle GPU this type
    #: cannot use right now". 0 is FGD exactly; 1 the look-ahead alone. 0.3 because on the openb
    #: trace weights 0.2-0.4 gain 0.33-0.38 pp of GPU allocation over FGD (paired, 20-40
    #: seeds) while 0.5 and more gain less (they break up the 8-GPU nodes whole-node pods
    #: need); docs/packing-quality.md has the held-out checks.
    lookahead: float = 0.3
