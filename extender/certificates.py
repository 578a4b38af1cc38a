"""When a certificate expires, read without I/O from its PEM text: for `mpsched preflight`
(the webhook configurations' caBundle, the TLS Secrets) and for the webhook's expiry metric.

Owns a reader of just enough DER (RFC 5280's Certificate → tbsCertificate → validity) to reach
`notAfter`; the serving image carries no X.509 library, and expiry is all either needs.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from typing import Final

_PEM: Final = re.compile(
    r"-----BEGIN CERTIFICATE-----\s*(.*?)\s*-----END CERTIFICATE-----", re.DOTALL
)
_SEQUENCE: Final = 0x30
_UTC_TIME: Final = 0x17
_GENERALIZED_TIME: Final = 0x18
_VERSION: Final = 0xA0  # [0] EXPLICIT, present from X.509 v2 on


class CertificateError(ValueError):
    """Text that is not a readable X.509 certificate."""


def pem_certificates(text: str) -> list[bytes]:
    """The DER of every CERTIFICATE block in `text`, in order."""
    found = []
    for block in _PEM.findall(text):
        try:
            found.append(base64.b64decode("".join(block.split()), validate=True))
        except binascii.Error as exc:
            raise CertificateError(f"a PEM block is not base64: {exc}") from exc
    return found


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at `pos`."""
    if pos + 2 > len(der):
        raise CertificateError("truncated DER")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        size = length & 0x7F
        if size == 0 or size > 4 or pos + size > len(der):
            raise CertificateError("bad DER length")
        length = int.from_bytes(der[pos : pos + size], "big")
        pos += size
    if pos + length > len(der):
        raise CertificateError("truncated DER")
    return tag, pos, pos + length


def _time(tag: int, raw: bytes) -> dt.datetime:
    text = raw.decode("ascii", "replace")
    try:
        if tag == _UTC_TIME:  # YYMMDDHHMMSSZ; RFC 5280: YY >= 50 is 19YY
            parsed = dt.datetime.strptime(text, "%y%m%d%H%M%SZ")
            if parsed.year >= 2050:
                parsed = parsed.replace(year=parsed.year - 100)
        elif tag == _GENERALIZED_TIME:
            parsed = dt.datetime.strptime(text, "%Y%m%d%H%M%SZ")
        else:
            raise CertificateError(f"validity time has tag {tag:#x}")
    except ValueError as exc:
        raise CertificateError(f"unreadable validity time {text!r}") from exc
    return parsed.replace(tzinfo=dt.UTC)


def not_after(der: bytes) -> dt.datetime:
    """The end of a DER certificate's validity, in UTC."""
    tag, start, _ = _element(der, 0)
    if tag != _SEQUENCE:
        raise CertificateError("not a DER certificate")
    tag, pos, _ = _element(der, start)  # tbsCertificate
    if tag != _SEQUENCE:
        raise CertificateError("no tbsCertificate")
    if der[pos] == _VERSION:
        pos = _element(der, pos)[2]
    for _ in range(3):  # serialNumber, signature, issuer
        pos = _element(der, pos)[2]
    tag, pos, _ = _element(der, pos)  # validity
    if tag != _SEQUENCE:
        raise CertificateError("no validity")
    pos = _element(der, pos)[2]  # notBefore
    tag, start, end = _element(der, pos)
    return _time(tag, der[start:end])


def pem_not_after(pem: str | bytes) -> dt.datetime:
    """The end of the validity of the first certificate in a PEM text (a serving certificate;
    a chain's intermediates follow it), in UTC."""
    text = pem.decode("ascii", "replace") if isinstance(pem, bytes) else pem
    found = pem_certificates(text)
    if not found:
        raise CertificateError("no PEM certificate")
    return not_after(found[0])
