"""What the subcommands share: the configuration file they read, the flag types they parse, the
stop signal the long-running ones wait for, and the progress line the batch ones draw."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
from collections.abc import Callable
from typing import ClassVar, TextIO, TypeVar

from extender import logs
from extender.config import Config, ConfigError, load_config

Number = TypeVar("Number", int, float)


def read_config(path: str | None) -> Config:
    """The configuration at `path`, or the defaults without one. Raises ConfigError."""
    return load_config(path) if path else Config.default()


def config_problem(path: str | None, exc: ConfigError) -> str:
    """One line naming the file and every problem found in it."""
    return f"invalid configuration {path}: " + "; ".join(exc.problems)


def configured(
    path: str | None, *, log_level: str | None, say: Callable[[str], object]
) -> Config | None:
    """The configuration at `path` (the defaults without one), with the process's logging set
    from it; None where the file is invalid, its problems said through `say`."""
    try:
        config = read_config(path)
    except ConfigError as exc:
        say(config_problem(path, exc))
        return None
    logs.configure(config.logging, level=log_level)
    return config


def number(
    text: str, cast: Callable[[str], Number], ok: Callable[[Number], bool], problem: str
) -> Number:
    """What an argparse number type returns: `text` read by `cast` (int or float), where `ok`
    holds of it; otherwise argparse's one-line usage error, the text quoted, then `problem`."""
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}{problem}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r}{problem}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    return number(text, float, lambda v: 0 < v < math.inf, " is not a positive number of seconds")


def stop_signal() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets (where the running loop can take signal handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


class ProgressLine:
    """One line of progress redrawn in place on a terminal; silent when the stream is not one
    (a pipe, a file, a CI log), where a redrawn line would only be noise."""

    WIDTH: ClassVar[int] = 30

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self._longest = 0

    def bar(self, frac: float) -> str:
        """`frac` (0..1) of the bar filled."""
        filled = int(min(max(frac, 0.0), 1.0) * self.WIDTH)
        return "[" + "#" * filled + "." * (self.WIDTH - filled) + "]"

    def show(self, text: str) -> None:
        """Draw `text` over the line drawn before."""
        if self.enabled:
            self._longest = max(self._longest, len(text))
            self.stream.write("\r" + text)
            self.stream.flush()

    def close(self) -> None:
        """Clear the line for what is printed next."""
        if self.enabled:
            self.stream.write("\r" + " " * self._longest + "\r")
            self.stream.flush()
