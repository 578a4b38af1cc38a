"""The webhook's checks of `mpsched preflight`, decided without I/O: its configurations'
caBundle, its Service's ready endpoints, and when the certificates mpsched's TLS depends on
expire (`CERT_MIN_DAYS`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

from extender.certificates import CertificateError, not_after, pem_certificates
from extender.cluster import JsonObject
from extender.commands.preflight_checks import Check, absent, installed
from extender.kube.survey import Survey

#: A certificate that expires within this many days fails.
CERT_MIN_DAYS: Final = 21


def _webhooks(survey: Survey) -> list[Mapping[str, Any]]:
    configs = (survey.mutating_webhook, survey.validating_webhook)
    return [w for c in configs if c is not None for w in c.get("webhooks") or []]


def check_webhook(survey: Survey) -> Check:
    name = "webhook"
    if survey.mutating_webhook is None:
        return absent(
            survey,
            name,
            f"MutatingWebhookConfiguration {survey.names.webhook_configuration}",
            "mutating_webhook",
        )
    problems = [
        f"{w.get('name')}: no caBundle"
        for w in _webhooks(survey)
        if not (w.get("clientConfig") or {}).get("caBundle")
    ]
    if problems:
        return Check.failed(
            name,
            problems,
            "scripts/make-certs MODE patches it in; with cert-manager, check that "
            "its cainjector runs",
        )
    hooks = ", ".join(
        f"{w.get('name')} (failurePolicy {w.get('failurePolicy', 'Fail')})"
        for w in _webhooks(survey)
    )
    return Check(name, "ok", hooks)


def _ready_endpoints(slices: tuple[JsonObject, ...]) -> int:
    # An endpoint whose `ready` is unset counts as ready (the EndpointSlice API's rule).
    return sum(
        len(e.get("addresses") or [])
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False
    )


def check_webhook_endpoints(survey: Survey) -> Check:
    name = "webhook-endpoints"
    service = f"Service {survey.names.namespace}/{survey.names.webhook_service}"
    if survey.mutating_webhook is None:
        return Check(name, "skip", "no webhook configuration to serve")
    if "webhook_endpoint_slices" in survey.errors:
        return Check(
            name,
            "fail",
            f"cannot list the EndpointSlices of {service}: "
            f"{survey.errors['webhook_endpoint_slices']}",
            "give preflight's credentials list on endpointslices",
        )
    ready = _ready_endpoints(survey.webhook_endpoint_slices)
    if ready == 0:
        return Check(
            name,
            "fail",
            f"{service} has no ready endpoint: the API server cannot reach the webhook, "
            "and new GPU pods are refused while it cannot",
            f"kubectl -n {survey.names.namespace} get pods -l "
            "app.kubernetes.io/name=mpsched-webhook, then describe the ones not ready "
            f"(their Secret {survey.names.webhook_secret} must exist)",
        )
    return Check(name, "ok", f"{service}: {ready} ready endpoint{'s' * (ready != 1)}")


def _secret_pem(secret: JsonObject, key: str) -> str:
    raw = (secret.get("data") or {}).get(key)
    try:
        return base64.b64decode(raw).decode("utf-8", "replace") if raw else ""
    except (binascii.Error, ValueError):
        return ""


def certificates(survey: Survey) -> list[tuple[str, str]]:
    """(where, PEM text) of every certificate mpsched's TLS depends on: the webhook
    configurations' caBundle, and the TLS Secrets (the webhook's; in cluster-scheduler mode the
    extender's and kube-scheduler's client certificate, the one copied to the control plane)."""
    found = []
    for hook in _webhooks(survey):
        bundle = (hook.get("clientConfig") or {}).get("caBundle")
        if bundle:
            found.append(
                (f"caBundle of {hook.get('name')}", _secret_pem({"data": {"b": bundle}}, "b"))
            )
    for name, secret in survey.secrets.items():
        where = f"Secret {survey.names.namespace}/{name}"
        found += [(f"{where} {key}", _secret_pem(secret, key)) for key in ("tls.crt", "ca.crt")]
    return [(where, pem) for where, pem in found if pem]


def check_certificates(survey: Survey, *, now: dt.datetime) -> Check:
    name = "certificates"
    found = certificates(survey)
    if not found:
        if survey.mutating_webhook is None and not installed(survey):
            return Check(name, "skip", "not installed yet")
        return Check(name, "skip", "no certificate found (see the webhook check)")
    problems, soonest = [], None
    for where, pem in found:
        try:
            ends = [not_after(der) for der in pem_certificates(pem)]
        except CertificateError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not ends:
            problems.append(f"{where}: no PEM certificate in it")
        for end in ends:
            days = (end - now).total_seconds() / 86400
            if soonest is None or end < soonest[0]:
                soonest = (end, where)
            if days < CERT_MIN_DAYS:
                when = (
                    f"expired {int(-days)} days ago" if days < 0 else f"expires in {int(days)} days"
                )
                problems.append(f"{where} {when} ({end:%Y-%m-%d})")
    if problems:
        return Check.failed(
            name,
            problems,
            "renew now: scripts/make-certs MODE (the webhook reloads the files), or "
            "check cert-manager's Certificate mpsched-webhook; in cluster-scheduler "
            "mode copy kube-scheduler's renewed client certificate too",
        )
    assert soonest is not None  # every PEM held a certificate, or a problem was found
    unread = sorted(k.removeprefix("secret ") for k in survey.errors if k.startswith("secret "))
    detail = f"{len(found)} checked; the first to expire: {soonest[1]} on {soonest[0]:%Y-%m-%d}"
    if unread:
        detail += f" (Secrets not readable: {', '.join(unread)})"
    return Check(name, "ok", detail)
