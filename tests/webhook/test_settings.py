"""The webhook's configuration fields: defaults, camelCase keys, checks; `enabled` and `port`
stay removed (the webhook is its own command)."""

from __future__ import annotations

import pytest

from extender.config import ConfigError, WebhookSettings, load_config_text


def test_defaults() -> None:
    hook = WebhookSettings()
    assert (hook.scheduler_name, hook.runtime_class_name) == (None, None)
    assert hook.service_account == "system:serviceaccount:mpsched-system:mpsched"
    assert hook.max_body_bytes == 4 << 20


def test_keys_map_onto_the_settings() -> None:
    hook = load_config_text(
        "webhook: {schedulerName: mpsched-scheduler, runtimeClassName: nvidia,\n"
        "          serviceAccount: 'system:serviceaccount:gpu:mpsched', maxBodyBytes: 1048576}\n"
    ).webhook
    assert hook.scheduler_name == "mpsched-scheduler" and hook.runtime_class_name == "nvidia"
    assert hook.service_account == "system:serviceaccount:gpu:mpsched"
    assert hook.max_body_bytes == 1 << 20


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("webhook: {schedulerName: ''}", "webhook.schedulerName: must be a non-empty string"),
        ("webhook: {runtimeClassName: 3}", "webhook.runtimeClassName: must be a non-empty string"),
        ("webhook: {serviceAccount: ''}", "webhook.serviceAccount: must be a non-empty string"),
        ("webhook: {maxBodyBytes: 10}", "webhook.maxBodyBytes: must be an integer ≥ 65536"),
        ("webhook: {port: 8443}", "webhook.port: no longer exists"),
        ("webhook: {enabled: true}", "webhook.enabled: no longer exists"),
    ],
)
def test_checks(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text + "\n")
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems
