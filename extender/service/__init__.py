"""The extender service (docs/design.md, Architecture): decides with the packing core, then acts
through the cluster interface. No HTTP here: `extender.http` adapts these verbs to the wire.

`ExtenderService` is the entry point. The decisions themselves (parsing, cached fit and score,
preemption, the learned workload) live in the pure core, `extender.packing`; this package keeps
the runtime: lifecycle, the bind lock, warm-up and the /status stream.
"""

from extender.service.answers import MAX_SCORE, Victims, normalise
from extender.service.core import ExtenderService
from extender.service.errors import BindError, NotReady

__all__ = [
    "MAX_SCORE",
    "BindError",
    "ExtenderService",
    "NotReady",
    "Victims",
    "normalise",
]
