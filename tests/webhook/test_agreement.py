"""The webhook and the ValidatingAdmissionPolicy decide alike: each case, a pod as a client
submits it, goes through the webhook (/mutate, its patch applied, then /validate) and through
the policy (evaluated in CEL on the pod as mutated, as the API server runs validating admission
after mutating admission); both allow it, or both deny it naming the container and the source.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from extender.config import Config
from extender.webhook.admission import AdmissionSettings, mutate
from extender.webhook.review import parse_review
from extender.webhook.validation import validate
from tests.webhook.cel_policy import policy
from tests.webhook.reviews import Json, apply_patch, container, pod_object, review

SETTINGS = AdmissionSettings.from_config(Config.default())
SHARE = {"mpsched.io/threads": "20", "mpsched.io/memory": "4Gi"}


@dataclass(frozen=True)
class Case:
    pod: Json
    #: None: allowed; else fragments both reasons must hold (the container and the source).
    refused: tuple[str, ...] | None = None
    operation: str = "CREATE"
    sub_resource: str = ""
    old: Json | None = None


def _pod(*containers: Json, init: list[Json] | None = None, **spec: Any) -> Json:
    return pod_object(*containers, init=init, **spec)


def _sidecar(name: str = "sidecar", **extra: Any) -> Json:
    out = container(name, **extra)
    out["image"] = "busybox:1.36"
    return out


CASES: dict[str, Case] = {
    "an honest share pod": Case(_pod(container(limits=SHARE))),
    "an honest sidecar": Case(
        _pod(container(limits=SHARE), _sidecar(env=[{"name": "LOG_LEVEL", "value": "info"}]))
    ),
    "a literal pipe directory in a container that asks nothing": Case(
        _pod(
            container(limits=SHARE),
            _sidecar(env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}]),
        ),
        ("container 'sidecar'", "CUDA_MPS_PIPE_DIRECTORY"),
    ),
    "a literal pipe directory in the share container": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}]))
    ),
    "a relative pipe directory in the share container": Case(
        _pod(container(limits=SHARE, env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "x"}])),
        ("container 'main'", "CUDA_MPS_PIPE_DIRECTORY"),
    ),
}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


def _webhook(case: Case) -> tuple[Verdict, Json]:
    """The webhook's verdict, and the pod as the policy sees it (mutated when allowed)."""
    body = review(case.pod, operation=case.operation, old=case.old)
    body["request"]["subResource"] = case.sub_resource or None
    request = parse_review(body)
    mutated = mutate(request, SETTINGS)
    if not mutated.allowed:
        return Verdict(False, mutated.message), case.pod
    pod = apply_patch(case.pod, mutated.patch)
    body = review(pod, operation=case.operation, old=case.old)
    body["request"]["subResource"] = case.sub_resource or None
    checked = validate(parse_review(body), SETTINGS)
    return Verdict(checked.allowed, checked.message), pod


def _policy(case: Case, pod: Json) -> Verdict:
    obj = copy.deepcopy(pod)
    obj["metadata"].setdefault("name", "train-x")
    old = None if case.old is None else copy.deepcopy(case.old)
    decision = policy().admit(case.operation, obj, old, sub_resource=case.sub_resource)
    return Verdict(decision.allowed, "; ".join(decision.denials))


@pytest.mark.parametrize("name", CASES)
def test_the_webhook_and_the_policy_agree(name: str) -> None:
    case = CASES[name]
    webhook, pod = _webhook(case)
    cel = _policy(case, pod)
    assert webhook.allowed == cel.allowed == (case.refused is None), (webhook, cel)
    for fragment in case.refused or ():
        assert fragment in webhook.reason, webhook.reason
        assert fragment in cel.reason, cel.reason
