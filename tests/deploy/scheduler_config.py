"""A checker for KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) written from the
rules of kube-scheduler's v1 configuration and its extender validation: strict,
case-sensitive decoding (an unknown or misspelt key keeps kube-scheduler from starting), the
extender fields and their types, `extenders` at the top level only, the validation rules
(positive weight with a prioritize verb, at most one binder, managed resources that are
extended resource names and appear once across all extenders), `httpTimeout` as a duration,
and the ignoredByScheduler rule (every profile keeps NodeResourcesFit). It adds mpsched's own
rules: HTTPS with a CA (enableHTTPS without one skips verification), never `insecure`.

Per kube-scheduler minor: a field is known only from the minor that added it (`FIELDS_SINCE`),
and only the minors mpsched supports (`SUPPORTED_MINORS`) are accepted."""

from __future__ import annotations

import re
from typing import Any

from extender.commands.preflight_versions import SUPPORTED_MINORS

#: Top-level fields of KubeSchedulerConfiguration v1 (k8s.io/kube-scheduler config/v1 types.go).
TOP_LEVEL = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
    "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
    "delayCacheUntilActive",
}  # fmt: skip
#: Top-level fields newer than the v1 API's first release (1.25), with the minor that added them.
FIELDS_SINCE = {"delayCacheUntilActive": 28}
LEADER_ELECTION = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
    "resourceName", "resourceNamespace",
}  # fmt: skip
CLIENT_CONNECTION = {"kubeconfig", "acceptContentTypes", "contentType", "qps", "burst"}
PROFILE = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
#: The reference's §3.1 table.
EXTENDER = {
    "urlPrefix": str, "filterVerb": str, "preemptVerb": str, "prioritizeVerb": str,
    "weight": int, "bindVerb": str, "enableHTTPS": bool, "tlsConfig": dict,
    "httpTimeout": str, "nodeCacheCapable": bool, "managedResources": list, "ignorable": bool,
}  # fmt: skip
TLS = {
    "insecure": bool, "serverName": str, "certFile": str, "keyFile": str, "caFile": str,
    "certData": str, "keyData": str, "caData": str,
}  # fmt: skip
MANAGED = {"name": str, "ignoredByScheduler": bool}
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _unknown(where: str, doc: dict[str, Any], allowed: set[str] | dict[str, type]) -> list[str]:
    return [f"{where}: unknown field {key!r}" for key in doc if key not in allowed]


def _typed(where: str, doc: dict[str, Any], types: dict[str, type]) -> list[str]:
    found = _unknown(where, doc, types)
    for key, value in doc.items():
        want = types.get(key)
        # bool is an int in Python; Go's decoder does not take true for an int64.
        if want is not None and (
            not isinstance(value, want) or (want is int and isinstance(value, bool))
        ):
            found.append(f"{where}.{key}: {type(value).__name__}, not {want.__name__}")
    return found


def _extended_resource(name: str) -> bool:
    """IsExtendedResourceName as the reference gives it: a qualified name with a domain outside
    kubernetes.io, not `requests.`-prefixed."""
    if not QUALIFIED_NAME.match(name) or "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def problems(
    doc: dict[str, Any], *, minor: int = SUPPORTED_MINORS[-1], require_verified_https: bool = True
) -> list[str]:
    """Every rule `doc` breaks; [] when kube-scheduler 1.`minor` would load it and mpsched is
    wired in safely."""
    found: list[str] = []
    if minor not in SUPPORTED_MINORS:
        found.append(f"kube-scheduler 1.{minor} is not a minor mpsched supports")
    found += [
        f"{key}: unknown to kube-scheduler 1.{minor} (added in 1.{since})"
        for key, since in FIELDS_SINCE.items()
        if key in doc and since > minor
    ]
    if doc.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        found.append(f"apiVersion {doc.get('apiVersion')!r}: not kubescheduler.config.k8s.io/v1")
    if doc.get("kind") != "KubeSchedulerConfiguration":
        found.append(f"kind {doc.get('kind')!r}")
    found += _unknown("", doc, TOP_LEVEL)
    found += _unknown("leaderElection", doc.get("leaderElection") or {}, LEADER_ELECTION)
    found += _unknown("clientConnection", doc.get("clientConnection") or {}, CLIENT_CONNECTION)
    for i, profile in enumerate(doc.get("profiles") or []):
        found += _unknown(f"profiles[{i}]", profile, PROFILE)
        disabled = ((profile.get("plugins") or {}).get("multiPoint") or {}).get("disabled") or []
        if any(p.get("name") in ("NodeResourcesFit", "*") for p in disabled):
            found.append(f"profiles[{i}]: NodeResourcesFit disabled, ignoredByScheduler needs it")
    extenders = doc.get("extenders") or []
    binders = 0
    seen: set[str] = set()
    for i, ext in enumerate(extenders):
        where = f"extenders[{i}]"
        found += _typed(where, ext, EXTENDER)
        if not ext.get("urlPrefix"):
            found.append(f"{where}: no urlPrefix")
        if ext.get("prioritizeVerb") and not ext.get("weight", 0) > 0:
            found.append(f"{where}: prioritizeVerb needs a positive weight")
        binders += bool(ext.get("bindVerb"))
        timeout = ext.get("httpTimeout")
        if timeout is not None and not (isinstance(timeout, str) and DURATION.match(timeout)):
            found.append(f"{where}.httpTimeout {timeout!r}: not a duration like '10s'")
        tls = ext.get("tlsConfig") or {}
        found += _typed(f"{where}.tlsConfig", tls, TLS)
        for j, managed in enumerate(ext.get("managedResources") or []):
            found += _typed(f"{where}.managedResources[{j}]", managed, MANAGED)
            name = managed.get("name", "")
            if not _extended_resource(name):
                found.append(f"{where}.managedResources[{j}]: {name!r} is no extended resource")
            if name in seen:
                found.append(f"{where}: duplicate extender managed resource name {name!r}")
            seen.add(name)
        https = ext.get("urlPrefix", "").startswith("https://")
        if https != bool(ext.get("enableHTTPS")):
            found.append(f"{where}: enableHTTPS must match the urlPrefix scheme")
        if require_verified_https and https:
            if not (tls.get("caFile") or tls.get("caData")) or tls.get("insecure"):
                found.append(f"{where}: HTTPS without a CA does not verify the extender")
            if not (tls.get("certFile") or tls.get("certData")) or not (
                tls.get("keyFile") or tls.get("keyData")
            ):
                found.append(f"{where}: no client certificate: mpsched's verbs will refuse it")
    if binders > 1:
        found.append(f"found {binders} extenders implementing bind; only one can")
    return found
