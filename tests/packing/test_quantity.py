"""Kubernetes quantity parsing against resource.Quantity's grammar and semantics."""

from __future__ import annotations

import contextlib
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.packing.errors import InvalidRequest, QuantityError
from extender.packing.quantity import parse_quantity, whole_quantity

GI = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("+1", 1),
        ("-1", -1),
        ("007", 7),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("100m", Fraction(1, 10)),
        ("2000m", 2),
        ("1u", Fraction(1, 10**6)),
        ("1n", Fraction(1, 10**9)),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),  # E alone is exa...
        ("1E9", 10**9),  # ...and an exponent when digits follow
        ("1e3", 1000),
        ("1e+3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("1.5e3", 1500),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Gi", GI),
        ("1.5Gi", 3 * GI // 2),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("-1.5Gi", -3 * GI // 2),
        ("  8Gi ", 8 * GI),  # the API server's JSON unmarshaller trims blanks
    ],
)
def test_parses_like_kubernetes(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        ".",
        "+",
        "-",
        "Gi",
        "1 Gi",
        "1gi",
        "1K",
        "1KI",
        "1mi",
        "1e",
        "1E+",
        "1e1.5",
        "1.2.3",
        "1Gi1",
        "0x10",
        "1,000",
        "ten",
        "1Mb",
        "--1",
        "1e3Gi",
        "∞",
        "١",
    ],
)
def test_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_json_numbers_are_quantities() -> None:
    assert parse_quantity(8) == 8
    assert parse_quantity(1.5) == Fraction(3, 2)
    assert parse_quantity(1e18) == 10**18
    assert parse_quantity(Fraction(7, 2)) == Fraction(7, 2)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}, float("nan"), float("inf"), b"1"])
def test_non_quantities_raise_quantity_error(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_quantity_error_is_an_invalid_request() -> None:
    # Callers that reject a pod catch InvalidRequest; a bad quantity must be one.
    assert issubclass(QuantityError, InvalidRequest)


def test_sub_nano_values_round_up_to_one_nano_like_kubernetes() -> None:
    assert parse_quantity("0.1n") == Fraction(1, 10**9)
    assert parse_quantity("1.0000000001") == 1 + Fraction(1, 10**9)
    assert parse_quantity("-0.1n") == -Fraction(1, 10**9)
    assert parse_quantity("1e-1000000") == Fraction(1, 10**9)
    assert parse_quantity("0e99999999") == 0


@pytest.mark.parametrize("text", ["9223372036854775808", "8Ei", "10E", "1e19", "1e999999999999"])
def test_values_above_int64_are_rejected_not_capped(text: str) -> None:
    with pytest.raises(QuantityError, match="too large"):
        parse_quantity(text)


def test_largest_int64_is_accepted() -> None:
    assert parse_quantity("9223372036854775807") == 2**63 - 1


def test_absurdly_long_numbers_are_rejected_without_hanging() -> None:
    with pytest.raises(QuantityError, match="digits"):
        parse_quantity("1" * 5000)
    assert parse_quantity("0" * 5000 + "1") == 1  # leading zeros are not significant


@given(st.text(max_size=30))
def test_arbitrary_text_parses_or_raises_quantity_error(text: str) -> None:
    with contextlib.suppress(QuantityError):
        parse_quantity(text)


@given(
    st.integers(-(10**9), 10**9),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi", "m", "n"]),
)
def test_integer_with_suffix_is_exact(n: int, suffix: str) -> None:
    scale: dict[str, int | Fraction] = {
        "": 1,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "m": Fraction(1, 10**3),
        "n": Fraction(1, 10**9),
    }
    assert parse_quantity(f"{n}{suffix}") == n * scale[suffix]


_SUFFIX_TEXTS: tuple[str, ...] = ("", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti")
_SUFFIX_TEXTS += ("Pi", "Ei", "m", "u", "n")


@given(st.integers(min_value=0, max_value=10**22), st.sampled_from(_SUFFIX_TEXTS))
def test_plain_integer_fast_path_agrees_with_the_general_rule(n: int, suffix: str) -> None:
    # "<n>.0<suffix>" takes the general (Fraction) path; "<n><suffix>" the fast one where it
    # applies: both must give the same value, or the same refusal.
    outcomes: list[Fraction | None] = []
    for text in (f"{n}{suffix}", f"{n}.0{suffix}"):
        try:
            outcomes.append(parse_quantity(text))
        except QuantityError:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("text", ["Ki", "1e", "\uff11\uff12", "5 Gi", "0x10", "5GiB", "1iG"])
def test_texts_like_plain_integers_that_are_not_quantities(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(("text", "value"), [("+5", 5), ("-5", -5), ("007", 7), ("1E", 10**18)])
def test_signed_padded_and_exa_integers(text: str, value: int) -> None:
    assert parse_quantity(text) == value


_QUANTITY_LIKE = st.one_of(
    st.builds(
        lambda n, suffix, pad: f"{pad}{n}{suffix}{pad}",
        st.integers(-(10**20), 10**20),
        st.sampled_from(_SUFFIX_TEXTS),
        st.sampled_from(["", " ", "\t"]),
    ),
    st.text(max_size=12),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
)


@given(_QUANTITY_LIKE)
def test_whole_quantity_answers_only_what_parse_quantity_reads_the_same(value: object) -> None:
    """podspec reads a count or a memory ask through `whole_quantity` (no Fraction) and falls
    back to `parse_quantity`: wherever the fast one answers, it is the exact value."""
    fast = whole_quantity(value)
    if fast is None:
        return
    assert isinstance(fast, int) and not isinstance(fast, bool)
    assert parse_quantity(value) == fast


@pytest.mark.parametrize(
    ("value", "n"),
    [("8Gi", 8 * GI), ("2", 2), (" 500M ", 500 * 10**6), (3, 3), ("1E", 10**18), ("0", 0)],
)
def test_whole_quantity_reads_plain_whole_numbers(value: object, n: int) -> None:
    assert whole_quantity(value) == n


@pytest.mark.parametrize("value", ["1.5", "500m", "-1", "+1", "1e3", True, 2.0, None, "9Ei", 2**63])
def test_whole_quantity_leaves_the_rest_to_parse_quantity(value: object) -> None:
    assert whole_quantity(value) is None
