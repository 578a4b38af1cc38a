"""The ablation harness (scripts/bench-ablation, `extender_bench.ablation`): `--off` names the
configuration's switches and refuses others, the serve configuration it writes turns exactly
those off over the given file, and the summary takes medians of each run's ratios to its own
floor and keeps an accelerator at a 5 % gain on either measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extender.config import AcceleratorSettings, load_config_text
from extender_bench.ablation import (
    ALL_ON,
    SWITCHES,
    label,
    parse_off,
    render,
    serve_config_text,
    summarise,
    verdicts,
)
from extender_bench.cli import parse_args


def test_the_switches_are_the_configurations_keys() -> None:
    assert parse_off("fastPath, forecast") == ("fastPath", "forecast")
    assert parse_off("") == ()
    assert set(SWITCHES) >= {"nativeFit", "nativeWriter", "fastPath", "forecast"}
    with pytest.raises(ValueError, match="fast_path"):
        parse_off("fast_path")


def test_an_unknown_switch_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--off", "turbo"])
    assert exited.value.code == 2
    assert "unknown accelerator 'turbo'" in capsys.readouterr().err


def test_the_serve_configuration_turns_off_what_is_named_over_the_file(tmp_path: Path) -> None:
    base = tmp_path / "serve.yaml"
    base.write_text("policy: {name: fgd}\naccelerators: {forecast: false}\n")
    config = load_config_text(serve_config_text(base, ("fastPath",)))
    assert config.policy.name == "fgd"
    assert config.accelerators == AcceleratorSettings(forecast=False, fast_path=False)
    every = load_config_text(serve_config_text(None, SWITCHES)).accelerators
    assert not any(getattr(every, name) for name in AcceleratorSettings.__slots__)


def report(
    pair_ms: float, floor_pair_ms: float, pods: float, floor_pods: float, bind_ms: float = 1.0
) -> Any:
    return {
        "extender": {"pair_ms": {"p50": pair_ms}, "bind_ms": {"p50": bind_ms}, "pods_per_s": pods},
        "floor": {
            "pair_ms": {"p50": floor_pair_ms},
            "bind_ms": {"p50": 1.0},
            "pods_per_s": floor_pods,
        },
    }


def test_medians_of_ratios_and_the_five_percent_bar() -> None:
    runs = {
        ALL_ON: [report(1.4, 1.0, 700, 1000), report(2.8, 2.0, 600, 1000), report(9, 1, 1, 1)],
        label(("forecast",)): [report(1.5, 1.0, 690, 1000)] * 3,
        label(("fastPath",)): [report(1.4, 1.0, 600, 1000)] * 3,
    }
    rows = summarise(runs)
    assert [r.label for r in rows] == [ALL_ON, "forecast off", "fastPath off"]
    assert (rows[0].pair_ratio, rows[0].pods_per_s, rows[0].pods_ratio) == (1.4, 600, 0.7)
    found = {switch: (round(p, 3), round(q, 3), keep) for switch, p, q, _, keep in verdicts(rows)}
    # forecast: p50 1.5x against 1.4x (+7.1 %), pods/s 0.7 against 0.69 (+1.4 %): kept.
    # fastPath: p50 the same, pods/s 0.7 against 0.6 (+16.7 %): kept.
    assert found == {"forecast": (0.071, 0.014, True), "fastPath": (0.0, 0.167, True)}
    runs[label(("forecast",))] = [report(1.43, 1.0, 700, 1000)]
    [(_, _, _, _, keep)] = [v for v in verdicts(summarise(runs)) if v[0] == "forecast"]
    assert not keep
    text = render(summarise(runs))
    assert "forecast" in text
    assert "REMOVE" in text
    # The same p50 and pods/s, but binds 20 % slower without it: the bind's gain is shown, and
    # it still goes (only the scheduler's serial path counts).
    runs[label(("forecast",))] = [report(1.43, 1.0, 700, 1000, bind_ms=1.2)]
    [(_, _, _, bind_gain, keep)] = [v for v in verdicts(summarise(runs)) if v[0] == "forecast"]
    assert round(bind_gain, 3) == 0.2
    assert not keep


def test_a_pure_build_run_says_the_c_switches_did_nothing() -> None:
    rows = summarise({ALL_ON: [report(1.4, 1.0, 700, 1000)]})
    assert "pure build" in render(rows, builds=["python"])
    assert "pure build" not in render(rows, builds=["mypyc"])
