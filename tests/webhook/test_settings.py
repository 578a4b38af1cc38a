"""The webhook's configuration fields: defaults, camelCase keys, checks; `enabled` and `port`
stay removed (the webhook is its own command)."""

from __future__ import annotations

import pytest

from extender.config import ConfigError, load_config_text
from extender.config_agent import WebhookSettings


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


@pytest.mark.parametrize(
    "text",
    [
        'webhook: {pipeDirectory: "/tmp/nvidia-mps\\nx"}',  # issue 29 item 9: a newline
        'webhook: {pipeDirectory: "/tmp/nvidia-mps\\n"}',
        'webhook: {pipeDirectory: "/tmp/nvidia mps"}',
        'webhook: {pipeDirectory: "/tmp/nvidia-mps\']"}',
        'webhook: {pipeDirectory: "/tmp/../etc"}',
        'webhook: {pipeDirectory: "/tmp//nvidia-mps"}',
        'webhook: {pipeDirectory: "/tmp/nvidia-mps/"}',
        'webhook: {pipeDirectory: "/"}',
        'webhook: {pipeDirectory: "tmp/nvidia-mps"}',
        'webhook: {pipeDirectory: "/tmp/\\u0000"}',
        "webhook: {pipeDirectory: 3}",
        f'webhook: {{pipeDirectory: "/{"a" * 300}"}}',
    ],
)
def test_the_pipe_directory_must_be_a_plain_absolute_path(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text + "\n")
    (problem,) = caught.value.problems
    assert problem.startswith("webhook.pipeDirectory: must be an absolute directory path")
    assert "\n" not in problem


@pytest.mark.parametrize("path", ["/tmp/nvidia-mps", "/run/nvidia/mps/nvidia.com_gpu/pipe"])
def test_plain_pipe_directories_are_taken(path: str) -> None:
    assert load_config_text(f"webhook: {{pipeDirectory: {path}}}\n").webhook.pipe_directory == path


def test_the_old_host_ipc_switch_names_its_replacement() -> None:
    for value in ("true", "false"):
        with pytest.raises(ConfigError) as caught:
            load_config_text(f"webhook: {{hostIPC: {value}}}\n")
        assert caught.value.problems == [
            "webhook.hostIPC: no longer exists: replaced by webhook.delivery (devicePlugin or "
            f"hostIPC), got {value.capitalize()}"
        ]
    assert load_config_text("webhook: {delivery: hostIPC}\n").webhook.delivery == "hostIPC"
    with pytest.raises(
        ConfigError, match=r"webhook\.delivery: must be one of devicePlugin, hostIPC"
    ):
        load_config_text("webhook: {delivery: hostipc}\n")


def test_the_toleration_key_is_a_taint_key_or_null() -> None:
    assert WebhookSettings().tolerate_taint == "nvidia.com/gpu"
    hook = load_config_text("webhook: {tolerateTaint: example.com/gpu-pool}\n").webhook
    assert hook.tolerate_taint == "example.com/gpu-pool"
    assert load_config_text("webhook: {tolerateTaint: null}\n").webhook.tolerate_taint is None
    for bad in ("''", "'a b'", "'/gpu'", "'x/'", "3"):
        with pytest.raises(ConfigError, match=r"webhook\.tolerateTaint: must be a taint key"):
            load_config_text(f"webhook: {{tolerateTaint: {bad}}}\n")
