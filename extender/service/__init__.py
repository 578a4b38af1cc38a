"""The extender service (DESIGN §9 `service`): decides with the packing core, then acts through
the cluster interface. No HTTP here: `extender.http` adapts these verbs to the wire.

`ExtenderService` is the entry point; the package splits it by concern: `cluster_state` (cluster
objects → ledger), `parsing` (one parse per pod version), `evaluate` (cached fit and score),
`preempt` (victim selection), `status` (the /status document and metrics sample), `workload`
(the learned typical-pod mix).
"""

from extender.service.core import MAX_SCORE, ExtenderService, FilterOutcome, Victims, normalise
from extender.service.errors import BindError, BindReason, NotReady, ServiceError

__all__ = [
    "MAX_SCORE",
    "BindError",
    "BindReason",
    "ExtenderService",
    "FilterOutcome",
    "NotReady",
    "ServiceError",
    "Victims",
    "normalise",
]
