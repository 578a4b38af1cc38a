"""The MPS control daemon supervisor (docs/design.md, Architecture): runs `nvidia-cuda-mps-control
-f` as the agent's child in the pipe directory every client shares, sets its defaults, probes its
health, restarts it with capped backoff, and publishes its state (`DaemonHealth`) for the Node.

Owns three rules. Never fight another daemon: a pid file naming a live process that is not our
child (in our pipe directory or a foreign one) is reported as `foreign`, and nothing is started
or killed while it lives. Never block the loop: every command is an asyncio subprocess bounded
by `command_timeout_seconds`, killed when it overruns. Leave nothing behind: the daemon runs in
its own process group, so what it spawned (its MPS servers) goes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from extender.config_agent import MpsDaemonSettings

log = logging.getLogger("mpsched.agent.mps")

DaemonState = Literal["ready", "down", "foreign", "off"]

#: What the daemon writes in its pipe directory (MPS doc §4.1.1).
PID_FILE: Final = "nvidia-cuda-mps-control.pid"
#: Pause between readiness polls of a daemon just started: it listens within milliseconds.
_READY_POLL_S: Final = 0.05
#: A daemon just started gets this many command timeouts to answer its first command.
_READY_TIMEOUTS: Final = 3
#: Each step of stop() (quit, SIGTERM, SIGKILL) waits at most this long: stop is bounded.
_STOP_STEP_S: Final = 1.0
#: ControlCommandFailed.returncode when the binary is missing or not executable (as a shell says).
NOT_FOUND: Final = 127
NOT_EXECUTABLE: Final = 126


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonHealth:
    """The daemon as last seen. `pid`: the daemon's process (ours, or the foreign one);
    `restarts`: how often ours was started again after the first start."""

    state: DaemonState
    reason: str
    pid: int | None
    restarts: int


class ControlCommandFailed(Exception):
    """A control command that did not answer. `returncode` None: it timed out (and was killed);
    otherwise the client's exit status (NOT_FOUND / NOT_EXECUTABLE: it could not be run)."""

    def __init__(self, command: str, returncode: int | None, output: str) -> None:
        self.command, self.returncode, self.output = command, returncode, output
        status = "timed out" if returncode is None else f"exit status {returncode}"
        super().__init__(f"{command!r} failed ({status}): {output}".strip())


def _alive(pid: int) -> bool:
    """Whether `pid` names a process (one of another user's counts: EPERM means it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _find_foreign(pipe_directory: str, foreign: tuple[str, ...]) -> str | None:
    """The live daemon (pid and pid file) found while we run none, or None: with no child of
    ours, any live process a pid file names is another's."""
    files = [Path(pipe_directory) / PID_FILE]
    for directory in map(Path, foreign):
        # NVIDIA's device plugin: <root>/<resource>/pipe (reference §3.4).
        files += [directory / PID_FILE, *sorted(directory.glob(f"*/pipe/{PID_FILE}"))]
    for path in files:
        pid = _read_pid(path)
        if pid is not None and _alive(pid):
            return f"pid {pid} ({path})"
    return None


