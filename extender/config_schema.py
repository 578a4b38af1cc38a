"""The small schema toolkit `extender.config` validates its YAML document with: value checks,
a reader that collects every problem with its dotted path instead of stopping at the first, checks
derived from a settings dataclass's type hints, a YAML loader that reports duplicate keys, and
the bounds a document must keep before it is built (`document_problem`).

Owns no schema of its own; `extender.config` declares the sections and their ranges.
"""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, NoneType, UnionType
from typing import Any, Final, Literal

import yaml


class Bad(Exception):
    """One value is wrong; the message says what it must be ("must be an integer ≥ 1")."""


Check = Callable[[object], Any]


@dataclass(frozen=True, slots=True)
class Nested:
    """A field that is itself a settings dataclass: read as a sub-section with `checks`."""

    cls: Callable[..., Any]
    checks: Checks


#: YAML key → (dataclass field name, check or nested section).
Checks = Mapping[str, tuple[str, "Check | Nested"]]


#: repr with every level and container cut short: a problem message about a value built from
#: YAML aliases would otherwise repr millions of elements (or recurse past the limit) first.
def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()  # keyword arguments only from Python 3.12
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 6, 6, 6
    r.maxstring, r.maxlong, r.maxother = 60, 40, 60
    return r


_SHOW: Final = _bounded_repr()


