"""The JSON-schema corpus: valid Draft 2020-12 schemas with valid examples, the keywords it covers, and
what llguidance makes of it (recorded by `python -m testing.structured.probe_support`)."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from testing.structured.corpus import (
    KEYWORDS_FILE,
    SUPPORT_FILE,
    keyword_coverage,
    load_corpus,
    load_unsupported,
)
from testing.structured.llg_bytes import STRICT, compile_schema
from testing.structured.probe_support import KEYWORD_CASES, probe_keyword, rejected_examples

CORPUS = load_corpus()
NAMES = [e.name for e in CORPUS]
SUPPORT = json.loads(SUPPORT_FILE.read_text(encoding="utf-8"))
KEYWORDS = json.loads(KEYWORDS_FILE.read_text(encoding="utf-8"))
REGENERATE = "llguidance changed its answer: rerun python -m testing.structured.probe_support"

REQUIRED_KEYWORDS = [
    "$ref", "$defs", "$ref:recursive", "anyOf", "oneOf", "allOf", "enum", "enum:>=100", "const", "type[]:null",
    "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minItems", "maxItems", "minProperties", "required", "additionalProperties", "description", "default",
    "title", "examples", "format", "format:date", "format:date-time", "format:email", "format:uuid",
    "format:uri", "format:ipv4", "format:time", "depth:>=6", "properties:>=30", "prefixItems", "items",
    "items:false", "uniqueItems",
]  # fmt: skip


def test_corpus_size_and_names():
    assert len(CORPUS) >= 220
    assert [int(n[:3]) for n in NAMES] == list(range(1, len(NAMES) + 1))
    assert all(e.examples for e in CORPUS)


def test_every_keyword_is_covered_five_times():
    coverage = keyword_coverage(CORPUS)
    assert {k: coverage.get(k, 0) for k in REQUIRED_KEYWORDS if coverage.get(k, 0) < 5} == {}


def test_additional_properties_false_schema_and_absent():
    tops = [e.schema for e in CORPUS if e.schema.get("type") == "object"]
    assert sum(t.get("additionalProperties") is False for t in tops) >= 5
    assert sum(isinstance(t.get("additionalProperties"), dict) for t in tops) >= 2
    assert sum("properties" in t and "additionalProperties" not in t for t in tops) >= 5


@pytest.mark.parametrize("entry", CORPUS, ids=NAMES)
def test_schema_is_valid_and_examples_validate(entry):
    assert entry.schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(entry.schema)
    validator = Draft202012Validator(entry.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    for i, example in enumerate(entry.examples):
        errors = [e.message for e in validator.iter_errors(example)]
        assert not errors, (i, errors)


def test_support_file_lists_the_corpus():
    assert sorted(SUPPORT) == NAMES


@pytest.mark.parametrize("entry", CORPUS, ids=NAMES)
def test_llguidance_compiles_all_but_the_recorded_refusals(entry):
    _, error, warnings = compile_schema(entry.schema, STRICT)
    recorded = SUPPORT[entry.name]
    assert (error is None, error, warnings) == (
        recorded["compiles"],
        recorded["error"],
        recorded["warnings"],
    ), REGENERATE


def test_refusals_are_few_and_named():
    refused = {n: r["error"] for n, r in SUPPORT.items() if not r["compiles"]}
    assert len(refused) <= 8
    assert all("uniqueItems" in m or "oneOf" in m for m in refused.values())
    assert all(r["lenient_compiles"] for r in SUPPORT.values())


@pytest.mark.parametrize("entry", CORPUS, ids=NAMES)
def test_llguidance_grammar_accepts_the_examples(entry):
    """Each example, serialised (spaced ", "/": " and compact), is taken byte by byte by the schema's
    grammar and leaves it accepting (the lenient grammar for a refused schema). The rejections that
    remain are llguidance's and recorded."""
    recorded = SUPPORT[entry.name]
    assert rejected_examples(entry, lenient=not recorded["compiles"]) == recorded["examples_rejected"], (
        REGENERATE
    )


def test_examples_are_accepted_except_known_llguidance_bugs():
    rejected = {(n, s) for n, r in SUPPORT.items() for s, bad in r["examples_rejected"].items() if bad}
    # 125: a value whose digits are a prefix of the bound's (2.2 under maximum 2.25); 128: a uint64 bound.
    assert {n for n, s in rejected if s != "spaced_ascii"} == {
        "125_num_two_decimal_bound_prefix_values",
        "128_num_large_integers",
    }


@pytest.mark.parametrize("keyword", sorted(KEYWORD_CASES))
def test_keyword_probe_matches_record(keyword):
    schema, valid, invalid = KEYWORD_CASES[keyword]
    recorded = {k: v for k, v in KEYWORDS[keyword].items() if k not in ("schema", "valid", "invalid")}
    assert probe_keyword(schema, valid, invalid) == recorded, REGENERATE


UNSUPPORTED = load_unsupported()


def test_unsupported_folder_names_each_keyword():
    assert len(UNSUPPORTED) >= 20
    assert all(u.keyword for u in UNSUPPORTED)


@pytest.mark.parametrize("entry", UNSUPPORTED, ids=[u.name for u in UNSUPPORTED])
def test_unsupported_schema_is_valid_but_refused(entry):
    Draft202012Validator.check_schema(entry.schema)
    _, error, _ = compile_schema(entry.schema, STRICT)
    assert error is not None
    assert entry.error_contains in error
