"""What the subcommands share: the configuration file they read, the flag types they parse, and
the stop signal the long-running ones wait for."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Callable

from extender import logs
from extender.config import Config, ConfigError, load_config


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


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def stop_signal() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets (where the running loop can take signal handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
