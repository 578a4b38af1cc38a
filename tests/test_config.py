"""The configuration model: defaults, the sample file, every problem listed at once with its
dotted path, and `mpsched check-config` exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import cli
from extender.config import (
    Config,
    ConfigError,
    ConfigReadError,
    config_from_document,
    load_config,
    load_config_text,
)
from extender.config_gpus import DEFAULT_GPU_MODELS, GpuModel
from extender.config_schema import Checks, Nested
from extender.packing.model import ComputeCapability
from extender.packing.policies import PolicySettings
from extender.packing.settings import BudgetSettings

SAMPLE = Path(__file__).resolve().parents[1] / "config" / "mpsched.yaml"


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    return info.value.problems


def test_empty_documents_mean_the_defaults() -> None:
    assert load_config_text("") == Config.default()
    assert load_config_text("{}") == Config.default()
    assert load_config_text("apiVersion: mpsched.io/v1alpha1\nkind: MpschedConfig\n") == Config()


def test_defaults_reuse_the_core_settings() -> None:
    cfg = Config.default()
    assert cfg.budgets == BudgetSettings()
    assert cfg.policy == PolicySettings()
    assert cfg.server.port == 8888
    assert cfg.server.max_body_bytes == 8 * 2**20
    assert cfg.gpu_models == DEFAULT_GPU_MODELS


def test_the_sample_configuration_passes() -> None:
    cfg = load_config(SAMPLE)
    assert cfg.tls.cert_file == "/etc/mpsched/tls/tls.crt"
    assert cfg.logging.format == "json"
    assert cfg.gpu_models["A100-80GB"] == GpuModel(81920, ComputeCapability(8, 0))
    assert cfg.gpu_models["T4"] == DEFAULT_GPU_MODELS["T4"]  # added to, not replaced


def _schema_keys(checks: Checks, prefix: str = "") -> set[str]:
    keys = set()
    for key, (_, check) in checks.items():
        keys.add(prefix + key)
        if isinstance(check, Nested):
            keys |= _schema_keys(check.checks, f"{prefix}{key}.")
    return keys


def _document_keys(doc: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in doc.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and key not in ("gpuModels", "selector"):
            keys |= _document_keys(value, f"{prefix}{key}.")
    return keys


def test_the_sample_shows_every_option() -> None:
    from extender.config import _SECTIONS  # the schema itself, to catch a new option

    doc = yaml.safe_load(SAMPLE.read_text())
    # uidIsolation lives under isolation:; the webhook's enabled/port and two accelerators are
    # removed keys.
    wanted = _schema_keys(_SECTIONS) - {
        "budgets.uidIsolation",
        "webhook.enabled",
        "webhook.port",
        "webhook.hostIPC",
        "accelerators.cycleDelay",
        "accelerators.preparedPriorities",
    }
    assert wanted - _document_keys(doc) == set()
    assert {"apiVersion", "kind", "gpuModels"} <= doc.keys()


def test_camel_case_keys_map_onto_the_settings() -> None:
    cfg = load_config_text(
        """
budgets: {oversubscription: 2, memoryReserveMiB: 512, clientOverheadMiB: 64, maxClientsPerGpu: 16,
          preVolta: share, defaultUnits: 7, proportional: false}
isolation: {uidIsolation: false, multiUserNodeSelector: {mps: multi}}
policy: {name: bestfit, workloadCoverage: 0.5}
nodes: {selector: {gpu: "true"}}
webhook: {delivery: hostIPC, pipeDirectory: /run/mps, inject: {memoryLimit: false}}
leaderElection: {enabled: false, leaseDurationSeconds: 30, renewDeadlineSeconds: 20}
"""
    )
    assert cfg.budgets == BudgetSettings(
        oversubscription=2.0, memory_reserve_mib=512, client_overhead_mib=64,
        max_clients_per_gpu=16, pre_volta="share", default_units=7, proportional=False,
        uid_isolation=False,
    )  # fmt: skip
    assert cfg.isolation.multi_user_node_selector == {"mps": "multi"}
    assert cfg.policy == PolicySettings(name="bestfit", workload_coverage=0.5)
    assert cfg.nodes.selector == {"gpu": "true"}
    assert (cfg.webhook.delivery, cfg.webhook.pipe_directory) == ("hostIPC", "/run/mps")
    assert (cfg.webhook.inject.memory_limit, cfg.webhook.inject.visible_devices) == (False, True)
    assert cfg.leader_election.lease_duration_seconds == 30.0


def test_every_problem_is_listed_at_once_with_its_path() -> None:
    problems = problems_of(
        """
apiVersion: v1
kind: Config
budgets:
  oversubscription: x
  memoryReserveMib: 3
  preVolta: maybe
  maxClientsPerGpu: 64
  uidIsolation: false
