"""A stand-in for NVIDIA's `nvidia-cuda-mps-control`, runnable as a script (stdlib only), so the
agent's daemon supervisor is tested against a real child process that behaves like the real
binary (NVIDIA's MPS guide: the pipe directory, the control commands):

- `-f`: the control daemon in the foreground. It serves a UNIX socket at
  `$CUDA_MPS_PIPE_DIRECTORY/control`, writes `nvidia-cuda-mps-control.pid` there, and logs its
  command line and each command it receives to `$CUDA_MPS_LOG_DIRECTORY/control.log`. A second
  daemon on a pipe directory whose pid file names a live process refuses to start.
- no flag: the client. Commands on stdin, answers on stdout; "Cannot find MPS control daemon
  process" and exit status 1 when nothing listens, status 1 when the daemon goes away mid-answer.

Commands answered as the real daemon does: `get_server_list` (server PIDs, one per line; empty
before any server), `start_server -uid N` (spawns a server process in the daemon's process
group, as the real one does), `get_server_status`, `get_client_list <server>` (the server's
client PIDs, one per line), `terminate_client <server> <client>` (the client leaves the list),
the default active thread percentage and pinned-memory set/get pairs (defaults are lost on
quit), `quit` (stops the servers, removes the pid file, exit 0). SIGTERM ends the daemon but,
like a daemon in trouble, leaves its servers to whoever kills the process group.

Test hooks, files in the pipe directory, so a test can make a running daemon misbehave:
- `fake-hang`: from the next connection on, accept and never answer (sticky until signalled);
- `fake-die`: exit with status 1 at the next command or within ~0.1 s (at once if present at
  start, after the command line is logged);
- `fake-ignore-term`: SIGTERM is ignored (a daemon wedged in the driver): only SIGKILL ends it;
- `fake-servers`: PIDs, one per line, listed by `get_server_list` beside spawned servers;
- `fake-clients`: `<server pid> <client pid>` lines: the clients `get_client_list` lists and
  `terminate_client` removes.
A hook file containing `once` is removed when it takes effect.

Tests run it through `write_wrapper(directory)` (an executable `#!<python>` script) and read what
it logged with `log_entries(log_directory)`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_NAME = "control"
LOG_NAME = "control.log"
CANNOT_FIND = "Cannot find MPS control daemon process"
#: Ends every complete answer on the socket, so the client can tell an empty answer (no
#: servers yet) from a daemon that went away before answering.
_END = b"\0"
_TICK_S = 0.05


def _pipe_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Terminated(Exception):
    pass


class _Daemon:
    def __init__(self, argv: list[str]) -> None:
        self.pipe = _pipe_directory()
        self.log_path = _log_directory() / LOG_NAME
        self.argv = argv
        self.thread_percentage = 100.0
        self.pinned: dict[str, str] = {}
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.hung = False
        self.held: list[socket.socket] = []

    def log(self, message: str) -> None:
        now = datetime.datetime.now()
        stamp = now.strftime("%Y-%m-%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(f"[{stamp} Control {os.getpid()}] {message}\n")

    def hook(self, name: str) -> bool:
        path = self.pipe / name
        try:
            once = path.read_text().strip() == "once"
        except OSError:
            return False
        if once:
            with contextlib.suppress(OSError):
                path.unlink()
        return True

    def die(self) -> NoReturn:
        self.log("Fatal: the control daemon exits (fake-die)")
        os._exit(1)  # no cleanup: a crashed daemon leaves its pid file and socket

    def cleanup(self) -> None:
        for name in (PID_FILE, SOCKET_NAME):
            with contextlib.suppress(OSError):
                (self.pipe / name).unlink()

    def serve(self) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log(f"Starting control daemon: argv={json.dumps(self.argv)}")
        if self.hook("fake-die"):
            self.die()
        try:
            running = int((self.pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            running = 0
        if running > 0 and running != os.getpid() and _alive(running):
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        self.pipe.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            (self.pipe / SOCKET_NAME).unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.pipe / SOCKET_NAME))
        listener.listen(16)
        listener.settimeout(_TICK_S)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")

        def on_term(signum: int, frame: object) -> None:
            if self.hook("fake-ignore-term"):
                self.log("SIGTERM ignored (fake-ignore-term)")
                return
            raise _Terminated

        signal.signal(signal.SIGTERM, on_term)
        try:
            while True:
                if self.hook("fake-die"):
                    self.die()
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                if self.hung or self.hook("fake-hang"):
                    self.hung = True
                    self.held.append(conn)  # accepted, never answered
                    continue
                with conn:
                    if self.answer(conn):
                        self.log("Quit: the control daemon exits")
                        return 0
        except _Terminated:
            self.log("Terminated by SIGTERM")
            return 0
        finally:
            self.cleanup()

    def answer(self, conn: socket.socket) -> bool:
        """Serve one client connection; True when it asked the daemon to quit."""
        conn.settimeout(1.0)
        data = b""
        with contextlib.suppress(TimeoutError, OSError):
            while chunk := conn.recv(4096):
                data += chunk
        replies: list[str] = []
        quit_asked = False
        for line in data.decode(errors="replace").splitlines():
            command = line.strip()
            if not command:
                continue
            self.log(f"Command: {command}")
            if self.hook("fake-die"):
                self.die()
            if command == "quit":
                self.stop_servers()
                quit_asked = True
                break
            replies.append(self.execute(command.split()))
        text = "".join(reply + "\n" for reply in replies if reply)
        with contextlib.suppress(OSError):
            conn.sendall(text.encode() + _END)
        return quit_asked

    def server_pids(self) -> list[int]:
        listed: list[int] = []
        with contextlib.suppress(OSError):
            listed = [int(p) for p in (self.pipe / "fake-servers").read_text().split()]
        return sorted(self.servers) + listed

    def clients(self) -> list[tuple[int, int]]:
        """(server pid, client pid) pairs from `fake-clients`, one pair per line."""
        pairs: list[tuple[int, int]] = []
        with contextlib.suppress(OSError, ValueError):
            for line in (self.pipe / "fake-clients").read_text().splitlines():
                if line.strip():
                    server, client = line.split()
                    pairs.append((int(server), int(client)))
        return pairs

    def write_clients(self, pairs: list[tuple[int, int]]) -> None:
        (self.pipe / "fake-clients").write_text("".join(f"{s} {c}\n" for s, c in pairs))

    def execute(self, words: list[str]) -> str:
        name, args = words[0], words[1:]
        if name == "get_server_list" and not args:
            return "\n".join(str(pid) for pid in self.server_pids())
        if name == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            server = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(3600)"])
            self.servers[server.pid] = server
            self.log(f"Server {server.pid} started for uid {args[1]}")
            return ""
        if name in ("get_server_status", "get_client_list") and len(args) == 1:
            if not args[0].isdigit() or int(args[0]) not in self.server_pids():
                return f"Server {args[0]} not found"
            if name == "get_server_status":
                return "ACTIVE"
            return "\n".join(str(c) for s, c in self.clients() if s == int(args[0]))
        if name == "terminate_client" and len(args) == 2 and all(a.isdigit() for a in args):
            pair = (int(args[0]), int(args[1]))
            if pair[0] not in self.server_pids():
                return f"Server {args[0]} not found"
            if pair not in self.clients():
                return f"Client {args[1]} not found"
            self.write_clients([p for p in self.clients() if p != pair])
            self.log(f"Client {args[1]} of server {args[0]} terminated")
            return ""
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return f"Invalid active thread percentage {args[0]}"
            self.thread_percentage = value
            return ""
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}"
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not (args[1][:-1].isdigit() and args[1][-1:] in ("G", "M")):
                return f"Invalid pinned memory limit {args[1]}"
            self.pinned[args[0]] = args[1]
            return ""
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.pinned.get(args[0], "N/A")
        return f"Unrecognized command: {' '.join(words)}"

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.terminate()
        for server in self.servers.values():
            server.wait(timeout=5)
        self.servers.clear()


def _client() -> int:
    commands = sys.stdin.buffer.read()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(_pipe_directory() / SOCKET_NAME))
    except OSError:
        print(CANNOT_FIND, file=sys.stderr)
        return 1
    with conn:
        reply = b""
        with contextlib.suppress(OSError):
            conn.sendall(commands)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(4096):
                reply += chunk
    if not reply.endswith(_END):
        print("Lost the connection to the MPS control daemon", file=sys.stderr)
        return 1
    sys.stdout.write(reply[: -len(_END)].decode(errors="replace"))
    return 0


def main(argv: list[str]) -> int:
    if "-f" in argv:
        return _Daemon(argv).serve()
    return _client()


# --- for the tests ------------------------------------------------------------------------


def write_wrapper(directory: Path) -> Path:
    """An executable `nvidia-cuda-mps-control` in `directory` that runs this module with the
    current interpreter (`-S`: the fake needs only the standard library, and starts faster)."""
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(
        f"#!{sys.executable} -S\n"
        "import runpy\n"
        f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEntry:
    time: float  # seconds since the epoch, millisecond precision
    pid: int
    message: str


def log_entries(log_directory: Path) -> list[LogEntry]:
    """What fake daemons logged to `log_directory`/control.log, oldest first."""
    try:
        lines = (log_directory / LOG_NAME).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        head, _, message = line.partition("] ")
        date, clock, _, pid = head.lstrip("[").split()
        stamp = datetime.datetime.strptime(f"{date} {clock}", "%Y-%m-%d %H:%M:%S.%f")
        entries.append(LogEntry(time=stamp.timestamp(), pid=int(pid), message=message))
    return entries


def starts(log_directory: Path) -> list[LogEntry]:
    """The daemons started (their command line in `message`), oldest first."""
    return [e for e in log_entries(log_directory) if e.message.startswith("Starting")]


def commands(log_directory: Path) -> list[str]:
    """Every command the daemons received, in order."""
    prefix = "Command: "
    return [
        e.message[len(prefix) :] for e in log_entries(log_directory) if e.message.startswith(prefix)
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
