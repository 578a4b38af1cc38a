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


def _sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Section → its (key, reason) rows."""
    sections: dict[str, list[tuple[str, str]]] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        name = part.split("\n", 1)[0].strip("`")
        rows = re.findall(r"^\| `([A-Za-z.]+)` \| `.*?` \| (.+) \|$", part, flags=re.M)
        sections[name] = rows
    return sections


def test_no_description_is_a_python_repr_or_cut_off_or_repeated() -> None:
    text = document()
    # A dataclass without a docstring has its signature as __doc__: never a description.
    assert "Settings(" not in text and "Literal[" not in text
    for section, rows in _sections(text).items():
        reasons = [reason for _, reason in rows]
        repeated = {r for r in reasons if reasons.count(r) > 1}
        assert not repeated, f"{section}: one reason on several keys: {repeated}"
        for key, reason in rows:
            # Whole sentences: the first line of a docstring is no description.
            assert reason.rstrip().endswith((".", ")", "`")), f"{key}: {reason!r}"
    by_key = dict(row for rows in _sections(text).values() for row in rows)
    assert by_key["tls.certFile"] != by_key["tls.keyFile"]


def test_no_name_from_the_code_leaks_into_a_description() -> None:
    import extender.config
    import extender.packing.policies

    text = document()
    for module in (extender.config, extender.packing.policies):
        constants = {n for n in vars(module) if re.fullmatch(r"_?[A-Z][A-Z0-9_]{3,}", n)}
        assert not {n for n in constants if re.search(rf"\b{n}\b", text)}, module.__name__
    # The policy row names every policy instead.
    rows = dict(row for rows in _sections(text).values() for row in rows)
    assert all(
        f'"{name}"' in rows["policy.name"] for name in extender.packing.policies.POLICY_NAMES
    )


def test_a_class_or_key_without_its_own_description_is_an_error() -> None:
    import dataclasses

    import pytest

    from extender.config_doc import MissingDoc, _class_doc, _rows

    @dataclasses.dataclass
    class Bare:
        level: str = "info"

    with pytest.raises(MissingDoc, match="Bare has no docstring"):
        _class_doc(Bare)
    with pytest.raises(MissingDoc, match=r"Bare.level \(x.level\) has no #: comment"):
        list(_rows(Bare, {"level": ("level", str)}, "x"))
