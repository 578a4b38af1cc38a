"""The configuration reference (`docs/configuration.md`), written from the configuration model
itself: every section and key the validator accepts, its default, and the reason its settings
class gives for it (the `#:` comment above the field). A test keeps the document equal to what
this module writes, so the reference cannot drift from the code. Every section's settings
class must have its own docstring and every key its own `#:` comment: a missing one is an
error here (`MissingDoc`), never filled in from elsewhere (a dataclass without a docstring has
a generated one, its signature, which is no description).

Run `python -m extender.config_doc > docs/configuration.md` after changing a settings class.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
import textwrap
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from extender.config import _SECTIONS
from extender.config_schema import Nested

HEADER = """\
# Configuration reference

Written by `python -m extender.config_doc` from the configuration model (`extender/config.py`
and the settings classes it uses); a test keeps it up to date. `config/mpsched.yaml` shows the
same options as a commented sample. Every section and key is optional: what is left out takes
the default. `mpsched check-config FILE` validates a file offline and lists every problem.

`gpuModels` (model name → `memoryMiB`, `computeCapability`) adds GPU models to the built-in
ones for traces that name models only (`mpsched simulate`).
"""


class MissingDoc(Exception):
    """A settings class without its own docstring, or a key without its `#:` comment."""


def _class_doc(cls: Any) -> str:
    """The class's own docstring, as one paragraph (not the signature dataclass puts there)."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    if not doc or doc.startswith(f"{cls.__name__}("):
        raise MissingDoc(f"{cls.__qualname__} has no docstring")
    return " ".join(doc.split())


@cache
def _field_comments(cls: type) -> Mapping[str, str]:
    """Field name → the `#:` comment lines right above it in the class's source."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    out: dict[str, str] = {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].strip().startswith("#:"):
            above.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        out[node.target.id] = " ".join(above)
    return out


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _shown(value: object) -> str:
    if isinstance(value, Mapping):
        value = dict(value)
    if isinstance(value, tuple):
        value = list(value)
    return "`" + json.dumps(value) + "`"


def _rows(cls: Any, checks: Mapping[str, Any], path: str) -> Iterator[tuple[str, str, str]]:
    comments = _field_comments(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, (attr, check) in checks.items():
        f = fields.get(attr)
        # Keys kept only to say they moved or were removed are not options.
        if f is None or getattr(check, "__qualname__", "").startswith(("moved.", "removed.")):
            continue
        dotted = f"{path}.{key}"
        if isinstance(check, Nested):
            yield from _rows(check.cls, check.checks, dotted)
            continue
        reason = comments.get(attr, "")
        if not reason:
            raise MissingDoc(f"{cls.__qualname__}.{attr} ({dotted}) has no #: comment")
        yield dotted, _shown(_default(f)), reason


def document() -> str:
    """The whole reference, as Markdown."""
    parts = [HEADER]
    for key, (_attr, check) in _SECTIONS.items():
        if not isinstance(check, Nested):
            continue
        cls = check.cls
        summary = _class_doc(cls)
        parts.append(f"\n## `{key}`\n\n{summary}\n")
        parts.append("\n| key | default | what and why |\n|---|---|---|\n")
        for dotted, default, reason in _rows(cls, check.checks, key):
            parts.append(f"| `{dotted}` | {default} | {reason.replace('|', '/')} |\n")
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(document())
