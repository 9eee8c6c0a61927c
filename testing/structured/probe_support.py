"""What llguidance does with the corpus and with each keyword; writes `llguidance_support.json` and
`llguidance_keywords.json`. Run: `python -m testing.structured.probe_support`."""

from __future__ import annotations

import json
from typing import Any

import llguidance

from testing.structured.corpus import KEYWORDS_FILE, SUPPORT_FILE, CorpusEntry, load_corpus
from testing.structured.llg_bytes import SPACED, STRICT, accepts, compile_schema, dumps

LENIENT = {"lenient": True}
# (style, grammar options, serialisation): the examples are fed to the grammar in each style.
STYLES: dict[str, tuple[dict[str, Any], Any]] = {
    "spaced": (SPACED, lambda x: dumps(x, "spaced")),
    "compact": (STRICT, lambda x: dumps(x, "compact")),
    # json.dumps' default ensure_ascii=True: non-ASCII characters as \uXXXX escapes.
    "spaced_ascii": (SPACED, lambda x: json.dumps(x, separators=(", ", ": "))),
}


def rejected_examples(entry: CorpusEntry, lenient: bool) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for style, (options, ser) in STYLES.items():
        grammar, error, _ = compile_schema(entry.schema, {**options, **(LENIENT if lenient else {})})
        assert error is None, (entry.name, error)
        bad = []
        for i, x in enumerate(entry.examples):
            ok, msg = accepts(grammar, ser(x))
            if not ok:
                bad.append({"example": i, "error": msg})
        out[style] = bad
    return out


def probe_schema(entry: CorpusEntry) -> dict[str, Any]:
    _, error, warnings = compile_schema(entry.schema, STRICT)
    _, lenient_error, lenient_warnings = compile_schema(entry.schema, {**STRICT, **LENIENT})
    return {
        "compiles": error is None,
        "error": error,
        "warnings": warnings,
        "lenient_compiles": lenient_error is None,
        "lenient_warnings": lenient_warnings,
        # Valid examples the grammar refuses (strict grammar, or the lenient one where strict is refused).
        "examples_rejected": rejected_examples(entry, lenient=error is not None)
        if error is None or lenient_error is None
        else None,
    }


def _str(schema: dict) -> dict:
    return {"type": "string", **schema}


_TAGGED = {
    "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
    "$defs": {
        t: {"type": "object", "properties": {"k": {"const": t}, "x": {"type": "integer"}}, "required": ["k"]}
        for t in "ab"
    },
}

