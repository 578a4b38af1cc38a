"""The core's exception tree. "Does not fit" is never an exception (it is a `Misfit` result);
these are for invalid input and broken invariants."""

from __future__ import annotations


class PackingError(Exception):
    """Base of every error the packing core raises."""


class InvalidRequest(PackingError):
    """A pod's `mpsched.io/*` request cannot be honoured on any node; the message says why."""


class QuantityError(InvalidRequest):
    """A Kubernetes quantity string does not parse or is out of range."""


class CodecError(PackingError):
    """An annotation value does not decode; the message names the field at fault."""


class LedgerError(PackingError):
    """A ledger operation was refused: it would break a budget or refer to an unknown pod/GPU."""


class BudgetExceeded(LedgerError):
    """Assuming this allocation would push a GPU past one of its budgets."""


class UnknownNode(LedgerError):
    """The ledger holds no inventory for the named node."""


class InvariantViolation(LedgerError):
    """The ledger's own consistency check failed: a bug, never user input."""


class RecordLayoutError(PackingError):
    """The compiled build's C share fit reads a node's fit record laid out otherwise than the
    state index writes it (`state_index.GpuFigures`): an extension built from another
    version of the source. Raised at import."""
