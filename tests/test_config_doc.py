"""docs/configuration.md is what the configuration model says: every key the validator accepts,
with its default and reason, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from extender.config import load_config_text
from extender.config_doc import document

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_reference_is_up_to_date() -> None:
    assert DOC.read_text() == document(), (
        "docs/configuration.md is stale: run `python -m extender.config_doc > "
        "docs/configuration.md`"
    )


def test_every_documented_key_is_accepted_with_its_documented_default() -> None:
    rows = re.findall(r"^\| `([A-Za-z.]+)` \| `(.*?)` \| (.+) \|$", document(), flags=re.M)
    assert len(rows) > 60
    for dotted, default, reason in rows:
        assert reason.strip(), f"{dotted} has no reason"
        *path, key = dotted.split(".")
        text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(path))
        text += f"{'  ' * len(path)}{key}: {default}\n"
        load_config_text(text)  # raises ConfigError naming the key if it is not accepted
