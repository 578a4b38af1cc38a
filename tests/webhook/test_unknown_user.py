"""A share pod without a runAsUser is admitted with a warning kubectl shows: its user is unknown,
so the extender shares no GPU with it (outside multi-user nodes). Pods whose user is known, and
whole-GPU pods (never shared anyway), get none; with UID isolation off there is nothing to warn
about."""

from __future__ import annotations

import dataclasses

from extender.config import Config
from extender.webhook.admission import UNKNOWN_USER_WARNING, AdmissionSettings, mutate
from extender.webhook.review import parse_review
from tests.webhook.reviews import Json, container, pod_object, review

DEFAULT = AdmissionSettings.from_config(Config.default())


def _warnings(obj: Json, settings: AdmissionSettings = DEFAULT) -> list[str]:
    decision = mutate(parse_review(review(obj)), settings)
    assert decision.allowed, decision.message
    return list(decision.warnings)


def _share(**limits: str) -> Json:
    return container(limits=limits or {"mpsched.io/threads": "30"})


def test_a_share_pod_without_a_user_is_warned() -> None:
    obj = pod_object(_share())
    del obj["spec"]["securityContext"]
    assert _warnings(obj) == [UNKNOWN_USER_WARNING]
    assert "runAsUser" in UNKNOWN_USER_WARNING


def test_a_known_user_whole_gpus_or_no_isolation_are_not_warned() -> None:
    assert _warnings(pod_object(_share())) == []  # the pod's securityContext names a user
    per_container = pod_object(_share() | {"securityContext": {"runAsUser": 7}})
    del per_container["spec"]["securityContext"]
    assert _warnings(per_container) == []
    whole = pod_object(_share(**{"mpsched.io/gpus": "1"}))
    del whole["spec"]["securityContext"]
    assert _warnings(whole) == []
    open_node = dataclasses.replace(
        DEFAULT, budgets=dataclasses.replace(DEFAULT.budgets, uid_isolation=False)
    )
    anonymous = pod_object(_share())
    del anonymous["spec"]["securityContext"]
    assert _warnings(anonymous, open_node) == []
