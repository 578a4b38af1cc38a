"""When a PEM certificate expires: `not_after` reads the first certificate of a PEM text (the
serving certificate; a chain's intermediates follow it) down to its validity's notAfter, with a
minimal DER reader, so that the webhook can export its expiry without a crypto dependency.

Owns that reading only; a text that is not such a certificate raises `CertificateError`. Pure.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Final

_PEM: Final = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.DOTALL
)
SEQUENCE: Final = 0x30
UTC_TIME: Final = 0x17
GENERALIZED_TIME: Final = 0x18
#: [0] EXPLICIT, the optional version before the serial number.
VERSION_TAG: Final = 0xA0


class CertificateError(ValueError):
    """The text holds no certificate this reader understands."""


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at `at`."""
    if at + 2 > len(der):
        raise CertificateError("truncated DER")
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or at + count > len(der):
            raise CertificateError("bad DER length")
        length = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + length > len(der):
        raise CertificateError("truncated DER")
    return tag, at, at + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        element = _element(der, start)
        out.append(element)
        start = element[2]
    return out


def _time(tag: int, text: bytes) -> datetime:
    try:
        value = text.decode("ascii")
        if tag == UTC_TIME:  # YYMMDDHHMMSSZ; years 50-99 are 19xx (RFC 5280 4.1.2.5.1)
            parsed = datetime.strptime(value, "%y%m%d%H%M%SZ")
            if parsed.year >= 2050:
                parsed = parsed.replace(year=parsed.year - 100)
        elif tag == GENERALIZED_TIME:
            parsed = datetime.strptime(value, "%Y%m%d%H%M%SZ")
        else:
            raise CertificateError(f"validity time has tag {tag:#x}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise CertificateError(f"bad validity time: {exc}") from None
    return parsed.replace(tzinfo=UTC)


def not_after(pem: bytes) -> datetime:
    """The notAfter of the first certificate in `pem`. Raises CertificateError."""
    match = _PEM.search(pem)
    if match is None:
        raise CertificateError("no PEM certificate")
    try:
        der = base64.b64decode(match.group(1), validate=False)
    except binascii.Error as exc:
        raise CertificateError(f"bad base64: {exc}") from None
    tag, start, end = _element(der, 0)
    if tag != SEQUENCE:
        raise CertificateError("not a certificate")
    tbs = _children(der, start, end)[0]
    if tbs[0] != SEQUENCE:
        raise CertificateError("not a certificate")
    fields = _children(der, tbs[1], tbs[2])
    if fields and fields[0][0] == VERSION_TAG:
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, ...
    if len(fields) < 4 or fields[3][0] != SEQUENCE:
        raise CertificateError("certificate without validity")
    times = _children(der, fields[3][1], fields[3][2])
    if len(times) != 2:
        raise CertificateError("certificate without validity")
    tag, start, end = times[1]
    return _time(tag, der[start:end])
