"""Reading a cluster dump: the `v1/List` that `kubectl get nodes,pods -A -o json` (or `-o yaml`)
prints, into Node and Pod objects.

Owns the dump's format rules: JSON or YAML decided by content, a List (or NodeList / PodList) of
items, each a Node or a Pod with a name; anything else is rejected with the item's position.
A JSON file is read as a stream, one item at a time: a 60,000-pod dump is ~200 MB of JSON and
well over 1 GB as one Python object tree, while item by item it never holds more than a chunk
of text and one pod. YAML (for hand-written files) is parsed whole.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

#: List kinds whose items may omit `kind` (kubectl writes it, other tools may not).
_LIST_ITEM_KIND: Final = {"NodeList": "Node", "PodList": "Pod", "List": None}
#: Characters read from the file at a time when streaming.
CHUNK: Final = 4 << 20
#: A single item (or top-level value) larger than this is taken for a corrupt file.
MAX_ITEM: Final = 64 << 20


class ClusterFileError(Exception):
    """The cluster file cannot be read as a List of Nodes and Pods; the message says where."""


def parse_document(text: str | bytes, *, source: str) -> Iterator[dict[str, Any]]:
    """The dump's items, each checked, in order. Syntax errors raise at once; an item's error
    raises when the iteration reaches it."""
    raw = text.encode() if isinstance(text, str) else text
    if raw.lstrip().startswith(b"{"):
        decoded = raw.decode("utf-8", errors="replace")
        return _stream(_Reader(iter([decoded]).__next__), source)
    return _yaml(raw, source)


def read_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """The dump in `path`, streamed when it is JSON. Raises ClusterFileError."""
    p = Path(path)
    try:
        handle = p.open("rb")
    except OSError as exc:
        raise ClusterFileError(f"cannot read cluster file {str(p)!r}: {exc.strerror}") from None
    with handle:
        head = handle.read(4096)
        if not head.lstrip().startswith(b"{"):
            rest = handle.read()
            yield from _yaml(head + rest, str(p))
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = [decoder.decode(head)]

        def read() -> str:
            if pending:
                return pending.pop()
            data = handle.read(CHUNK)
            return decoder.decode(data, final=not data)

        yield from _stream(_Reader(read), str(p))


def _yaml(raw: bytes, source: str) -> Iterator[dict[str, Any]]:
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        doc = yaml.load(raw, Loader=loader)  # CSafeLoader/SafeLoader: no object tags
    except yaml.YAMLError as exc:
        raise ClusterFileError(f"{source}: not valid JSON or YAML ({_short(exc)})") from None
    except RecursionError:
        raise ClusterFileError(f"{source}: nested too deeply to be a cluster dump") from None
    if not isinstance(doc, dict):
        raise ClusterFileError(
            f"{source}: expected a v1 List object (kubectl get nodes,pods -A -o json), "
            f"got {type(doc).__name__}"
        )
    kind = doc.get("kind", "List")
    _check_list_kind(kind, source)
    items = doc.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ClusterFileError(f"{source}: items is a {type(items).__name__}, not a list")
    for i, item in enumerate(items):
        # Drop the list's reference so each item can be freed once the caller stored it.
        items[i] = None
        yield _checked(item, i, _LIST_ITEM_KIND.get(kind), source)


def _check_list_kind(kind: object, source: str) -> None:
    if kind not in _LIST_ITEM_KIND:
        raise ClusterFileError(f"{source}: expected kind List, NodeList or PodList, got {kind!r}")


class _Incomplete(Exception):
    """The buffer ends inside the value being read."""


class _Reader:
    """A text buffer over a chunked source, with JSON values read by the C scanner."""

    _decoder = json.JSONDecoder()

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read
        self.buf = ""
        self.pos = 0
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self._read()
        except StopIteration:
            chunk = ""
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end)."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            raise json.JSONDecodeError(f"expected {what}", self.buf, self.pos)
        self.pos += 1
        return c

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buf, self.pos)
                # A value that ends exactly at the buffer's end may be cut (a number).
                if end >= len(self.buf) and not self.eof:
                    raise _Incomplete
            except (json.JSONDecodeError, _Incomplete):
                # Invalid text reads like an unfinished item: give up past MAX_ITEM, rather
                # than pull the rest of a corrupt 200 MB file into the buffer.
                if len(self.buf) - self.pos < MAX_ITEM and self._more():
                    continue
                raise
            self.pos = end
            return value


def _stream(reader: _Reader, source: str) -> Iterator[dict[str, Any]]:
    """The top-level object, its `items` yielded one by one as soon as each is read."""
    list_kind: str | None = None
    index = 0
    try:
        reader.expect("{", "a JSON object (a v1 List)")
        if reader.peek() == "}":
            return
        while True:
            key = reader.value()
            reader.expect(":", "':'")
            if key == "items":
                if reader.peek() != "[":
                    value = reader.value()
                    if value is not None:
                        raise ClusterFileError(
                            f"{source}: items is a {type(value).__name__}, not a list"
                        )
                else:
                    reader.expect("[", "the items list")
                    if reader.peek() != "]":
                        while True:
                            item = reader.value()
                            default = _LIST_ITEM_KIND.get(list_kind or "")
                            yield _checked(item, index, default, source)
                            index += 1
                            if reader.expect(",]", "',' or ']' after an item") == "]":
                                break
                    else:
                        reader.expect("]", "']'")
            else:
                value = reader.value()
                if key == "kind":
                    _check_list_kind(value, source)
                    list_kind = value
            if reader.expect(",}", "',' or '}'") == "}":
                break
    except json.JSONDecodeError as exc:
        raise ClusterFileError(f"{source}: not valid JSON near item {index} ({exc.msg})") from None
    except RecursionError:
        raise ClusterFileError(f"{source}: nested too deeply to be a cluster dump") from None


def _checked(item: object, i: int, default_kind: str | None, source: str) -> dict[str, Any]:
    where = f"{source}: items[{i}]"
    if not isinstance(item, dict):
        raise ClusterFileError(f"{where} is a {type(item).__name__}, not an object")
    kind = item.get("kind", default_kind)
    if kind is None:
        # Neither the item nor (yet) the list says: a Pod has containers, a Node has none.
        spec = item.get("spec")
        kind = "Pod" if isinstance(spec, dict) and "containers" in spec else "Node"
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
    return item


def _string_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text[:160] + ("..." if len(text) > 160 else "")
