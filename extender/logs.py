"""Process logging as the configuration's `logging` section says (docs/design.md, Configuration): a
level, and one line per record either as text for terminals or as JSON with stable keys for log
indexers.

Owns the record format. JSON lines carry `time`, `level`, `logger`, `message`, and, when the
caller passed them through `extra=`, the keys `pod`, `node`, `gpu`, `verb` and `outcome`; an
exception adds `error` (its one-line text), never a multi-line traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Final

import orjson

from extender.config import LoggingSettings

#: Keys a caller may attach to a record (`log.info(..., extra={"pod": "ns/name"})`).
CONTEXT_KEYS: Final = ("pod", "node", "gpu", "verb", "outcome")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, keys as the module docstring lists them."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line["error"] = f"{type(exc).__name__}: {exc}"
        return orjson.dumps(line, default=str).decode()


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the moment of each record (not the one it was
    built with), so that a replaced stderr (tests, embedders) never receives a closed file."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


#: The levels `logging.level` and every command's `--log-level` accept.
LEVELS: Final = ("debug", "info", "warning", "error")


def add_level_argument(
    parser: argparse.ArgumentParser, *, help: str = "override the configuration's logging.level"
) -> None:
    """Every command's `--log-level` flag (None: the configuration decides)."""
    parser.add_argument("--log-level", default=None, choices=LEVELS, help=help)


def configure(settings: LoggingSettings, *, level: str | None = None) -> None:
    """Install the root handler for `settings` (a `--log-level` flag, when given, wins)."""
    handler = _Stderr()
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or settings.level).upper())
