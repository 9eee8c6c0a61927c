"""A request's grammar (llguidance's Lark dialect), from the OpenAI surface: `response_format`
(`json_object`, `json_schema`), tools with `tool_choice` (`required`, a named function, `auto`) and
`parallel_tool_calls`. The tool calls it produces are the family's own format (`ToolCallFormat.
calls_rule`), so the family's parser reads them; a reasoning model may think first.

`auto` constrains only what follows the model's choice to call: free text, or the call part with
offered names and schema-valid arguments. Schemas are compiled with fixed separators (`", "`,
`": "`) and no free whitespace, which keeps answers short and terminating. A schema that the
grammar cannot express is refused with the library's message naming the keyword
(`GrammarError`): for `response_format` and `strict` tools; a non-strict tool whose schema is not
expressible is constrained to any JSON object instead.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from inference.parsers import OutputParser, ToolSpec
from inference.parsers.base import text_without

JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}
ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


class GrammarError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def with_options(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": JSON_OPTIONS}


@functools.lru_cache(maxsize=1024)
def schema_error(schema_json: str) -> str | None:
    """llguidance's refusal of a schema (None: it compiles), cached by the schema's text."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_json)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        return messages[0]
    unsupported = [m for m in messages if "nimplemented" in m or "not supported" in m or "unsupported" in m]
    return "; ".join(unsupported) or None


def _checked(schema: Any, param: str) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise GrammarError("the JSON schema must be an object", param)
    text = json.dumps(with_options(schema), sort_keys=True)
    if (err := schema_error(text)) is not None:
        raise GrammarError(f"the JSON schema cannot be enforced: {err}", param)
    return with_options(schema)


def describes_object(schema: Mapping[str, Any]) -> bool:
    """Whether a tool's parameters schema is an object's (`type: object`, or untyped with
    properties, a `$ref`, or nothing at all)."""
    if "type" in schema:
        return schema["type"] == "object"
    return not (set(schema) & {"enum", "const", "anyOf", "oneOf", "allOf", "items", "prefixItems", "pattern"})


def _tools_for_grammar(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    out = []
    for i, t in enumerate(tools):
        if not describes_object(t.parameters):
            raise GrammarError(
                f"tools[{i}].function.parameters must describe a JSON object (type: object); "
                f"a call's arguments are an object",
                f"tools[{i}].function.parameters",
            )
        try:
            out.append(replace(t, parameters=_checked(t.parameters, f"tools[{i}].function.parameters")))
        except GrammarError:
            if t.strict:
                raise
            out.append(replace(t, parameters=with_options(ANY_OBJECT)))
    return out


def response_schema(response_format: Any) -> dict[str, Any] | None:
    """The schema `response_format` asks for (None: free text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise GrammarError("'response_format' must be an object", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _checked(ANY_OBJECT, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
            raise GrammarError(
                "response_format.json_schema must be {name, schema, strict}", "response_format"
            )
        return _checked(spec.get("schema", {}), "response_format.json_schema.schema")
    raise GrammarError(
        "response_format.type must be 'text', 'json_object' or 'json_schema'", "response_format"
    )


def build_grammar(
    parser: OutputParser,
    *,
    response_format: Any = None,
    tools: Sequence[ToolSpec] = (),
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    inside_reasoning: bool = False,
) -> str | None:
    """The request's Lark grammar, or None when nothing is constrained."""
    schema = response_schema(response_format)
    fmt = parser.tool_format
    calling = bool(tools) and tool_choice != "none"
    if schema is None and not calling:
        return None
    rules: list[str] = []
    if calling:
        offered = list(tools)
        if isinstance(tool_choice, Mapping):
            name = (tool_choice.get("function") or {}).get("name")
            offered = [t for t in tools if t.name == name]
            if not offered:
                raise GrammarError(f"tool_choice names unknown function {name!r}", "tool_choice")
        rules.append(
            fmt.calls_rule(
                _tools_for_grammar(offered),
                parallel=parallel_tool_calls and not isinstance(tool_choice, Mapping),
            )
        )
    answer = "%json " + json.dumps(schema, ensure_ascii=False) if schema is not None else None
    if calling and (tool_choice == "required" or isinstance(tool_choice, Mapping)):
        body = "calls"
    elif calling:  # auto: free text (or the schema's JSON), or the calls
        if answer is not None:
            body = f"({answer} | calls)"
        elif parser.markup.is_special(fmt.start):  # free text never holds a special token
            rules.append(f"TEXT: {text_without(parser.markup, [])}")
            body = "(TEXT calls? | calls)"  # never empty: an answer or a call
        else:  # one lexeme of text up to the plain-text opener: the lexer cannot split that text
            opener = re.escape(fmt.start).replace("/", "\\/")
            rules.append(f"TEXT: {text_without(parser.markup, [fmt.start])}")
            rules.append(f"TEXT_OPEN: /(?s:.*){opener}/ & ~/(?s:.*{opener}.*{opener}.*)/")
            body = "(TEXT | TEXT_OPEN calls_tail)"
    else:
        body = answer
    start = f"start: {_reasoning_prefix(parser, inside_reasoning)}{body}"
    return "\n".join([start, *rules, *_reasoning_rules(parser)])


def _reasoning_prefix(parser: OutputParser, inside: bool) -> str:
    r = parser.reasoning
    if r is None:
        return ""
    end = parser.markup.lark(r.end)
    if inside:  # the prompt opened the reasoning: it must close before the answer
        return f"THINK? {end} WS? "
    return f"({parser.markup.lark(r.start)} THINK? {end} WS?)? "


def _reasoning_rules(parser: OutputParser) -> list[str]:
    r = parser.reasoning
    return (
        [] if r is None else [f"THINK: {text_without(parser.markup, [r.end])}", r"WS: /[\x20\x0A\x0D\x09]+/"]
    )