polcy: {}
policy: {name: fgdd, workloadCoverage: 2}
server: {port: 0, maxBodyBytes: 10}
webhook: {inject: {visibleDevices: 1, foo: 2}, hostIPC: 3, pipeDirectory: relative/dir}
nodes: {selector: {gpu: true}}
logging: {level: loud}
tls: {certFile: /c.pem}
leaderElection: {leaseDurationSeconds: 5}
gpuModels: {X: {memoryMiB: 3}, Y: {memoryMiB: 0, computeCapability: "8.6"}}
"""
    )
    expected = [
        "apiVersion: must be 'mpsched.io/v1alpha1', got 'v1'",
        "kind: must be 'MpschedConfig', got 'Config'",
        "budgets.oversubscription: must be a number ≥ 1.0 and ≤ 10.0, got 'x'",
        "budgets.memoryReserveMib: unknown key (did you mean 'memoryReserveMiB'?)",
        "budgets.preVolta: must be one of whole-only, share, got 'maybe'",
        "budgets.maxClientsPerGpu: must be an integer ≥ 1 and ≤ 60, got 64",
        "budgets.uidIsolation: belongs under isolation.uidIsolation, got False",
        "polcy: unknown key (did you mean 'policy'?)",
        "policy.name: must be one of default, fgd, bestfit, spread, typefill, got 'fgdd'",
        "policy.workloadCoverage: must be a number > 0.0 and ≤ 1.0, got 2",
        "server.port: must be an integer ≥ 1 and ≤ 65535, got 0",
        "server.maxBodyBytes: must be an integer ≥ 65536",
        "webhook.inject.visibleDevices: must be true or false, got 1",
        "webhook.inject.foo: unknown key; known: visibleDevices, threadPercentage",
        "webhook.hostIPC: no longer exists: replaced by webhook.delivery (devicePlugin or "
        "hostIPC), got 3",
        "webhook.pipeDirectory: must be an absolute directory path of at most 256 letters, "
        "digits and . _ + @ % : - (no whitespace, quotes or control characters; no empty "
        "segment or one starting with '.'), got 'relative/dir'",
        "nodes.selector: must be a mapping of label names to string values",
        "logging.level: must be one of debug, info, warning, error, got 'loud'",
        "gpuModels.X: missing computeCapability",
        "gpuModels.Y.memoryMiB: must be an integer ≥ 1, got 0",
        "leaderElection.leaseDurationSeconds: must be greater than renewDeadlineSeconds",
        "tls: certFile and keyFile must be given together",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)
    assert len(problems) == len(expected)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- a\n- b\n", "the document must be a mapping of sections, got ['a', 'b']"),
        ("budgets: [1]\n", "budgets: must be a mapping, got [1]"),
        ("budgets: {defaultUnits: true}\n", "budgets.defaultUnits: must be an integer ≥ 1"),
        ("budgets: {oversubscription: .nan}\n", "budgets.oversubscription: must be a number"),
        ("budgets: {oversubscription: 0.5}\n", "budgets.oversubscription: must be a number ≥ 1.0"),
        ("Budgets: {}\n", "Budgets: unknown key (did you mean 'budgets'?)"),
        ("zzz: 1\n", "zzz: unknown key; known: policy, budgets"),
        ("1: 1\n", "1: unknown key"),
        ("tls: {certFile: ''}\n", "tls.certFile: must be a non-empty string"),
        ("webhook: {port: 8443}\n", "webhook.port: no longer exists: the port is `mpsched webhook"),
        ("webhook: {enabled: false}\n", "webhook.enabled: no longer exists: the webhook runs as"),
        ("leaderElection: {retryPeriodSeconds: 9}\n",
         "leaderElection.renewDeadlineSeconds: must be greater than 1.2 × retryPeriodSeconds"),
        ("leaderElection: {retryPeriodSeconds: 0}\n",
         "leaderElection.retryPeriodSeconds: must be a number > 0.0"),
        ("gpuModels: [T4]\n", "gpuModels: must be a mapping of model name to facts"),
        ("gpuModels: {T4: {memoryMiB: 1, computeCapability: nine}}\n",
         "gpuModels.T4.computeCapability: must be a compute capability such as \"8.6\""),
        ("gpuModels: {T4: {memoryMiB: 1, computeCapability: 8.6, sms: 3}}\n",
         "gpuModels.T4.sms: unknown key"),
        ("budgets: {\n", "not valid YAML: while parsing a flow node"),
        ("a: 1\n---\nb: 2\n", "not valid YAML: expected a single document"),
        ("logging: {level: info}\nlogging: {level: debug}\n",
         "line 2: key 'logging' appears twice in one mapping"),
    ],
)  # fmt: skip
def test_each_rule(text: str, problem: str) -> None:
    problems = problems_of(text)
    assert any(p.startswith(problem) for p in problems), problems


def test_unquoted_compute_capability_is_accepted() -> None:
    cfg = load_config_text("gpuModels: {L4: {memoryMiB: 23034, computeCapability: 8.9}}\n")
    assert cfg.gpu_models["L4"].compute_capability == ComputeCapability(8, 9)


def test_config_from_document_accepts_parsed_json_too() -> None:
    assert config_from_document(None) == Config()
    assert config_from_document({"server": {"port": 9000}}).server.port == 9000


def test_config_error_carries_the_list() -> None:
    err = ConfigError(["a: x", "b: y"])
    assert err.problems == ["a: x", "b: y"]
    assert str(err) == "a: x; b: y"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigReadError, match="No such file or directory"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigReadError, match="Is a directory"):
        load_config(tmp_path)


# --- mpsched check-config --------------------------------------------------------------------


@pytest.fixture
def only_check_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build only this subcommand's parser: a broken sibling module must not fail these tests."""
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"check-config": cli.SUBCOMMANDS["check-config"]})


@pytest.mark.usefixtures("only_check_config")
def test_check_config_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", str(SAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{SAMPLE}: ok\n")
    assert "policy default" in out
    assert err == ""


@pytest.mark.usefixtures("only_check_config")
def test_check_config_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("budgets: {oversubscription: x}\nserver: {port: -1}\n")
    assert cli.main(["check-config", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{bad}: budgets.oversubscription: must be a number ≥ 1.0 and ≤ 10.0, got 'x'",
        f"{bad}: server.port: must be an integer ≥ 1 and ≤ 65535, got -1",
    ]


@pytest.mark.usefixtures("only_check_config")
def test_check_config_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert cli.main(["check-config", str(missing)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"mpsched: check-config: cannot read {missing}: No such file or directory\n"


@pytest.mark.usefixtures("only_check_config")
def test_check_config_without_a_file_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config"]) == 2
    assert "usage error" in capsys.readouterr().err
