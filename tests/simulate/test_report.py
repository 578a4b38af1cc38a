"""What a simulation writes: the JSON document's one shape, the plot's title, legend, bands and
fragmentation panel, drawn from hand-made seed results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import pytest

from extender.simulate.replay import CURVE_MAX_PCT, SeedResult
from extender.simulate.report import PolicyRun, Setup, document, figure, seed_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SETUP = Setup(
    trace={"nodes": "/x/nodes.csv", "pods": "/y/pods.csv", "gpu_count": 8, "pod_count": 3},
    seeds=(1, 2),
    config="/etc/mpsched/bench.yaml",
    tune=1.3,
)


def _result(seed: int, level: float) -> SeedResult:
    curve = tuple(min(float(x), level) for x in range(CURVE_MAX_PCT + 1))
    frag = tuple(max(0.0, 14.0 - x / 10) for x in range(CURVE_MAX_PCT + 1))
    return SeedResult(
        seed=seed,
        arrivals=10,
        placed=9,
        alloc_pct_at_100=level,
        alloc_pct_at_end=level,
        arrived_pct_at_end=130.0,
        curve=curve,
        failed_pct_by_class={},
        seconds=0.1,
        frag_curve=frag,
        frag_pct_at_100=frag[100],
    )


RUNS = (
    PolicyRun("fgd", (_result(1, 95.0), _result(2, 94.0))),
    PolicyRun("bestfit", (_result(1, 92.0), _result(2, 93.0))),
)


def _legend(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None
    return [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize(
    ("seeds", "text"),
    [
        ((42,), "seed 42"),
        ((42, 43, 44), "seeds 42–44"),
        ((5, 9), "seeds 5, 9"),
        ((1, 3, 5, 7, 9, 11, 13), "seeds 1, 3, 5, … (7 seeds)"),
    ],
)
def test_seed_text(seeds: tuple[int, ...], text: str) -> None:
    assert seed_text(seeds) == text


def test_one_document_shape_for_one_policy_or_many() -> None:
    many = document(RUNS, SETUP, {})
    one = document(RUNS[:1], SETUP, {})
    assert set(many) == set(one) == {"version", "trace", "seeds", "config", "tune", "policies"}
    assert list(many["policies"]) == ["fgd", "bestfit"] and list(one["policies"]) == ["fgd"]
    assert one["policies"]["fgd"] == many["policies"]["fgd"]
    fgd = one["policies"]["fgd"]
    assert fgd["mean_alloc_pct_at_100"] == 94.5 and fgd["sd_alloc_pct_at_100"] == 0.5
    assert fgd["mean_frag_pct_at_100"] == pytest.approx(4.0)
    assert one["trace"]["gpu_count"] == 8 and one["seeds"] == [1, 2]


def test_the_figure_names_what_was_replayed_and_shows_bands_and_fragmentation() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(RUNS, SETUP, {"fgd": 95.23})
    try:
        alloc, frag = fig.axes[:2]
        title = alloc.get_title()
        for part in ("nodes.csv", "pods.csv", "seeds 1–2", "policies fgd, bestfit", "bench.yaml"):
            assert part in title
        assert "/x/" not in title  # file names, not paths
        legend = _legend(alloc)
        assert legend[0] == "fgd (mean of 2 seeds, band: min–max)"
        assert len(alloc.collections) >= 2 and len(frag.collections) == 2  # a band per policy
        # The band spans the seeds: at arrived = 100 % from 94 to 95 for fgd.
        line = alloc.lines[0]
        xs = cast("Sequence[float]", line.get_xdata())
        ys = cast("Sequence[float]", line.get_ydata())
        assert ys[list(xs).index(100)] == 94.5
        assert "fragment" in frag.get_ylabel()
        assert frag.get_xlim()[0] == 0
    finally:
        plt.close(fig)


def test_one_seed_draws_no_band_and_a_default_config_says_so() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setup = Setup(trace={"cluster": "dump.json"}, seeds=(7,), config="defaults", tune=1.3)
    fig = figure([PolicyRun("fgd", (_result(7, 95.0),))], setup, {})
    try:
        alloc, frag = fig.axes[:2]
        assert "cluster dump.json" in alloc.get_title()
        assert "seed 7 · policy fgd · config defaults" in alloc.get_title()
        assert _legend(alloc)[0] == "fgd (mean of 1 seed)"
        assert not frag.collections
    finally:
        plt.close(fig)
