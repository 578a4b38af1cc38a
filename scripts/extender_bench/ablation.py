"""What each accelerator earns: serve run with some of them switched off (`--off`), and the
comparison `scripts/bench-ablation` prints.

Owns the names of the switches as the bench takes them (the configuration's keys under
`accelerators`, from the settings class itself), the serve configuration a run with some of them
off uses (the `--serve-config` file, if any, with those keys set to false), and the summary of
an ablation: for every configuration, the median over its runs of filter+prioritize p50 over the
floor's and of pods/s over the floor's (each run's own floor, measured alternately with serve);
and for every accelerator the gain all-on shows over that one off, with the verdict: keep where
it gains at least `KEEP_GAIN` on either measure.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from extender.config import AcceleratorSettings
from extender.config_schema import camel

#: Every switch, by its configuration key (`nativeFit`, `fastPath`, ...).
SWITCHES: Final = tuple(camel(f.name) for f in dataclasses.fields(AcceleratorSettings))
#: The least gain (a fraction) on filter+prioritize p50 or pods/s that keeps an accelerator.
KEEP_GAIN: Final = 0.05
#: The label of the run with every accelerator on.
ALL_ON: Final = "all on"


def parse_off(text: str) -> tuple[str, ...]:
    """`--off`'s comma-separated switch names; ValueError naming an unknown one."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in SWITCHES:
            raise ValueError(f"unknown accelerator {name!r}; known: {', '.join(SWITCHES)}")
    return names


def serve_config_text(base: Path | None, off: Sequence[str]) -> str:
    """The serve configuration with the switches `off` set to false, over `base`'s document
    (None: the defaults). Raises OSError or ValueError for a base that cannot be read."""
    doc: Any = {}
    if base is not None:
        doc = yaml.safe_load(base.read_text()) or {}
        if not isinstance(doc, dict):
            raise ValueError(f"{base}: not a mapping of sections")
    section = doc.setdefault("accelerators", {})
    if not isinstance(section, dict):
        raise ValueError(f"{base}: accelerators is not a mapping")
    section.update(dict.fromkeys(off, False))
    return yaml.safe_dump(doc, sort_keys=True)


def label(off: Sequence[str]) -> str:
    """A configuration's name in the summary: all on, or which switches are off."""
    return f"{', '.join(off)} off" if off else ALL_ON


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One configuration's medians over its runs."""

    label: str
    runs: int
    #: filter+prioritize p50, serve's over the floor's.
    pair_ratio: float
    pods_per_s: float
    #: pods/s, serve's over the floor's.
    pods_ratio: float
    #: bind p50, serve's over the floor's (an accelerator may move work from the scheduler's
    #: serial path into the binds).
    bind_ratio: float = 0.0


def _p50_ratio(report: Mapping[str, Any], key: str) -> float:
    ext, floor = report["extender"].get(key), report["floor"].get(key)
    if not ext or not floor or not floor.get("p50"):
        return 0.0
    return float(ext["p50"] / floor["p50"])


def _ratios(report: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """A run's (pair p50 / floor's, serve's pods/s, pods/s / floor's, bind p50 / floor's)."""
    ext, floor = report["extender"], report["floor"]
    pods, floor_pods = ext["pods_per_s"] or 0.0, floor["pods_per_s"] or 0.0
    pair = _p50_ratio(report, "pair_ms")
    return pair, pods, (pods / floor_pods if floor_pods else 0.0), _p50_ratio(report, "bind_ms")


def summarise(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Row]:
    """Medians per configuration (label → its runs' bench reports), in the order given."""
    rows = []
    for name, reports in runs.items():
        measured = [_ratios(r) for r in reports]
        rows.append(
            Row(
                name,
                len(measured),
                statistics.median(m[0] for m in measured),
                statistics.median(m[1] for m in measured),
                statistics.median(m[2] for m in measured),
                statistics.median(m[3] for m in measured),
            )
        )
    return rows


def verdicts(rows: Sequence[Row]) -> list[tuple[str, float, float, float, bool]]:
    """Per configuration with one switch off: (switch, gain on filter+prioritize p50, gain on
    pods/s, gain on bind p50, keep). A gain is what all-on does better than that one off, as a
    fraction: the off run's p50 ratio over all-on's less one; all-on's pods/s ratio over the off
    run's less one. An accelerator stays where it gains `KEEP_GAIN` on filter+prioritize p50 or
    pods/s, the scheduler's serial path; the bind's gain is shown, not counted: an accelerator
    that only moves work from that path into the binds has not earned its place."""
    by_label = {r.label: r for r in rows}
    on = by_label[ALL_ON]
    out = []
    for switch in SWITCHES:
        off = by_label.get(label((switch,)))
        if off is None:
            continue
        pair_gain = off.pair_ratio / on.pair_ratio - 1 if on.pair_ratio else 0.0
        pods_gain = on.pods_ratio / off.pods_ratio - 1 if off.pods_ratio else 0.0
        bind_gain = off.bind_ratio / on.bind_ratio - 1 if on.bind_ratio else 0.0
        keep = max(pair_gain, pods_gain) >= KEEP_GAIN
        out.append((switch, pair_gain, pods_gain, bind_gain, keep))
    return out


#: The C accelerators: no-ops in the pure build, where their rows measure noise.
C_SWITCHES: Final = ("nativeFit", "nativeWriter")


def render(rows: Sequence[Row], *, builds: Sequence[str] = ("mypyc",)) -> str:
    """The summary as text: the medians, then the verdict per accelerator. `builds`: the
    builds serve ran (the bench's runtime.build), to say where the C switches did nothing."""
    lines = []
    if any(b != "mypyc" for b in builds):
        lines.append(
            f"serve ran the pure build ({', '.join(sorted(set(builds)))}): "
            f"{' and '.join(C_SWITCHES)} change nothing there, their rows are noise"
        )
    head = f"{'configuration':28}{'runs':>5}{'pair p50 / floor':>18}{'pods/s':>9}{'/ floor':>9}"
    lines += [head + f"{'bind p50 / floor':>18}"]
    for r in rows:
        lines.append(
            f"{r.label:28}{r.runs:>5}{r.pair_ratio:>17.2f}x{r.pods_per_s:>9.0f}"
            f"{r.pods_ratio:>8.2f}x{r.bind_ratio:>17.2f}x"
        )
    lines.append("")
    lines.append(
        "gain of each accelerator (all on against it off; "
        f"keep at {KEEP_GAIN:.0%} on pair p50 or pods/s):"
    )
    for switch, pair_gain, pods_gain, bind_gain, keep in verdicts(rows):
        lines.append(
            f"  {switch:20} filter+prioritize p50 {pair_gain:+7.1%}   pods/s {pods_gain:+7.1%}   "
            f"bind p50 {bind_gain:+7.1%}   " + ("KEEP" if keep else "REMOVE (below the bar)")
        )
    return "\n".join(lines) + "\n"
