"""The `mpsched` dispatcher: `--version` and `--help` exit 0 without loading any command,
and bad usage of any command exits 2 with one line on stderr and no traceback, in-process and
as a real process (`serve --port 99999` used to end in an OverflowError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from extender.cli import SUBCOMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _python(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_version_prints_the_projects_version(capsys: pytest.CaptureFixture[str]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert main(["--version"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"mpsched {version}\n"
    assert captured.err == ""


def test_version_and_help_load_no_command() -> None:
    # What a command's module pulls in: none of it is needed to say the version.
    heavy = ("aiohttp", "kubernetes_asyncio", "numpy", "matplotlib", "extender.http")
    probe = (
        "import sys; from extender.cli import main; code = main(sys.argv[1:]); "
        f"print(code, [m for m in {heavy!r} if m in sys.modules])"
    )
    for flag in ("--version", "--help"):
        done = _python("-c", probe, flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "0 []", done.stdout


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--version" in out
    for name, (_, help_text) in SUBCOMMANDS.items():
        assert name in out and help_text in out


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_commands_help_exits_0(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: mpsched {name}")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "the following arguments are required: command"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["--bogus"], "the following arguments are required: command"),
        (["serve", "--port", "99999"], "argument --port: '99999' is not a TCP port (1-65535)"),
        (["serve", "--port", "0"], "argument --port: '0' is not a TCP port"),
        (["serve", "--port", "http"], "argument --port: 'http' is not a TCP port"),
        (["serve", "--metrics-port", "70000"], "argument --metrics-port: '70000' is not a TCP"),
        (["serve", "--loop", "fast"], "argument --loop: invalid choice: 'fast'"),
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        (["status", "--url", "notaurl"], "'notaurl' is not an http:// or https:// URL"),
        (["status", "--bogus"], "unrecognized arguments: --bogus"),
        (["webhook", "--port", "99999"], "--port 99999 is not a TCP port"),
        (["webhook", "--bogus"], "unrecognized arguments: --bogus"),
        (["agent", "--bogus"], "unrecognized arguments: --bogus"),
        (["demo", "--pods", "x"], "argument --pods: invalid int value: 'x'"),
        (["demo", "--bogus"], "unrecognized arguments: --bogus"),
        (["simulate", "--seeds", "x"], "argument --seeds: 'x'"),
        (["simulate"], "need --nodes PATH and --pods PATH"),
        (["check-config"], "the following arguments are required: FILE"),
        (["check-config", "a", "b"], "unrecognized arguments: b"),
    ],
)
def test_bad_usage_exits_2_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("mpsched: usage error: ")
    assert captured.err.count("\n") == 1
    assert says in captured.err


def test_a_usage_error_points_at_the_commands_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "99999"]) == 2
    assert capsys.readouterr().err.endswith("(see 'mpsched serve --help')\n")
    assert main(["bogus"]) == 2
    assert capsys.readouterr().err.endswith("(see 'mpsched --help')\n")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "99999", "--cluster-file", "cluster.json"],
        ["status", "--url", "notaurl"],
        ["serve", "--metrics-port", "-1"],
    ],
)
def test_bad_usage_in_a_real_process_has_no_traceback(argv: list[str]) -> None:
    done = _python("-m", "extender", *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("mpsched: usage error: ")


def test_serve_takes_every_port_and_metrics_port_0() -> None:
    parser = build_parser("serve")
    args = parser.parse_args(["serve", "--port", "65535", "--metrics-port", "0"])
    assert (args.port, args.metrics_port) == (65535, 0)
    args = parser.parse_args(["serve", "--port", "1", "--metrics-port", "65535"])
    assert (args.port, args.metrics_port) == (1, 65535)