async def _exited(proc: asyncio.subprocess.Process, seconds: float) -> None:
    """Wait up to `seconds` for `proc` to exit (asyncio.timeout, not wait_for: on 3.11 wait_for
    can swallow a cancellation that meets the process's exit, and run() would never end)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await proc.wait()


def _make_directories(*paths: str) -> None:
    """Create what is missing of each path, each new directory 0o755 whatever the umask: the
    clients (other users' containers under multi-user) must reach the pipe directory."""
    for path in map(Path, paths):
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(exist_ok=True)
            directory.chmod(0o755)


class ControlDaemon:
    """Supervises one control daemon. `run()` until cancelled, then `stop()`; `health()` is the
    latest state, `changed()` waits for the next one. `env`: the environment the daemon and its
    commands start from (the agent's own by default)."""

    def __init__(
        self,
        settings: MpsDaemonSettings,
        *,
        pipe_directory: str,
        multi_user: bool,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = settings
        self._pipe = pipe_directory
        self._multi_user = multi_user
        base = dict(os.environ if env is None else env)
        self._env = {**base, "CUDA_MPS_PIPE_DIRECTORY": pipe_directory}
        self._health = DaemonHealth(state="off", reason="not started", pid=None, restarts=0)
        self._waiters: list[asyncio.Future[DaemonHealth]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._starts = 0
        self._stopping = asyncio.Event()

    def health(self) -> DaemonHealth:
        return self._health

    async def changed(self) -> DaemonHealth:
        waiter: asyncio.Future[DaemonHealth] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _publish(self, state: DaemonState, reason: str = "", *, pid: int | None = None) -> None:
        new = DaemonHealth(state=state, reason=reason, pid=pid, restarts=max(0, self._starts - 1))
        if new == self._health or (self._stopping.is_set() and state != "off"):
            return  # after stop(), only its own "off" is news
        old, self._health = self._health, new
        if (old.state, old.reason) != (state, reason):
            level = logging.INFO if state in ("ready", "off") else logging.WARNING
            log.log(level, "MPS control daemon %s%s", state, f": {reason}" if reason else "")
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(new)

    async def command(self, text: str) -> str:
        """Send one command through the control pipe; its answer. Raises ControlCommandFailed."""
        return await self._command(text, self._settings.command_timeout_seconds)

    async def _command(self, text: str, limit_s: float) -> str:
        binary = self._settings.control_binary
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
            )
        except FileNotFoundError:
            raise ControlCommandFailed(text, NOT_FOUND, f"{binary}: not found") from None
        except PermissionError:
            raise ControlCommandFailed(text, NOT_EXECUTABLE, f"{binary}: not executable") from None
        try:
            async with asyncio.timeout(limit_s):
                out, _ = await proc.communicate(f"{text}\n".encode())
        except TimeoutError:
            raise ControlCommandFailed(text, None, f"no answer within {limit_s:g} s") from None
        finally:
            if proc.returncode is None:  # timed out or cancelled: the client must not linger
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await _exited(proc, _STOP_STEP_S)
        output = " ".join(out.decode(errors="replace").split())
        if proc.returncode != 0:
            raise ControlCommandFailed(text, proc.returncode, output)
        return output

    async def _pause(self, seconds: float, proc: asyncio.subprocess.Process | None = None) -> None:
        """Sleep `seconds`, waking early when stop() is called or `proc` exits."""
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._stopping.wait())]
        if proc is not None:
            waits.append(asyncio.ensure_future(proc.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()

    async def run(self) -> None:
        """Supervise (or, with manage False, only watch) until cancelled or stopped."""
        if not self._settings.manage:
            await self._watch_only()
            return
        s = self._settings
        failures = 0
        while not self._stopping.is_set():
            try:
                async with asyncio.timeout(s.command_timeout_seconds):
                    foreign = await asyncio.to_thread(
                        _find_foreign, self._pipe, s.foreign_pipe_directories
                    )
            except TimeoutError:
                self._publish("down", "could not read the MPS pid files in time")
                await self._pause(s.health_interval_seconds)
                continue
            if foreign is not None:
                # Not ours to start beside or to kill: report it, look again next interval.
                self._publish("foreign", f"another MPS control daemon runs: {foreign}")
                await self._pause(s.health_interval_seconds)
                continue
            reason = await self._start()
            if reason is None:
                ready_at = asyncio.get_running_loop().time()
                reason = await self._watch()
                if asyncio.get_running_loop().time() - ready_at >= s.stable_after_seconds:
                    failures = 0
            if self._stopping.is_set():
                return
            self._publish("down", reason)
            await self._terminate()
            failures += 1
            delay = min(
                s.restart_backoff_seconds * 2 ** (failures - 1), s.restart_backoff_max_seconds
            )
            log.info("restarting the MPS control daemon in %.1fs (failure %d)", delay, failures)
            await self._pause(delay)

    async def _start(self) -> str | None:
        """Start our daemon and set its defaults; None when it is ready, else why not."""
        s = self._settings
        flags = [s.multi_user_flag] if self._multi_user else []
        env = {**self._env, "CUDA_MPS_LOG_DIRECTORY": s.log_directory}
        try:
            await asyncio.to_thread(_make_directories, self._pipe, s.log_directory)
            self._proc = await asyncio.create_subprocess_exec(
                s.control_binary,
                "-f",
                *flags,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # its own group: stop() kills what it spawned
            )
        except OSError as exc:
            return f"could not start {s.control_binary}: {exc.strerror or exc}"
        self._starts += 1
        proc = self._proc
        if self._stopping.is_set():  # stop() came while the child was spawned, and missed it
            await self._terminate()
            return "stopped"
        deadline = asyncio.get_running_loop().time() + _READY_TIMEOUTS * s.command_timeout_seconds
        while True:
            if self._stopping.is_set():  # stop() takes care of the child
                return "stopped"
            if proc.returncode is not None:
                return f"the MPS control daemon exited with status {proc.returncode} on start"
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return "the MPS control daemon did not answer after its start"
            try:
                await self._command("get_server_list", min(left, s.command_timeout_seconds))
                break
            except ControlCommandFailed:
                await self._pause(_READY_POLL_S, proc)
        # Each client's environment then decides its share; no pinned-memory default is set.
        try:
            await self.command("set_default_active_thread_percentage 100")
        except ControlCommandFailed as exc:
            return f"could not set the default active thread percentage: {exc}"
        self._publish("ready", pid=proc.pid)
        return None

    async def _watch(self) -> str:
        """Probe our ready daemon every interval; why it went down."""
        proc, s = self._proc, self._settings
        assert proc is not None
        while True:
            await self._pause(s.health_interval_seconds, proc)
            if self._stopping.is_set():
                return "stopped"
            if proc.returncode is not None:
                return f"the MPS control daemon exited with status {proc.returncode}"
            try:
                await self.command("get_server_list")
            except ControlCommandFailed as exc:
                # A daemon dying under the probe: name its death, not the probe's.
                await _exited(proc, _READY_POLL_S * 2)
                if proc.returncode is not None:
                    return f"the MPS control daemon exited with status {proc.returncode}"
                if exc.returncode is None:
                    timeout = s.command_timeout_seconds
                    return f"the MPS control daemon did not answer within {timeout:g} s"
                return f"the MPS control daemon's health probe failed: {exc}"
            self._publish("ready", pid=proc.pid)

    async def _watch_only(self) -> None:
        """manage False: probe the pipe directory's daemon; start nothing, kill nothing."""
        s = self._settings
        pid_file = Path(self._pipe) / PID_FILE
        while not self._stopping.is_set():
            try:
                await self.command("get_server_list")
            except ControlCommandFailed as exc:
                self._publish("down", f"the MPS control daemon does not answer: {exc}")
            else:
                pid = await asyncio.to_thread(_read_pid, pid_file)
                self._publish("ready", pid=pid)
            await self._pause(s.health_interval_seconds)

    def _signal_group(self, pid: int, signum: int) -> None:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass  # the group is gone already
        except PermissionError:
            log.warning("cannot signal the MPS control daemon's process group %d", pid)

    async def _terminate(self) -> None:
        """Kill what is left of our daemon and its group: SIGTERM, then SIGKILL; bounded."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # Its servers share the group and outlive a daemon killed alone: signal all of it, and
        # SIGKILL whatever is left (a server that ignored SIGTERM, or a daemon that hangs).
        self._signal_group(proc.pid, signal.SIGTERM)
        await _exited(proc, _STOP_STEP_S)
        self._signal_group(proc.pid, signal.SIGKILL)
        await _exited(proc, _STOP_STEP_S)
        # Its pid file would name a pid the system may hand out again: no longer ours to trust.
        pid_file = Path(self._pipe) / PID_FILE
        if await asyncio.to_thread(_read_pid, pid_file) == proc.pid:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(pid_file.unlink)

    async def stop(self) -> None:
        """`quit` our daemon, then SIGTERM/SIGKILL its group; bounded, never raises. Final:
        run() returns without restarting anything. A daemon that is not ours is left alone."""
        self._stopping.set()
        try:
            proc = self._proc
            if proc is not None and proc.returncode is None:
                try:
                    timeout = min(self._settings.command_timeout_seconds, _STOP_STEP_S)
                    await self._command("quit", timeout)
                except ControlCommandFailed as exc:
                    log.warning("MPS control daemon did not quit (%s); terminating it", exc)
                else:
                    await _exited(proc, _STOP_STEP_S)
            await self._terminate()
        except Exception:
            log.exception("stopping the MPS control daemon failed")
        self._publish("off", "stopped")
