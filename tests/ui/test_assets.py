"""The page's files: each is package data (so `pip install` brings it), each is served with
its type, and none names anything off the extender (no URL with a scheme or a host, no CSS
import): the page needs nothing from the network."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from extender.ui import ASSETS, PAGE

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "extender" / "ui"


def test_every_file_is_served_and_packaged() -> None:
    files = {p.name for p in UI.iterdir() if p.is_file() and p.suffix != ".py"}
    assert files == set(ASSETS) and PAGE in files
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["extender"]
    for name in files:
        assert any(fnmatch.fnmatch(f"ui/{name}", p) for p in patterns), name


def test_nothing_is_loaded_from_elsewhere() -> None:
    for name in ASSETS:
        text = (UI / name).read_text()
        # A URL with a scheme, or a protocol-relative one in a string or url().
        assert not re.search(r"(?i)\b(?:https?|wss?|ftp)://|[\"'(]//", text), name
        assert "@import" not in text and "@font-face" not in text, name
    page = (UI / PAGE).read_text()
    linked = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sorted(linked) == ["data:,", "ui/ui.css", "ui/ui.js"]
