"""JSONPatch (RFC 6902) operations and JSON Pointers (RFC 6901), as the mutating webhook emits
them.

Owns the spelling of a patch only: pointer escaping, the operation objects, and the one rule
that makes a patch apply to any pod: appending to an array that may be missing. `add` to
`/a/b/-` fails when `/a/b` does not exist, so the first element of a missing array is added as
the whole array instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: One operation: {"op": "add", "path": "/spec/hostIPC", "value": true}.
PatchOp = dict[str, Any]


def escape(token: str) -> str:
    """One reference token of a JSON Pointer: `~` → `~0` first, then `/` → `~1` (RFC 6901 §3;
    the other order would turn a `/` into `~01`)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """The JSON Pointer of a path: pointer("spec", "containers", 0) → "/spec/containers/0"."""
    return "".join("/" + escape(str(t)) for t in tokens)


def add(path: str, value: object) -> PatchOp:
    """`add`: creates a member, replaces an existing member, or inserts into an array."""
    return {"op": "add", "path": path, "value": value}


def append_all(
    parent: Mapping[str, Any], key: str, at: str, items: Sequence[object]
) -> list[PatchOp]:
    """Operations appending `items` to the array `parent[key]`, whose pointer is `at`. A missing
    (or null) array is created with all of them in one `add`; an existing one gets `/-` appends,
    so whatever was there stays in place."""
    if not items:
        return []
    if parent.get(key) is None:
        return [add(at, list(items))]
    return [add(f"{at}/-", item) for item in items]
