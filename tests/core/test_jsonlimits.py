"""The nesting check every ingress runs on raw JSON before parsing (core.jsonlimits)."""

from __future__ import annotations

import json

import pytest

from core.jsonlimits import JSONTooDeep, check_depth, loads


def _nested(depth: int) -> str:
    doc: object = 1
    for i in range(depth):
        doc = [doc] if i % 2 else {"k": doc}
    return json.dumps(doc)


@pytest.mark.parametrize("depth", [0, 1, 31, 32])
def test_up_to_the_limit_parses(depth):
    assert loads(_nested(depth), 32) == json.loads(_nested(depth))


@pytest.mark.parametrize("depth", [33, 1000, 200_000])
def test_past_the_limit_is_refused_before_parsing(depth):
    with pytest.raises(JSONTooDeep, match="deeper than 32"):
        loads(_nested(depth) if depth < 1000 else "[" * depth + "]" * depth, 32)


def test_brackets_inside_strings_do_not_count():
    doc = json.dumps({"a": "[[[[{{{{" * 100, "b": ['\\"]]]]', "x\\\\"]})
    check_depth(doc, 3)
    assert loads(doc, 3)["b"][0] == '\\"]]]]'


def test_wide_documents_are_fine_and_malformed_ones_get_the_parsers_error():
    assert len(loads("[" + ",".join(["[1, {}]"] * 10_000) + "]", 3)) == 10_000
    for bad in ("{not json", "[}", "[" * 10 + "1"):
        with pytest.raises(ValueError) as exc:
            loads(bad, 32)
        assert not isinstance(exc.value, JSONTooDeep)
    with pytest.raises(JSONTooDeep):  # unbalanced and deep: the parser's recursion is bounded too
        loads('[{"a":' * 100_000, 32)
