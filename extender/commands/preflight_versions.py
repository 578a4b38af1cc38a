"""The Kubernetes versions mpsched supports and the kube-scheduler skew rule, for
`mpsched preflight`, decided without I/O: the API server within `SUPPORTED_MINORS` (the one
list the docs, deploy/components/kube-scheduler-1.N and the scheduler-configuration tests
follow), own-scheduler's kube-scheduler never newer than it and at most one minor older.
"""

from __future__ import annotations

import re
from typing import Final

from extender.cluster import JsonObject
from extender.commands.preflight_checks import Check
from extender.kube.survey import Survey

#: The Kubernetes minors (1.N) mpsched supports, for the API server and for the kube-scheduler
#: own-scheduler runs (deploy/components/kube-scheduler-1.N picks one): the oldest still served
#: by every managed offering to the newest whose KubeSchedulerConfiguration tests/deploy checks.
SUPPORTED_MINORS: Final = (30, 31, 32, 33)
#: The kube-scheduler minor deploy/own-scheduler runs unless a component picks another: the
#: oldest supported, so that by default it is never newer than a supported API server (a newer
#: scheduler may ask for APIs the server does not serve; an older one only lacks features).
DEFAULT_SCHEDULER_MINOR: Final = 30
#: How many minors kube-scheduler may be older than the API server (never newer): the
#: Kubernetes version skew policy for the control plane's components.
SCHEDULER_MINORS_BEHIND: Final = 1


def _minor(text: str) -> int | None:
    """The minor of "v1.33.4", "1.33", "33+" (GKE's /version minor); None otherwise."""
    found = re.match(r"^v?(?:1\.)?(\d+)", text)
    return int(found.group(1)) if found else None


def scheduler_skew(api_minor: int, scheduler_minor: int) -> str | None:
    """Why this kube-scheduler may not run against this API server, or None."""
    if scheduler_minor > api_minor:
        return f"kube-scheduler 1.{scheduler_minor} is newer than the API server 1.{api_minor}"
    if api_minor - scheduler_minor > SCHEDULER_MINORS_BEHIND:
        return (
            f"kube-scheduler 1.{scheduler_minor} is {api_minor - scheduler_minor} minors older "
            f"than the API server 1.{api_minor} (at most {SCHEDULER_MINORS_BEHIND} allowed)"
        )
    return None


def _component(minor: int) -> str:
    return f"deploy/components/kube-scheduler-1.{minor}"


def _scheduler_image(deployment: JsonObject) -> str | None:
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        if container.get("name") == "kube-scheduler":
            return str(container.get("image", ""))
    return None


def check_versions(survey: Survey, *, planned_scheduler_minor: int | None = None) -> Check:
    """The API server's version is supported and kube-scheduler is within skew of it."""
    name = "versions"
    version = survey.version
    if version is None:
        why = survey.errors.get("version", "no answer")
        return Check(
            name,
            "fail",
            f"cannot read the API server's /version: {why}",
            "check the kubeconfig and that the API server answers",
        )
    git = str(version.get("gitVersion", ""))
    api_minor = _minor(str(version.get("minor", ""))) or _minor(git)
    supported = f"1.{SUPPORTED_MINORS[0]} to 1.{SUPPORTED_MINORS[-1]}"
    if api_minor is None or api_minor not in SUPPORTED_MINORS:
        return Check(
            name,
            "fail",
            f"API server {git or version}: mpsched supports {supported}",
            f"run mpsched on a Kubernetes {supported} control plane",
        )
    closest = min(max(api_minor, SUPPORTED_MINORS[0]), SUPPORTED_MINORS[-1])
    deployment = survey.extender_deployment
    if deployment is not None:
        image = _scheduler_image(deployment)
        if image is None:
            return Check(
                name,
                "ok",
                f"API server {git}; the cluster's own kube-scheduler (cluster-scheduler mode)",
            )
        scheduler_minor = _minor(image.rpartition(":")[2])
        where = f"kube-scheduler {image}"
    else:
        scheduler_minor = planned_scheduler_minor or DEFAULT_SCHEDULER_MINOR
        where = f"kube-scheduler 1.{scheduler_minor} (to be installed)"
    if scheduler_minor is None:
        return Check(
            name,
            "fail",
            f"{where}: no version in the image tag",
            f"run a tagged image: add the component {_component(closest)}",
        )
    problem = scheduler_skew(api_minor, scheduler_minor)
    if problem is not None:
        return Check(
            name,
            "fail",
            f"API server {git}; {problem}",
            f"install own-scheduler with the component {_component(closest)} "
            "(docs/installing.md, choosing the kube-scheduler version)",
        )
    return Check(name, "ok", f"API server {git}; {where}")
