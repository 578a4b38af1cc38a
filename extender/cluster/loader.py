"""Reading a cluster dump: the `v1/List` that `kubectl get nodes,pods -A -o json` (or `-o yaml`)
prints, into Node and Pod objects.

Owns the dump's format rules only: JSON or YAML decided by content, a List (or NodeList /
PodList) of items, each item a Node or a Pod. Everything else in the dump is rejected with the
item's position, so a truncated or hand-edited file says what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import yaml

#: List kinds whose items may omit `kind` (kubectl writes it, other tools may not).
_LIST_ITEM_KIND = {"NodeList": "Node", "PodList": "Pod", "List": None}


class ClusterFileError(Exception):
    """The cluster file cannot be read as a List of Nodes and Pods; the message says where."""


def parse_document(text: str | bytes, *, source: str) -> Iterator[dict[str, Any]]:
    """The dump's items, each checked to be a Node or a Pod with a name, in file order. JSON
    when the text starts with `{` (kubectl's JSON), YAML otherwise. Syntax errors raise at
    once; an item's error raises when the iteration reaches it."""
    raw = text.encode() if isinstance(text, str) else text
    stripped = raw.lstrip()
    try:
        if stripped.startswith(b"{"):
            doc = orjson.loads(raw)
        else:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            doc = yaml.load(raw, Loader=loader)  # CSafeLoader/SafeLoader: no object tags
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{source}: not valid JSON or YAML ({_short(exc)})") from None
    except RecursionError:
        raise ClusterFileError(f"{source}: nested too deeply to be a cluster dump") from None
    if not isinstance(doc, dict):
        raise ClusterFileError(
            f"{source}: expected a v1 List object (kubectl get nodes,pods -A -o json), "
            f"got {type(doc).__name__}"
        )
    kind = doc.get("kind", "List")
    if kind not in _LIST_ITEM_KIND:
        raise ClusterFileError(f"{source}: expected kind List, NodeList or PodList, got {kind!r}")
    items = doc.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ClusterFileError(f"{source}: items is a {type(items).__name__}, not a list")
    default_kind = _LIST_ITEM_KIND[kind]
    return _checked(items, default_kind, source)


def _checked(items: list[Any], default_kind: str | None, source: str) -> Iterator[dict[str, Any]]:
    for i, item in enumerate(items):
        where = f"{source}: items[{i}]"
        if not isinstance(item, dict):
            raise ClusterFileError(f"{where} is a {type(item).__name__}, not an object")
        kind = item.get("kind", default_kind)
        if kind not in ("Node", "Pod"):
            raise ClusterFileError(f"{where} is a {kind!r}; only Node and Pod are read")
        meta = item.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise ClusterFileError(f"{where} ({kind}) has no metadata.name")
        for field in ("labels", "annotations"):
            value = meta.get(field)
            if value is not None and not _string_map(value):
                raise ClusterFileError(f"{where} ({meta['name']}): metadata.{field} is not a map")
        for field in ("spec", "status"):
            if item.get(field) is not None and not isinstance(item[field], dict):
                raise ClusterFileError(f"{where} ({meta['name']}): {field} is not an object")
        item["kind"] = kind
        item.setdefault("apiVersion", "v1")
        # Drop the list's reference: a 60k-pod dump is freed item by item as the caller stores
        # each one compactly, instead of all at the end.
        items[i] = None
        yield item


def _string_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text[:160] + ("..." if len(text) > 160 else "")