def show(value: object) -> str:
    """A value as a problem message quotes it: a bounded repr, cut to 60 characters."""
    text = _SHOW.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def number(*, low: float, high: float | None = None, low_open: bool = False) -> Check:
    """A number (int or float, not bool or NaN) in [low, high] (or (low, high] if low_open)."""
    lo = f"> {low}" if low_open else f"≥ {low}"
    wanted = f"must be a number {lo}" + (f" and ≤ {high}" if high is not None else "")

    def check(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise Bad(wanted)
        x = float(v)
        if not (x > low if low_open else x >= low) or (high is not None and not x <= high):
            raise Bad(wanted)  # NaN fails both comparisons and lands here too
        return x

    return check


def integer(*, low: int, high: int | None = None) -> Check:
    wanted = f"must be an integer ≥ {low}" + (f" and ≤ {high}" if high is not None else "")

    def check(v: object) -> int:
        if (
            isinstance(v, bool)
            or not isinstance(v, int)
            or v < low
            or (high is not None and v > high)
        ):
            raise Bad(wanted)
        return v

    return check


def boolean(v: object) -> bool:
    if isinstance(v, bool):
        return v
    raise Bad("must be true or false")


def string(*choices: str) -> Check:
    """A non-empty string, one of `choices` when given."""
    wanted = f"must be one of {', '.join(choices)}" if choices else "must be a non-empty string"

    def check(v: object) -> str:
        if isinstance(v, str) and v and (not choices or v in choices):
            return v
        raise Bad(wanted)

    return check


def optional(inner: Check) -> Check:
    """`inner`, or null."""

    def check(v: object) -> Any:
        return None if v is None else inner(v)

    return check


def absolute_path(v: object) -> str:
    if isinstance(v, str) and v.startswith("/"):
        return v
    raise Bad("must be an absolute path")


def label_map(v: object) -> Mapping[str, str]:
    """A label selector's matchLabels: string → string (YAML would turn `true` into a bool)."""
    if isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        return MappingProxyType(dict(v))
    raise Bad("must be a mapping of label names to string values (quote numbers and booleans)")


#: Word spellings that are not plain capitalisation (units and acronyms as Kubernetes writes them).
_SPELLING: Final = MappingProxyType({"mib": "MiB", "ipc": "IPC"})


def camel(name: str) -> str:
    """A dataclass field's YAML key: `memory_reserve_mib` → `memoryReserveMiB`,
    `host_ipc` → `hostIPC`."""
    head, *rest = name.split("_")
    return head + "".join(_SPELLING.get(p, p[:1].upper() + p[1:]) for p in rest)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Reader:
    """Reads sections of a document, collecting problems instead of stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(
        self, doc: object, path: str, checks: Checks, *, also: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The fields of `doc` that were given and are valid, by dataclass field name (the
        dataclass supplies defaults for the rest). `also`: keys handled elsewhere, named only in
        the "known" list of an unknown-key problem."""
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            self.problems.append(f"{path}: must be a mapping, got {show(doc)}")
            return {}
        out: dict[str, Any] = {}
        for key, value in doc.items():
            spec = checks.get(key) if isinstance(key, str) else None
            if spec is None:
                self.unknown(path, key, [*checks, *also])
                continue
            attr, check = spec
            if isinstance(check, Nested):
                out[attr] = check.cls(**self.section(value, join(path, key), check.checks))
                continue
            try:
                out[attr] = check(value)
            except Bad as bad:
                self.problems.append(f"{join(path, key)}: {bad}, got {show(value)}")
        return out

    def unknown(self, path: str, key: object, known: Sequence[str]) -> None:
        hint = ""
        if isinstance(key, str):
            by_case = [k for k in known if k.lower() == key.lower()]
            close = by_case or difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
        self.problems.append(
            f"{join(path, str(key))}: unknown key{hint}; known: {', '.join(known)}"
        )


def fields_of(cls: type, overrides: Mapping[str, Check | Nested] | None = None) -> Checks:
    """Checks for a settings dataclass, from its type hints: camelCase keys; bool, int ≥ 0,
    float ≥ 0, str, Literal[...], X | None and nested dataclasses. `overrides` (by field name)
    add ranges and choices. A field of any other type is taken as written."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[str, Check | Nested]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        check = (overrides or {}).get(f.name)
        if check is None and isinstance(hint, type) and dataclasses.is_dataclass(hint):
            check = Nested(hint, fields_of(hint))
        out[camel(f.name)] = (f.name, check or check_for(hint))
    return MappingProxyType(out)


def removed(why: str) -> Check:
    """A key that no longer exists: its use is refused with `why`."""

    def check(v: object) -> None:
        raise Bad(f"no longer exists: {why}")

    return check


def moved(where: str) -> Check:
    """A key that now lives elsewhere: its use is refused naming `where`."""

    def check(v: object) -> None:
        raise Bad(f"belongs under {where}")

    return check


def nested(cls: type, overrides: Mapping[str, Check | Nested] | None = None) -> Nested:
    """The section of a settings dataclass, with `overrides` as in `fields_of`."""
    return Nested(cls, fields_of(cls, overrides))


#: A TCP port, and a positive duration in seconds.
PORT: Final = integer(low=1, high=65535)
SECONDS: Final = number(low=0.0, low_open=True)


def check_for(hint: Any) -> Check:
    """The check for a simple type hint."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (UnionType, typing.Union) and NoneType in args and len(args) == 2:
        return optional(check_for(next(a for a in args if a is not NoneType)))
    if origin is Literal:
        return string(*(str(a) for a in args))
    if hint is bool:
        return boolean
    if hint is int:
        return integer(low=0)
    if hint is float:
        return number(low=0.0)
    if hint is str:
        return string()

    def as_written(v: object) -> Any:
        return v

    return as_written


#: A configuration document's bounds, checked on its YAML events before anything is built:
#: a ConfigMap holds at most 1 MiB; mpsched's own document is 4 levels deep and has no
#: aliases, so these leave room for any hand-written one and none for an alias bomb.
MAX_DOCUMENT_BYTES: Final = 1 << 20
MAX_DEPTH: Final = 32
MAX_ALIASES: Final = 256
#: Scalars and collections once every alias is expanded.
MAX_NODES: Final = 100_000


def document_problem(text: str) -> str | None:
    """Why `text` is too large to build as a configuration (bytes, nesting, aliases, or its
    size with aliases expanded), or None. Walks the parser's events, which takes time and
    memory linear in the text (PyYAML's parser keeps a stack, not recursion); the composer and
    constructor recurse per level and the document's size grows with every alias level, so
    they run only on a document within bounds. A YAML syntax error raises yaml.YAMLError."""
    if len(text) > MAX_DOCUMENT_BYTES or len(text.encode()) > MAX_DOCUMENT_BYTES:
        return f"the document is larger than {MAX_DOCUMENT_BYTES:,} bytes"
    #: Open collections: their size so far (with aliases expanded) and their anchor.
    stack: list[list[Any]] = []
    anchored: dict[str, int] = {}
    aliases = 0
    total = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                return f"the document is nested deeper than {MAX_DEPTH} levels"
            stack.append([1, event.anchor])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            size, anchor = stack.pop()
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                return f"the document has more than {MAX_ALIASES} aliases"
            size, anchor = anchored.get(event.anchor or "", 1), None
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        else:
            continue
        if anchor is not None:
            anchored[anchor] = size
        if stack:
            stack[-1][0] += size
            grown = stack[-1][0]
        else:
            total += size
            grown = total
        if grown > MAX_NODES:
            return f"the document expands to more than {MAX_NODES:,} values (YAML aliases)"
    return None


class DuplicateKeyLoader(yaml.SafeLoader):
    """SafeLoader that records duplicate mapping keys in `duplicates`: PyYAML silently keeps the
    last one, which hides a typo'd or pasted-twice setting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue
            if key in seen:
                line = key_node.start_mark.line + 1
                self.duplicates.append(f"line {line}: key {key!r} appears twice in one mapping")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
