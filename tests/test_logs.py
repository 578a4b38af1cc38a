"""`logging` in the configuration is honoured: JSON lines with stable keys, or text."""

from __future__ import annotations

import json
import logging

import pytest

from extender import logs
from extender.config import LoggingSettings


def test_json_lines_carry_stable_keys_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(LoggingSettings(level="info", format="json"))
    log = logging.getLogger("mpsched.test")
    log.debug("not shown at info")
    log.info("bind refused", extra={"pod": "ns/p", "node": "a", "verb": "bind", "outcome": "no"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "bind refused" and first["level"] == "info"
    assert (first["pod"], first["node"], first["verb"], first["outcome"]) == (
        "ns/p",
        "a",
        "bind",
        "no",
    )
    assert {"time", "logger"} <= set(first)
    assert second["error"] == "ValueError: boom"


def test_text_format_and_the_flag_overrides_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(LoggingSettings(level="error", format="text"), level="debug")
    logging.getLogger("mpsched.test").debug("shown")
    err = capsys.readouterr().err
    assert "DEBUG mpsched.test: shown" in err
