"""Bounded JSON: a nesting-depth check that runs on the raw bytes, before any parser recurses.

It lives in `core` because every ingress uses it (the REST API and Kafka ingest in
`orchestrator`, the OpenAI server in `inference`, through `core.frontdoor`): one rule for all.
Python's `json` recurses once per level, and so do Pydantic and every walker after it; a
deeply nested body (`[[[[…` a few MiB long) would otherwise end in a `RecursionError` (a 500,
or an ingest process that dies on the same record after every restart).

The check costs a few C-speed passes over the bytes: strings are cut out (they may hold
brackets), everything but brackets is deleted, then innermost `[]` / `{}` pairs are removed
once per level; what is left after `max_depth` passes is nested too deeply. Unbalanced input
is left to the parser's own error.
"""

from __future__ import annotations

import json
import re
from typing import Any

DEFAULT_MAX_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_LEAF_PAIR = re.compile(rb"\[\]|\{\}")  # one regex pass removes exactly one level (it scans the input only)


class JSONTooDeep(ValueError):
    """The document nests arrays/objects more than the limit allows."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"JSON nested deeper than {max_depth} levels")
        self.max_depth = max_depth


def check_depth(data: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise `JSONTooDeep` if `data` nests arrays/objects deeper than `max_depth`."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if b"[" not in raw and b"{" not in raw:
        return
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if b"[" * (max_depth + 1) in brackets or b"{" * (max_depth + 1) in brackets:
        raise JSONTooDeep(max_depth)  # the common attack, found without the passes
    for _ in range(max_depth):
        if not brackets:
            return
        reduced = _LEAF_PAIR.sub(b"", brackets)
        if reduced == brackets:
            return  # unbalanced: not JSON, the parser says so (`loads` bounds its recursion too)
        brackets = reduced
    if brackets:
        raise JSONTooDeep(max_depth)


def loads(data: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """`json.loads` after `check_depth`. Raises ValueError (JSONTooDeep, JSONDecodeError, a bad
    encoding, an integer of more than 4300 digits) and nothing else for any input."""
    check_depth(data, max_depth)
    try:
        return json.loads(data)
    except RecursionError:  # unreachable after the check; kept so no input can escape as one
        raise JSONTooDeep(max_depth) from None
