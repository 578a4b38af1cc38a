"""TLS for the extender listener, with certificate rotation without a restart.

Owns one `ssl.SSLContext` for the server's lifetime. cert-manager (or a mounted Secret) replaces
the certificate files on disk; `CertificateReloader.check()` notices a changed modification
time or size and loads the new pair into the *same* context object with `load_cert_chain`, so
every connection accepted afterwards presents the new certificate while open ones keep theirs.
A pair that fails to load (a half-written rotation) is logged and retried at the next check;
the old certificate stays in force meanwhile (the pair is tried on a scratch context first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Seconds between checks of the files: rotation tools renew days ahead, so a few seconds of
#: delay cost nothing and stat() twice every few seconds costs nothing either.
DEFAULT_INTERVAL_S = 5.0


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@dataclass(slots=True, eq=False)
class CertificateReloader:
    """A server SSLContext over `cert_file`/`key_file` that follows changes on disk."""

    cert_file: str
    key_file: str
    #: CA bundle whose certificates clients must present (kube-scheduler's extender
    #: `tlsConfig.certFile`); None: clients are not asked for one.
    client_ca_file: str | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    context: ssl.SSLContext = field(init=False)
    _stamps: tuple[tuple[int, int, int], tuple[int, int, int]] | None = field(
        init=False, default=None
    )
    reloads: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Blocking file reads are fine here: the first load happens before the loop serves.
        self._stamps = (_stamp(self.cert_file), _stamp(self.key_file))
        self.context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            # Only a client holding a certificate this CA signed completes the handshake
            # (truth rule 4 of docs/design.md: only kube-scheduler calls the verbs).
            self.context.load_verify_locations(cafile=self.client_ca_file)
            self.context.verify_mode = ssl.CERT_REQUIRED

    def check(self) -> bool:
        """Reload the pair if either file changed; True when a new certificate was loaded."""
        try:
            stamps = (_stamp(self.cert_file), _stamp(self.key_file))
        except OSError as exc:
            log.warning("TLS files not readable, keeping the current certificate: %s", exc)
            return False
        if stamps == self._stamps:
            return False
        try:
            # Try the pair on a scratch context first: a failed load_cert_chain can leave the
            # live context holding the new certificate with the old key, refusing every
            # handshake (OpenSSL installs the certificate before it checks the key).
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                self.cert_file, self.key_file
            )
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            # Often a rotation caught half-way (new cert, old key): try again next time.
            log.warning("new TLS certificate not loaded yet: %s", exc)
            return False
        self._stamps = stamps
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self) -> None:
        """Check the files every `interval_s` until cancelled. On the loop's own thread: the
        context is in use by handshakes there, and OpenSSL does not allow changing an SSL_CTX
        from another thread while it is used (two stat() calls, and a load only after a
        rotation)."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()

    async def running(self) -> AsyncIterator[None]:
        """A cleanup_ctx-style generator: watch while the app runs."""
        task = asyncio.get_running_loop().create_task(self.watch())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