# keyword -> (schema, a valid instance, an instance the keyword makes invalid, or None for annotations)
KEYWORD_CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "type": ({"type": "integer"}, 3, "3"),
    "type[]:null": ({"type": ["string", "null"]}, None, 0),
    "enum": ({"enum": ["a", 1, None]}, 1, "b"),
    "const": ({"const": {"a": [1]}}, {"a": [1]}, {"a": [2]}),
    "required": ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, {"a": 1}, {}),
    "additionalProperties:false": (
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
        {"a": 1},
        {"b": 1},
    ),
    "additionalProperties:schema": (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        {"b": 1},
        {"b": "x"},
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False},
        {"x-a": "1"},
        {"y": "1"},
    ),
    "minProperties": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        {"a": 1, "b": 2},
        {"a": 1},
    ),
    "maxProperties": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    "minProperties:1_closed_object": (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "additionalProperties": False,
            "minProperties": 1,
        },
        {"b": 1},
        {},
    ),
    "minProperties:optional_properties": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1},
        {"a": 1},
        {},
    ),
    "items": ({"type": "array", "items": {"type": "integer"}}, [1], ["x"]),
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        ["a", 1],
        [1, "a"],
    ),
    "items:false": (
        {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
        ["a"],
        ["a", "b"],
    ),
    "minItems": ({"type": "array", "minItems": 2}, [1, 2], [1]),
    "maxItems": ({"type": "array", "maxItems": 1}, [1], [1, 2]),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    "uniqueItems:false": ({"type": "array", "uniqueItems": False}, [1, 1], None),
    "contains": ({"type": "array", "contains": {"const": 1}}, [1], [2]),
    "minLength": (_str({"minLength": 2}), "ab", "a"),
    "maxLength": (_str({"maxLength": 2}), "ab", "abc"),
    "maxLength:codepoints": (_str({"maxLength": 1}), "\U0001f600", "ab"),
    "pattern:anchored": (_str({"pattern": "^a+$"}), "aa", "ab"),
    "pattern:unanchored": (_str({"pattern": "b{2}"}), "abba", "aba"),
    "pattern:lookahead": (_str({"pattern": "^(?=a)a$"}), "a", "b"),
    "pattern:word_boundary": (_str({"pattern": "\\bab"}), "ab", "xab"),
    "pattern:backreference": (_str({"pattern": "^(a)\\1$"}), "aa", "ab"),
    "pattern:unicode_property": (_str({"pattern": "^\\p{Lu}$"}), "A", "a"),
    "minimum": ({"type": "integer", "minimum": -3}, -3, -4),
    "maximum": ({"type": "number", "maximum": 2.5}, 2.5, 2.51),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": -0.5}, -0.49, -0.5),
    "exclusiveMaximum": ({"type": "integer", "exclusiveMaximum": 10}, 9, 10),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, 9, 10),
    "maximum:prefix_of_bound": ({"type": "number", "maximum": 2.25}, 2.2, 2.26),
    "minimum:exponent_notation": ({"type": "number", "minimum": 0}, 1e-05, -1e-05),
    "maximum:uint64": (
        {"type": "integer", "minimum": 0, "maximum": 18446744073709551615},
        18446744073709551615,
        -1,
    ),
    "minimum:int64": ({"type": "integer", "minimum": -9223372036854775808}, -9223372036854775808, None),
    "anyOf": ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 1, 1.5),
    "oneOf:disjoint_inline": ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "a", 1.5),
    "oneOf:disjoint_refs": (
        {
            "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
            "$defs": {"a": {"type": "string"}, "b": {"type": "integer"}},
        },
        "a",
        1.5,
    ),
    "oneOf:tagged_refs": (_TAGGED, {"k": "a", "x": 1}, {"k": "c"}),
    "oneOf:tagged_refs+discriminator": (
        {**_TAGGED, "discriminator": {"propertyName": "k"}},
        {"k": "a", "x": 1},
        {"k": "c"},
    ),
    "oneOf:overlapping": ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 1.5, None),
    "allOf": ({"allOf": [{"type": "string", "minLength": 2}, {"maxLength": 3}]}, "abc", "abcd"),
    "not": ({"not": {"type": "string"}}, 1, "a"),
    "if/then/else": ({"if": {"type": "integer"}, "then": {"minimum": 0}}, 1, -1),
    "dependentRequired": ({"type": "object", "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^a"}}, {"a": 1}, {"b": 1}),
    "unevaluatedProperties": ({"type": "object", "unevaluatedProperties": False}, {}, {"a": 1}),
    "$ref:recursive": (
        {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"},
        [[[]]],
        [[1]],
    ),
    "$ref:remote": ({"$ref": "https://example.com/s.json"}, 1, None),
    "$dynamicRef": ({"$dynamicRef": "#x"}, 1, None),
    "contentEncoding": (_str({"contentEncoding": "base64"}), "QQ==", "!!"),
    "discriminator": ({"type": "object", "discriminator": {"propertyName": "k"}}, {"k": 1}, None),
    **{
        f"format:{f}": (_str({"format": f}), v, bad)
        for f, v, bad in [
            ("date", "2024-02-29", "2024-02-30"),
            ("date-time", "2024-01-02T03:04:05.6+01:00", "2024-01-02 03:04:05"),
            ("time", "23:59:59Z", "23:59:59"),
            ("email", "a.b@c.io", "a@"),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
            ("uri", "https://a.b/c?d#e", "not a uri"),
            ("ipv4", "10.0.0.255", "10.0.0.256"),
            ("ipv6", "2001:db8::1", "2001:db8:::1"),
            ("hostname", "a-b.example.com", "-a.example.com"),
            ("duration", "P1DT2H", "P"),
            ("uri-reference", "../a", None),
            ("regex", "^a$", None),
        ]
    },
    **{
        k: ({"type": "integer", k: v}, 1, None)
        for k, v in [
            ("title", "T"),
            ("description", "D"),
            ("default", 0),
            ("examples", [0]),
            ("$comment", "c"),
            ("deprecated", True),
            ("readOnly", True),
            ("writeOnly", True),
        ]
    },
}


def probe_keyword(schema: dict[str, Any], valid: Any, invalid: Any) -> dict[str, Any]:
    _, error, warnings = compile_schema(schema, STRICT)
    row: dict[str, Any] = {"compiles": error is None, "error": error, "warnings": warnings}
    grammar, lenient_error, lenient_warnings = compile_schema(schema, {**STRICT, **LENIENT})
    if error is not None:
        row["lenient_compiles"] = lenient_error is None
        row["lenient_warnings"] = lenient_warnings
    if lenient_error is None:
        row["valid_accepted"] = accepts(grammar, dumps(valid, "compact"))[0]
        # enforced: the (strict, else lenient) grammar refuses an instance this keyword makes invalid
        row["enforced"] = None if invalid is None else not accepts(grammar, dumps(invalid, "compact"))[0]
    return row


def probe_all() -> tuple[dict[str, Any], dict[str, Any]]:
    schemas = {e.name: probe_schema(e) for e in load_corpus()}
    keywords = {"llguidance": llguidance.get_version()} | {
        k: {"schema": s, "valid": v, "invalid": bad} | probe_keyword(s, v, bad)
        for k, (s, v, bad) in KEYWORD_CASES.items()
    }
    return schemas, keywords


def main() -> None:
    schemas, keywords = probe_all()
    SUPPORT_FILE.write_text(json.dumps(schemas, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    KEYWORDS_FILE.write_text(json.dumps(keywords, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    refused = {n: r["error"] for n, r in schemas.items() if not r["compiles"]}
    print(f"{len(schemas)} schemas, {len(refused)} refused")
    for n, msg in refused.items():
        print(f"  {n}: {msg.splitlines()[0]}")
    for n, r in schemas.items():
        for style, bad in (r["examples_rejected"] or {}).items():
            if bad:
                print(f"  rejected {style}: {n} {[b['example'] for b in bad]}")
    print(
        "keywords not enforced:",
        [k for k, r in keywords.items() if isinstance(r, dict) and r.get("enforced") is False],
    )


if __name__ == "__main__":
    main()
