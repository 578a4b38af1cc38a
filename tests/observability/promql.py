"""The metric names a PromQL expression selects, for checking dashboards and alert rules against
what the processes export. A lexer, not a parser: enough of PromQL's grammar (strings, label
matchers, ranges, grouping clauses, function calls, keywords, Grafana's `$variables`) that what
is left are the metric names."""

from __future__ import annotations

import re
from typing import Final

#: Words that are not metric names where they stand without a following "(".
KEYWORDS: Final = frozenset(
    {
        "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
        "group_right", "offset", "bool", "sum", "min", "max", "avg", "count", "stddev",
        "stdvar", "topk", "bottomk", "quantile", "count_values", "group", "inf", "nan",
    }
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_WORD = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (a Grafana `label_values(metric{...}, label)` query
    counts its metric)."""
    if m := _LABEL_VALUES.match(expr):
        expr = m.group(1)
    text = _VARIABLE.sub("1m", _STRING.sub('""', expr))
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    text = _OFFSET.sub("", text)
    names = set()
    for m in _WORD.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names
