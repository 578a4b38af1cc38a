"""The MPS control daemon supervisor against the fake control binary (a real child process):
start and defaults, restarts with capped backoff, hung daemons, foreign daemons, watch-only
mode, and a bounded stop that leaves no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from extender.agent.mps import (
    NOT_FOUND,
    PID_FILE,
    ControlCommandFailed,
    ControlDaemon,
    DaemonHealth,
)
from extender.config_agent import MpsDaemonSettings
from tests.agent.fake_mps_control import commands, log_entries, starts, write_wrapper

#: Generous bound for anything that should happen "at once": a loaded 2-core CI machine.
SLACK_S = 2.0


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return write_wrapper(tmp_path)


@pytest.fixture
def settings(binary: Path, tmp_path: Path) -> MpsDaemonSettings:
    return MpsDaemonSettings(
        control_binary=str(binary),
        log_directory=str(tmp_path / "log" / "mps"),
        exclusive_process=False,
        health_interval_seconds=0.1,
        # Generous: each command starts a Python process, which takes well over 0.5 s on a
        # loaded 2-core machine; the hang tests wait for it, the others never do.
        command_timeout_seconds=2.0,
        restart_backoff_seconds=0.2,
        restart_backoff_max_seconds=0.8,
        stable_after_seconds=60.0,
        foreign_pipe_directories=(str(tmp_path / "foreign"),),
    )


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    return tmp_path / "run" / "nvidia-mps"


def log_dir(settings: MpsDaemonSettings) -> Path:
    return Path(settings.log_directory)


def hook(pipe: Path, name: str, content: str) -> None:
    """Drop one of the fake's test hooks (`fake-die`, `fake-hang`) into `pipe`."""
    pipe.mkdir(parents=True, exist_ok=True)
    (pipe / name).write_text(content)


def unhook(pipe: Path, name: str) -> None:
    (pipe / name).unlink()


def exists(path: Path) -> bool:
    return path.exists()


async def until_started(settings: MpsDaemonSettings, count: int) -> None:
    """Until the fake has logged `count` daemon starts."""
    async with asyncio.timeout(10):
        while len(starts(log_dir(settings))) < count:  # noqa: ASYNC110 (polls a log file)
            await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan nobody reaps still has a pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@contextlib.asynccontextmanager
async def running(daemon: ControlDaemon) -> AsyncIterator[ControlDaemon]:
    task = asyncio.create_task(daemon.run())
    try:
        yield daemon
    finally:
        task.cancel()
        # Bounded: a run() that swallowed its cancellation fails the test instead of hanging it.
        await asyncio.wait([task], timeout=SLACK_S)
        ended = task.done()
        await daemon.stop()
        assert ended, "run() did not end when cancelled"


async def until(
    daemon: ControlDaemon, predicate: Callable[[DaemonHealth], bool], limit_s: float = 8.0
) -> DaemonHealth:
    async with asyncio.timeout(limit_s):
        while not predicate(health := daemon.health()):
            await daemon.changed()
    return health


def state_is(state: str) -> Callable[[DaemonHealth], bool]:
    return lambda h: h.state == state


