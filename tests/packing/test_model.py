"""The MPS client-limit rule and compute-capability parsing."""

from __future__ import annotations

import pytest

from extender.packing.errors import InvalidRequest
from extender.packing.model import (
    ComputeCapability,
    architecture_client_limit,
    client_limit,
)


@pytest.mark.parametrize(
    ("cc", "limit"),
    [
        ("3.5", 16),  # Kepler
        ("6.0", 16),  # P100: pre-Volta
        ("6.1", 16),  # P4
        ("7.0", 48),  # V100: the boundary is 7.0, not 7.5
        ("7.5", 48),  # T4
        ("8.0", 48),
        ("9.0", 48),
        ("10.0", 48),
    ],
)
def test_architecture_limit_switches_at_volta(cc: str, limit: int) -> None:
    assert architecture_client_limit(ComputeCapability.parse(cc)) == limit


def test_configured_cap_only_lowers_the_limit() -> None:
    volta = ComputeCapability.parse("7.0")
    pascal = ComputeCapability.parse("6.0")
    assert client_limit(volta, 8) == 8
    assert client_limit(volta, 100) == 48
    assert client_limit(pascal, 32) == 16
    assert client_limit(volta, None) == 48


def test_ordering_and_text() -> None:
    assert ComputeCapability.parse("6.1") < ComputeCapability.parse("7.0")
    assert ComputeCapability.parse("10.0") > ComputeCapability.parse("9.0")
    assert str(ComputeCapability.parse("8")) == "8.0"


@pytest.mark.parametrize("bad", ["", "seven", "7.x", "7.0.1", "-7.0", "7..0"])
def test_bad_compute_capability_names_the_value(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="compute capability"):
        ComputeCapability.parse(bad)
