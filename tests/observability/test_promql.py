"""The name lexer the dashboard and rule checks rely on finds names, and only names."""

from __future__ import annotations

from tests.observability.promql import metric_names


def test_names_in_a_histogram_quantile() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (verb, le) (rate(mpsched_request_duration_seconds_bucket"
        '{job="mpsched", verb=~"bind|filter"}[$__rate_interval])))'
    )
    assert metric_names(expr) == {"mpsched_request_duration_seconds_bucket"}


def test_binary_operators_grouping_and_keywords() -> None:
    expr = (
        'max(mpsched_leader{job="mpsched"} * on(instance) mpsched_ready) < 1 '
        "and on(instance) (mpsched_config_valid == 1) or absent(up{job='x'} == 1) "
        "unless time() - mpsched_agent_snapshot_timestamp_seconds offset 5m > 300"
    )
    assert metric_names(expr) == {
        "mpsched_leader",
        "mpsched_ready",
        "mpsched_config_valid",
        "up",
        "mpsched_agent_snapshot_timestamp_seconds",
    }


def test_label_values_query_and_variables() -> None:
    assert metric_names('label_values(mpsched_gpu_info{job="mpsched"}, node)') == {
        "mpsched_gpu_info"
    }
    assert metric_names('mpsched_gpus{node=~"$node"} / ${total}') == {"mpsched_gpus"}
    assert metric_names("1 + 2e3") == set()
