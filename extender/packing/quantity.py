"""Kubernetes `resource.Quantity` parsing: the exact value of a quantity string as the API server
reads it, and the whole-number reading the packing core needs of it.

Owns the quantity grammar only; what a value *means* for a pod is `podspec`'s business.

Grammar (k8s.io/apimachinery/pkg/api/resource, `ParseQuantity`)::

    quantity   ::= sign? number suffix
    number     ::= digits | digits "." digits? | "." digits
    suffix     ::= "" | binarySI | decimalSI | ("e" | "E") sign? digits
    binarySI   ::= Ki | Mi | Gi | Ti | Pi | Ei                 (powers of 1024)
    decimalSI  ::= n | u | m | k | M | G | T | P | E           (powers of 1000)

`E` alone is exa (`1E` = 10**18) while `E` followed by digits is an exponent (`1E9`). Like
Kubernetes, a non-zero magnitude finer than 1n is rounded *up* to the next nano (a pod that asks
for something gets something). Two deliberate departures: values whose magnitude exceeds
2**63 - 1 are rejected instead of being silently capped there, and absurd inputs (more than
`MAX_DIGITS` significant digits) are rejected instead of parsed; neither occurs in a real pod.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from extender.packing.errors import QuantityError

#: Suffix → multiplier. Binary suffixes are powers of 1024, decimal ones powers of 1000.
SUFFIXES: Final = MappingProxyType(
    {
        "": Fraction(1),
        "n": Fraction(1, 10**9),
        "u": Fraction(1, 10**6),
        "m": Fraction(1, 10**3),
        "k": Fraction(10**3),
        "M": Fraction(10**6),
        "G": Fraction(10**9),
        "T": Fraction(10**12),
        "P": Fraction(10**15),
        "E": Fraction(10**18),
        "Ki": Fraction(2**10),
        "Mi": Fraction(2**20),
        "Gi": Fraction(2**30),
        "Ti": Fraction(2**40),
        "Pi": Fraction(2**50),
        "Ei": Fraction(2**60),
    }
)

#: Whole-number multipliers of the suffixes, for the fast path of plain `<digits><suffix>`.
_WHOLE_SUFFIXES: Final = MappingProxyType(
    {k: int(v) for k, v in SUFFIXES.items() if v.denominator == 1 and k}
)

#: Kubernetes caps every quantity at the largest int64; beyond it we refuse rather than cap.
MAX_MAGNITUDE: Final = Fraction(2**63 - 1)
#: Significant digits we are willing to read (also keeps clear of Python's int-parsing limit).
MAX_DIGITS: Final = 200
#: |exponent| beyond which the value is certainly 0, sub-nano or too large: no need to compute.
_MAX_EXPONENT: Final = 400
_NANO: Final = Fraction(1, 10**9)
MIB: Final = 2**20

_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-])?"
    r"(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE])?)"
)


def _text_of(value: object) -> str:
    """The quantity's text. JSON numbers are accepted (the API server's Quantity unmarshaller
    does too); surrounding blanks are trimmed as that unmarshaller does."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return value.strip()
    raise QuantityError(f"quantity {value!r} is a {type(value).__name__}, not a string")


def whole_quantity(value: object) -> int | None:
    """The quantity's value when it is written as a plain whole number with at most a
    multiplying suffix (`"2"`, `"8Gi"`, `"500M"`, a JSON integer): what almost every quantity a
    pod carries looks like, read without Fraction arithmetic (Python-level and slow, where this
    path is compiled). None for anything else, which `parse_quantity` reads exactly; both agree
    wherever this one answers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= 2**63 - 1 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text.isascii() or len(text) > 24:
        return None
    if text.isdigit():
        whole = int(text)
    elif text[-2:] in _WHOLE_SUFFIXES and text[:-2].isdigit():
        whole = int(text[:-2]) * _WHOLE_SUFFIXES[text[-2:]]
    elif text[-1:] in _WHOLE_SUFFIXES and text[:-1].isdigit():
        whole = int(text[:-1]) * _WHOLE_SUFFIXES[text[-1:]]
    else:
        return None
    return whole if 0 <= whole <= 2**63 - 1 else None


def parse_quantity(value: object) -> Fraction:
    """The exact value of a Kubernetes quantity: a string (`"1.5Gi"`, `"500m"`, `"1e3"`), a JSON
    number or a Fraction. Raises QuantityError naming the value for anything else, for text that
    does not parse, and for values out of range."""
    if isinstance(value, Fraction):
        return value
    text = _text_of(value)
    # Fast path: Fraction arithmetic is what makes the general path costly, and a pod
    # parse does several. Exact: such a value is a whole number, so the nano rounding below
    # changes nothing. Anything else (or too long) goes the long way.
    whole = whole_quantity(text)
    if whole is not None:
        return Fraction(whole)
    m = _QUANTITY_RE.fullmatch(text)
    if m is None or not (m["int"] or m["frac"]):
        raise QuantityError(
            f"quantity {text!r} is not a Kubernetes quantity (expected e.g. '8Gi', '500M', '2')"
        )
    int_digits = m["int"].lstrip("0")
    frac_digits = (m["frac"] or "").rstrip("0")
    if len(int_digits) + len(frac_digits) > MAX_DIGITS:
        raise QuantityError(f"quantity {text[:40]!r}... has more than {MAX_DIGITS} digits")
    mantissa = Fraction(int(int_digits or "0") * 10 ** len(frac_digits) + int(frac_digits or "0"))
    mantissa /= 10 ** len(frac_digits)
    if m["exp"] is not None:
        digits = m["exp"][1:].lstrip("+-").lstrip("0")
        # A many-digit exponent is certainly out of range; do not feed it to int().
        exponent = int(digits or "0") if len(digits) <= 6 else 10**7
        if m["exp"][1] == "-":
            exponent = -exponent
        if mantissa == 0:
            return Fraction(0)
        if exponent > _MAX_EXPONENT:
            raise QuantityError(f"quantity {text!r} is too large (above 2**63 - 1)")
        # Far below a nano: Kubernetes rounds any non-zero value up to 1n, so shall we.
        magnitude = mantissa * Fraction(10) ** max(exponent, -_MAX_EXPONENT)
    else:
        magnitude = mantissa * SUFFIXES[m["suffix"] or ""]
    if magnitude > MAX_MAGNITUDE:
        raise QuantityError(f"quantity {text!r} is too large (above 2**63 - 1)")
    # Round the magnitude up to a whole number of nanos, as Kubernetes does (inf.RoundUp).
    magnitude = Fraction(math.ceil(magnitude / _NANO)) * _NANO
    return -magnitude if m["sign"] == "-" else magnitude
