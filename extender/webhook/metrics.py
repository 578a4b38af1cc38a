"""Prometheus metrics of the admission webhook: reviews by endpoint and outcome, their latency,
and the seconds until the serving certificate expires.

Owns metric names, help texts and units; nothing here decides anything. The metrics live in a
`CollectorRegistry` of their own (never the process-global one). The certificate's expiry is
read from its file at scrape time, so a rotated certificate (cert-manager, scripts/make-certs)
shows without a restart; `render` reads a file and so belongs off the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.certificates import CertificateError, pem_not_after

#: What became of a review: allowed (with or without a patch), denied (a pod refused, or a
#: review of something else than a pod), error (a decision raised: a bug; denied, code 500),
#: rejected (a body that is no AdmissionReview, or too large: answered 4xx, the API server then
#: applies the failure policy).
OUTCOMES: Final = ("allowed", "denied", "error", "rejected")
ENDPOINTS: Final = ("mutate", "validate")
#: Seconds: a review is decided in well under a millisecond; the API server's timeout is 5 s.
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class _CertificateExpiry(Collector):
    """Seconds until the certificate in `cert_file` expires: negative once it has; 0 when the
    file cannot be read as a certificate (the alert for expiry then fires too)."""

    def __init__(self, cert_file: str, clock: Callable[[], float]) -> None:
        self._file = cert_file
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "mpsched_webhook_certificate_expiry_seconds",
            "Seconds until the webhook's serving certificate expires (0 if it cannot be read).",
        )
        try:
            left = pem_not_after(Path(self._file).read_bytes()).timestamp() - self._clock()
        except (OSError, CertificateError):
            left = 0.0
        family.add_metric([], left)
        yield family


class WebhookMetrics:
    """The webhook's metrics; `cert_file` None: served without TLS, no expiry to export."""

    def __init__(self, *, cert_file: str | None = None, clock: Callable[[], float] = time.time):
        self.registry = CollectorRegistry(auto_describe=True)
        self.admissions = Counter(
            "mpsched_webhook_admissions",
            "Admission reviews answered, by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mpsched_webhook_admission_duration_seconds",
            "Seconds from a review's request to its answer, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        for endpoint in ENDPOINTS:  # every series exists from the start, at 0
            self.latency.labels(endpoint)
            for outcome in OUTCOMES:
                self.admissions.labels(endpoint, outcome)
        if cert_file is not None:
            self.registry.register(_CertificateExpiry(cert_file, clock))

    def observe(self, endpoint: str, outcome: str, seconds: float) -> None:
        self.admissions.labels(endpoint, outcome).inc()
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        """The text exposition (format 0.0.4). Reads the certificate file: not on the loop."""
        return generate_latest(self.registry)
