"""Nothing in the repository points at a file outside it: no text, message or comment cites the
old design notes or reference folder that users do not have, or a path above the repository.
docs/design.md is the project's own design document; cite it instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What points outside (written in pieces, so that this file does not match itself).
OUTSIDE = re.compile(
    "|".join([r"DESIGN" + r"\.md", "DESIGN" + " §", "reference" + "/", r"\.\./" + "shared"])
)
#: Files that still carried such a reference when this test was written, outside the docs,
#: deploy/ roots, config/ and scripts/ that were cleaned with it: the sweep of extender/ and
#: tests/ (and the admission files being rewritten beside it) removes them. THIS LIST MUST
#: SHRINK TO EMPTY: delete a file's line as soon as it is clean (the test fails on a listed file
#: that no longer needs it, so the list cannot go stale).
NOT_YET_CLEAN = frozenset(
    [
        "deploy/base/admission-policy.yaml",
        "deploy/base/webhook-configuration.yaml",
        "deploy/monitoring/prometheus-rule.yaml",
        "extender/agent/cli.py",
        "extender/agent/inventory.py",
        "extender/agent/mps.py",
        "extender/agent/podresources.py",
        "extender/cluster/__init__.py",
        "extender/config.py",
        "extender/config_cli.py",
        "extender/http/__init__.py",
        "extender/http/demo_pods.py",
        "extender/http/fairness.py",
        "extender/http/listener.py",
        "extender/http/logs.py",
        "extender/http/priorities.py",
        "extender/http/serve_cli.py",
        "extender/http/tls.py",
        "extender/kube/__init__.py",
        "extender/metrics.py",
        "extender/packing/codec.py",
        "extender/packing/codec_labels.py",
        "extender/packing/evaluate.py",
        "extender/packing/fit.py",
        "extender/packing/ledger.py",
        "extender/packing/podspec.py",
        "extender/packing/state.py",
        "extender/packing/view.py",
        "extender/service/__init__.py",
        "extender/service/binding.py",
        "extender/service/core.py",
        "extender/service/cycle.py",
        "extender/service/forecast.py",
        "extender/webhook/__init__.py",
        "extender/webhook/admission.py",
        "extender/webhook/cli.py",
        "tests/agent/fake_mps_control.py",
        "tests/http/test_connections.py",
        "tests/http/test_fairness.py",
        "tests/packing/test_fit.py",
        "tests/packing/test_podspec.py",
        "tests/packing/test_state.py",
        "tests/scenarios/test_truth_rules.py",
        "tests/test_admission_policy.py",
        "tests/test_layout.py",
        "tests/test_serve_simulate_agree.py",
    ]
)


def _files() -> list[str]:
    """Every file git tracks or would track (ignored ones left out), relative to the root."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    return sorted({p for p in listed.stdout.decode().split("\0") if p and (ROOT / p).is_file()})


def _referring() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for rel in _files():
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        lines = [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                 if OUTSIDE.search(line)]  # fmt: skip
        if lines:
            found[rel] = lines
    return found


def test_nothing_points_outside_the_repository() -> None:
    found = _referring()
    new = [line for rel, lines in found.items() if rel not in NOT_YET_CLEAN for line in lines]
    assert not new, "references to files outside the repository:\n" + "\n".join(new)


def test_the_list_of_files_not_yet_clean_only_shrinks() -> None:
    clean = sorted(NOT_YET_CLEAN - set(_referring()))
    assert not clean, f"clean now, remove from NOT_YET_CLEAN: {clean}"


def test_the_pattern_finds_each_kind_of_reference() -> None:
    for text in (
        "see DESIGN" + ".md",
        "(DESIGN" + " §5a rule 3)",
        "reference" + "/x.md",
        "../" + "shared/traces",
    ):
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("docs/design.md, truth rule 3")
