"""The progress line the batch commands (plan, simulate) draw on a terminal."""

from __future__ import annotations

import io

from extender.commands.common import ProgressLine


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_is_drawn_over_the_last_and_cleared_to_its_longest() -> None:
    term = _Terminal()
    line = ProgressLine(term)
    line.show("a long first line")
    line.show("short")
    line.close()
    drawn = term.getvalue()
    assert drawn.startswith("\ra long first line\rshort\r")
    # What is printed next starts on a blank line, however long the longest one drawn was.
    assert drawn.endswith("\r" + " " * len("a long first line") + "\r")


def test_the_bar_is_filled_by_its_fraction_and_bounded() -> None:
    line = ProgressLine(io.StringIO())
    width = ProgressLine.WIDTH
    assert line.bar(0.5) == "[" + "#" * (width // 2) + "." * (width - width // 2) + "]"
    assert line.bar(1.7) == "[" + "#" * width + "]" and line.bar(-1) == "[" + "." * width + "]"


def test_nothing_is_written_where_the_stream_is_no_terminal() -> None:
    quiet = io.StringIO()
    line = ProgressLine(quiet)
    line.show("x")
    line.close()
    assert quiet.getvalue() == ""
