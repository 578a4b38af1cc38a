"""A configuration document is bounded before it is built: size, nesting, aliases and their
expansion. Past a bound it is one clear ConfigError, found quickly in bounded memory; problem
messages quote values without building their whole repr."""

from __future__ import annotations

import itertools
import time
import tracemalloc
from pathlib import Path

import pytest

from extender import cli
from extender.config import ConfigError, load_config, load_config_text
from extender.config_schema import MAX_DEPTH, show


def alias_bomb(levels: int, size: int) -> str:
    """Nine times as many values per level, the last level under `budgets` (a known section,
    whose "must be a mapping" problem quotes the value), padded with a comment to `size` bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijk"[:levels]
    for prev, name in itertools.pairwise(names):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    body = "\n".join(lines) + f"\nbudgets: *{names[-1]}\n"
    return "#" + "x" * (size - len(body) - 2) + "\n" + body


def refused_quickly(text: str) -> tuple[list[str], float, int]:
    """The problems, the seconds and the peak bytes allocated to find them."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            load_config_text(text)
        took = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value.problems, took, peak


def test_a_deeply_nested_document_is_one_problem() -> None:
    """Before: RecursionError out of load_config_text (the serve watcher's task died)."""
    problems, took, peak = refused_quickly("[" * 20_000)
    assert problems == [f"the document is nested deeper than {MAX_DEPTH} levels"]
    assert took < 5 and peak < 20 * 2**20
    # At the bound itself the document still reads (and is refused for what it says).
    ok = "budgets: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert "budgets: must be a mapping" in load_problems(ok)[0]


def load_problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    return info.value.problems


@pytest.mark.parametrize(("levels", "size"), [(8, 440), (9, 486)])
def test_an_alias_bomb_is_refused_before_it_is_built(levels: int, size: int) -> None:
    """Before: 440 bytes took 8.1 s and 359 MB (repr of 43 million values); 486 bytes a
    MemoryError at 2.8 GB under a 3.5 GB limit."""
    text = alias_bomb(levels, size)
    assert len(text.encode()) == size
    problems, took, peak = refused_quickly(text)
    assert problems == ["the document expands to more than 100,000 values (YAML aliases)"]
    assert took < 5 and peak < 20 * 2**20


def test_many_aliases_and_large_documents_are_refused() -> None:
    many = "x: &x 1\ny: [" + ",".join(["*x"] * 300) + "]\n"
    assert load_problems(many) == ["the document has more than 256 aliases"]
    assert load_problems("#" + "x" * (1 << 20) + "\n") == [
        "the document is larger than 1,048,576 bytes"
    ]


def test_a_scalar_of_too_many_digits_is_a_problem_not_a_crash() -> None:
    """Before: PyYAML's int() raised ValueError (Python's digit limit) out of load_config."""
    [problem] = load_problems("server: {port: " + "9" * 5000 + "}\n")
    assert problem.startswith("not valid YAML: ") and len(problem) < 600


def test_a_large_value_is_quoted_without_its_whole_repr() -> None:
    """Before: show() built repr(value) in full, then cut it to 60 characters."""
    row = ["lol"] * 1000
    value = [row] * 1000  # one million strings, shared: little memory until repr'd
    tracemalloc.start()
    try:
        text = show(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(text) <= 60 and text.startswith("[['lol'")
    assert peak < 2**20


def test_a_file_is_read_no_further_than_the_bound(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" + b"x" * (8 << 20) + b"\n")
    with pytest.raises(ConfigError, match="larger than 1,048,576 bytes"):
        load_config(big)


@pytest.fixture
def only_check_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"check-config": cli.SUBCOMMANDS["check-config"]})


@pytest.mark.usefixtures("only_check_config")
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 20_000, "nested deeper than 32 levels"),
        (alias_bomb(9, 486), "expands to more than 100,000 values"),
    ],
)
def test_check_config_says_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    """Before: a 2,996-line RecursionError traceback for the nested document."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert cli.main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"{path}: ") and problem in err
