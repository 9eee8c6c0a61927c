"""The JSON-schema corpus for constrained decoding: `schemas/NNN_name.json` with valid instances in
`examples/NNN_name.json`; `unsupported/` holds schemas llguidance refuses, with the keyword to name."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas"
EXAMPLES = HERE / "examples"
UNSUPPORTED = HERE / "unsupported"
SUPPORT_FILE = HERE / "llguidance_support.json"
KEYWORDS_FILE = HERE / "llguidance_keywords.json"

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_SUB_SCHEMA = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_SUB_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUB_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    schema: dict[str, Any]
    examples: list[Any]


@dataclass(frozen=True)
class UnsupportedEntry:
    name: str
    schema: dict[str, Any]
    keyword: str
    error_contains: str


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_corpus() -> list[CorpusEntry]:
    return [
        CorpusEntry(p.stem, _read(p), _read(EXAMPLES / p.name))
        for p in sorted(SCHEMAS.glob("[0-9][0-9][0-9]_*.json"))
    ]


def load_unsupported() -> list[UnsupportedEntry]:
    expected = _read(UNSUPPORTED / "expected.json")
    return [
        UnsupportedEntry(p.stem, _read(p), expected[p.stem]["keyword"], expected[p.stem]["error_contains"])
        for p in sorted(UNSUPPORTED.glob("[0-9][0-9][0-9]_*.json"))
    ]


def subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in `schema` (itself included); skips values of enum/const/default/examples."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key in _SUB_SCHEMA:
        if key in schema:
            yield from subschemas(schema[key])
    for key in _SUB_LIST:
        for sub in schema.get(key, ()):
            yield from subschemas(sub)
    for key in _SUB_MAP:
        for sub in schema.get(key, {}).values():
            yield from subschemas(sub)


def _ref_target(root: dict[str, Any], ref: str) -> dict[str, Any] | None:
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def is_recursive(root: dict[str, Any]) -> bool:
    """Whether some `$ref` reaches (through further refs) a schema containing itself."""

    def refs(node: dict[str, Any]) -> list[str]:
        return [s["$ref"] for s in subschemas(node) if isinstance(s.get("$ref"), str)]

    def reaches(ref: str, target: str, seen: set[str]) -> bool:
        node = _ref_target(root, ref)
        if node is None:
            return False
        for r in refs(node) if node is not root else [r for r in refs(node) if r != ref]:
            if r == target or (r not in seen and reaches(r, target, seen | {r})):
                return True
        return False

    if any(r == "#" for r in refs(root)):
        return True
    return any(reaches(r, r, {r}) for r in set(refs(root)))


def max_depth(schema: Any) -> int:
    """Nesting depth of object/array levels in the instance shape (refs not followed)."""
    if not isinstance(schema, dict):
        return 0
    children = [schema[k] for k in _SUB_SCHEMA if k in schema]
    children += [s for k in _SUB_LIST for s in schema.get(k, ())]
    children += [s for k in ("properties", "patternProperties") for s in schema.get(k, {}).values()]
    level = (
        1 if any(k in schema for k in ("properties", "items", "prefixItems", "additionalProperties")) else 0
    )
    return level + max((max_depth(c) for c in children), default=0)


def keyword_coverage(entries: list[CorpusEntry]) -> dict[str, int]:
    """How many schemas use each keyword, plus derived features: `format:<name>`, `type[]:null`
    (a type array with "null"), `$ref:recursive`, `enum:>=100` (an enum of 100+ values),
    `depth:>=6` (6+ nested object/array levels), `properties:>=30`."""
    counts: Counter[str] = Counter()
    for entry in entries:
        used: set[str] = set()
        for sub in subschemas(entry.schema):
            used |= set(sub)
            if isinstance(sub.get("format"), str):
                used.add("format:" + sub["format"])
            if isinstance(sub.get("type"), list) and "null" in sub["type"]:
                used.add("type[]:null")
            if len(sub.get("enum", ())) >= 100:
                used.add("enum:>=100")
            if len(sub.get("properties", {})) >= 30:
                used.add("properties:>=30")
            if sub.get("items") is False:
                used.add("items:false")
        if is_recursive(entry.schema):
            used.add("$ref:recursive")
        if max_depth(entry.schema) >= 6:
            used.add("depth:>=6")
        counts.update(used)
    return dict(sorted(counts.items()))