async def started_outside(binary: Path, pipe: Path, logs: Path) -> asyncio.subprocess.Process:
    """A fake daemon started by someone else in `pipe`, once it has written its pid file."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    proc = await asyncio.create_subprocess_exec(str(binary), "-f", env=env)
    async with asyncio.timeout(SLACK_S):
        while not exists(pipe / PID_FILE):  # noqa: ASYNC110 (polls a file)
            await asyncio.sleep(0.02)
    return proc


async def test_start_sets_the_defaults_in_the_configured_directories(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    # The environment given overrides nothing of ours: the pipe directory is the configured one.
    env = {"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": "/nonexistent"}
    daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False, env=env)
    assert daemon.health().state == "off"
    async with running(daemon):
        health = await until(daemon, state_is("ready"))
        assert health.pid == int((pipe / PID_FILE).read_text())
        assert health.restarts == 0
        for directory in (pipe, pipe.parent, log_dir(settings), log_dir(settings).parent):
            assert directory.stat().st_mode & 0o777 == 0o755
        assert await daemon.command("get_default_active_thread_percentage") == "100.0"
    sent = commands(log_dir(settings))
    assert "set_default_active_thread_percentage 100" in sent
    assert not [c for c in sent if "pinned_mem_limit" in c]
    assert sent.index("get_server_list") < sent.index("set_default_active_thread_percentage 100")
    assert daemon.health() == DaemonHealth(state="off", reason="stopped", pid=None, restarts=0)
    assert not alive(health.pid)


@pytest.mark.parametrize(
    ("multi_user", "argv"), [(True, ["-f", "-multiuser-server"]), (False, ["-f"])]
)
async def test_multi_user_flag_only_when_asked(
    settings: MpsDaemonSettings, pipe: Path, multi_user: bool, argv: list[str]
) -> None:
    async with running(
        ControlDaemon(settings, pipe_directory=str(pipe), multi_user=multi_user)
    ) as d:
        await until(d, state_is("ready"))
    [start] = starts(log_dir(settings))
    assert start.message == f"Starting control daemon: argv={argv!r}".replace("'", '"')


async def test_a_dead_daemon_is_reported_and_restarted_after_the_backoff(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        first = await until(d, state_is("ready"))
        hook(pipe, "fake-die", "once")
        down = await until(d, state_is("down"))
        went_down = time.time()
        assert "exited with status 1" in down.reason
        again = await until(d, state_is("ready"))
        assert again.restarts == 1
        assert again.pid not in (None, first.pid)
        assert first.pid is not None and not alive(first.pid)
    second_start = starts(log_dir(settings))[1]
    # The log's clock has millisecond precision.
    assert second_start.time - went_down >= settings.restart_backoff_seconds - 0.01


async def test_a_hung_daemon_is_reported_within_a_probe_and_replaced(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        first = await until(d, state_is("ready"))
        hung_at = time.monotonic()
        hook(pipe, "fake-hang", "once")
        down = await until(d, state_is("down"))
        elapsed = time.monotonic() - hung_at
        assert f"did not answer within {settings.command_timeout_seconds:g} s" in down.reason
        # The first probe after the hook hangs, however soon after it began.
        bound = settings.command_timeout_seconds + settings.health_interval_seconds
        assert settings.command_timeout_seconds <= elapsed + 0.05 < bound + SLACK_S
        again = await until(d, state_is("ready"))
        assert again.restarts == 1 and again.pid != first.pid
        assert first.pid is not None and not alive(first.pid)


async def test_backoff_doubles_per_failure_and_is_capped(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    hook(pipe, "fake-die", "always")  # every start dies at once
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        await until_started(settings, 5)
        # The fifth start's failure is published once it has been seen to exit.
        health = await until(d, lambda h: h.restarts >= 4)
        assert health.state == "down" and "status 1 on start" in health.reason
    times = [s.time for s in starts(log_dir(settings))[:5]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    expected = [0.2, 0.4, 0.8, 0.8]
    # Never sooner than the backoff (the log clock has millisecond precision) ...
    for gap, delay in zip(gaps, expected, strict=True):
        assert gap >= delay - 0.01, (gaps, expected)
    # ... and the overhead of a start is far below the step between backoffs: the first is not
    # already the cap, and the last is capped (doubling again would be 1.6 s).
    assert gaps[0] < 0.8, gaps
    assert gaps[3] < 1.6, gaps


async def test_backoff_resets_after_a_stable_run(settings: MpsDaemonSettings, pipe: Path) -> None:
    settings = replace(settings, restart_backoff_max_seconds=10.0, stable_after_seconds=0.5)
    hook(pipe, "fake-die", "always")
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        await until_started(settings, 3)
        unhook(pipe, "fake-die")  # the fourth start, 0.8 s later, lives
        await until(d, state_is("ready"))
        await asyncio.sleep(settings.stable_after_seconds + 0.2)
        hook(pipe, "fake-die", "once")
        await until(d, state_is("down"))
        went_down = time.time()
        await until(d, state_is("ready"))
    gap = starts(log_dir(settings))[4].time - went_down
    # Reset: the first backoff again, not the fifth (1.6 s... doubling from 0.2 four times).
    assert settings.restart_backoff_seconds - 0.01 <= gap < 1.2


async def test_a_live_daemon_in_a_foreign_directory_is_never_fought(
    settings: MpsDaemonSettings, pipe: Path, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign" / "nvidia.com-gpu" / "pipe"
    foreign.mkdir(parents=True)
    other = await asyncio.create_subprocess_exec("sleep", "30")
    (foreign / PID_FILE).write_text(f"{other.pid}\n")
    try:
        async with running(
            ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
        ) as d:
            health = await until(d, state_is("foreign"))
            assert f"pid {other.pid}" in health.reason and str(foreign) in health.reason
            await asyncio.sleep(settings.health_interval_seconds * 4)
            assert d.health().state == "foreign"
            assert starts(log_dir(settings)) == []
            assert other.returncode is None and alive(other.pid)
            other.kill()
            await other.wait()
            health = await until(d, state_is("ready"))
            assert health.restarts == 0
        assert len(starts(log_dir(settings))) == 1
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()


async def test_a_daemon_not_ours_in_our_pipe_directory_is_left_alone(
    settings: MpsDaemonSettings, binary: Path, pipe: Path
) -> None:
    other = await started_outside(binary, pipe, log_dir(settings))
    try:
        async with running(
            ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
        ) as d:
            health = await until(d, state_is("foreign"))
            assert f"pid {other.pid}" in health.reason
            await asyncio.sleep(settings.health_interval_seconds * 4)
            assert other.returncode is None
            assert [s.pid for s in starts(log_dir(settings))] == [other.pid]
            assert commands(log_dir(settings)) == []  # not even probed
            other.terminate()
            await other.wait()
            ours = await until(d, state_is("ready"))
            assert ours.pid != other.pid
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()


async def test_a_stale_pid_file_is_not_a_foreign_daemon(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    hook(pipe, PID_FILE, f"{gone.pid}\n")
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        await until(d, state_is("ready"))


async def test_unmanaged_only_probes_the_pipe_directory(
    settings: MpsDaemonSettings, binary: Path, pipe: Path, tmp_path: Path
) -> None:
    settings = replace(settings, manage=False)
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=True)) as d:
        health = await until(d, state_is("down"))
        assert "Cannot find MPS control daemon process" in health.reason
        assert not exists(pipe) and not exists(log_dir(settings))
        other = await started_outside(binary, pipe, tmp_path / "other-log")
        try:
            health = await until(d, state_is("ready"))
            assert health.pid == other.pid
            await d.stop()  # not ours: stop() must not quit it
            assert d.health().state == "off"
            await asyncio.sleep(settings.health_interval_seconds * 2)
            assert other.returncode is None
            assert "quit" not in commands(tmp_path / "other-log")
        finally:
            other.terminate()
            await other.wait()
    assert not log_dir(settings).exists()


async def test_unmanaged_reports_a_daemon_going_away_and_starts_nothing(
    settings: MpsDaemonSettings, binary: Path, pipe: Path
) -> None:
    settings = replace(settings, manage=False)
    other = await started_outside(binary, pipe, log_dir(settings))
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        await until(d, state_is("ready"))
        other.terminate()
        await other.wait()
        await until(d, state_is("down"))
        await asyncio.sleep(settings.health_interval_seconds * 4)
        assert d.health().state == "down"
    assert len(starts(log_dir(settings))) == 1


@pytest.mark.parametrize("ignores_sigterm", [False, True])
async def test_stop_is_bounded_when_the_daemon_hangs_and_leaves_no_process(
    settings: MpsDaemonSettings, pipe: Path, ignores_sigterm: bool
) -> None:
    # Probes far apart: the hang is met by stop(), not by the health probe.
    settings = replace(settings, health_interval_seconds=30.0)
    daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
    async with running(daemon):
        ready = await until(daemon, state_is("ready"))
        await daemon.command("start_server -uid 1000")
        [server] = [int(p) for p in (await daemon.command("get_server_list")).split()]
        assert alive(server)
        hook(pipe, "fake-hang", "always")
        if ignores_sigterm:
            hook(pipe, "fake-ignore-term", "always")
        with pytest.raises(ControlCommandFailed) as failed:
            await daemon.command("get_server_list")
        assert failed.value.returncode is None
        began = time.monotonic()
        await daemon.stop()
        assert time.monotonic() - began < 4.0
    assert daemon.health().state == "off"
    assert ready.pid is not None and not alive(ready.pid)
    # SIGTERM'd, the daemon left its server behind; the process group took it too.
    assert not alive(server)
    assert any("SIGTERM ignored" in e.message for e in log_entries(log_dir(settings))) == (
        ignores_sigterm
    )


async def test_stop_quits_a_healthy_daemon_and_its_servers(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
    async with running(daemon):
        ready = await until(daemon, state_is("ready"))
        await daemon.command("start_server -uid 1000")
        [server] = [int(p) for p in (await daemon.command("get_server_list")).split()]
        began = time.monotonic()
        await daemon.stop()
        assert time.monotonic() - began < SLACK_S
    assert commands(log_dir(settings))[-1] == "quit"
    assert ready.pid is not None and not alive(ready.pid) and not alive(server)
    assert not (pipe / PID_FILE).exists()


async def test_command_failures_are_typed(settings: MpsDaemonSettings, pipe: Path) -> None:
    daemon = ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)
    with pytest.raises(ControlCommandFailed) as nothing_listens:
        await daemon.command("get_server_list")
    assert nothing_listens.value.returncode == 1
    assert "Cannot find MPS control daemon process" in nothing_listens.value.output
    missing = ControlDaemon(
        replace(settings, control_binary=str(pipe / "absent")),
        pipe_directory=str(pipe),
        multi_user=False,
    )
    with pytest.raises(ControlCommandFailed) as not_found:
        await missing.command("get_server_list")
    assert not_found.value.returncode == NOT_FOUND
    async with running(missing):
        health = await until(missing, state_is("down"))
        assert "could not start" in health.reason


async def test_a_daemon_that_never_answers_after_its_start_is_a_failed_start(
    settings: MpsDaemonSettings, pipe: Path
) -> None:
    hook(pipe, "fake-hang", "once")  # the first daemon accepts and never answers
    began = time.monotonic()
    async with running(ControlDaemon(settings, pipe_directory=str(pipe), multi_user=False)) as d:
        down = await until(
            d, state_is("down"), limit_s=3 * settings.command_timeout_seconds + SLACK_S
        )
        assert "did not answer after its start" in down.reason
        assert time.monotonic() - began >= 3 * settings.command_timeout_seconds - 0.05
        ready = await until(d, state_is("ready"))
        assert ready.restarts == 1
    # The hung one got no defaults: only the daemon that answered did.
    assert commands(log_dir(settings)).count("set_default_active_thread_percentage 100") == 1
