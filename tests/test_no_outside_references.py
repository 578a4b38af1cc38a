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
    "|".join(
        [
            r"DESIGN" + r"\.md",
            "DESIGN" + " §",
            "reference" + "/",
            # The public trace beside a checkout is fine for scripts to default to; anything
            # else there is not the project's.
            r"\.\./" + r"shared(?!/traces/)",
            # The notes' file names, cited without their folder.
            r"\b(?:fgd-benchmark|mps-and-nvml|extender-protocol|kubelet-device-plugin|"
            + r"peers-lessons|pod-security-baseline)\.md",
        ]
    )
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
    found = [line for lines in _referring().values() for line in lines]
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def test_the_pattern_finds_each_kind_of_reference() -> None:
    for text in (
        "see DESIGN" + ".md",
        "(DESIGN" + " §5a rule 3)",
        "reference" + "/x.md",
        "../" + "shared/DESIGN",
        "../" + "shared/reference",
        "(see " + "mps-and" + "-nvml.md §5)",
    ):
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("docs/design.md, truth rule 3")
    assert not OUTSIDE.search("../" + "shared/traces/openb/openb_pod_list_default.csv")
