"""The service's typed failures. "No node fits" is never one of them (it is a FilterOutcome);
these are for a bind that cannot be done and for a service that cannot answer yet."""

from __future__ import annotations

from typing import Literal

BindReason = Literal[
    "not_found",
    "conflict",
    "uid_mismatch",
    "no_fit",
    "unknown_node",
    "invalid_request",
    "cluster_error",
    "in_doubt",
    "not_ready",
]


class ServiceError(Exception):
    """Base of the service's exceptions."""


class NotReady(ServiceError):
    """This replica may not serve now: the ledger is not built from the cluster yet (startup,
    resync), or another replica is the leader."""


class BindError(ServiceError):
    """The pod was not bound. `reason` is stable (for metrics); the message says why."""

    def __init__(self, reason: BindReason, message: str) -> None:
        super().__init__(message)
        self.reason: BindReason = reason
        self.message = message
