"""Qwen3 tool calls, in the two forms the family's templates use.

`hermes` (Qwen3, Qwen3-Next): `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, one
block per call. `qwen3_xml` (Qwen3-Coder style): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\n
VALUE\\n</parameter>\\n...</function>\\n</tool_call>`, a string parameter's value raw, any other JSON.
Neither carries a call id: each parsed call gets a fresh one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inference.parsers.base import ToolCallFormat, ToolSpec, call_dict, check_arguments, new_call_id

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_MORE = ' ("\\n" call)*'  # Lark: further calls, one per line
# a raw string value with its closing tag, one lexeme: it ends at the first `</parameter>`
_STRING_VALUE = r"STRING_VALUE: /(?s:.*)\n<\/parameter>\n/ & ~/(?s:.*<\/parameter>.*<\/parameter>.*)/"


def _call_rules(n: int, parallel: bool) -> list[str]:
    """`calls`, `calls_tail` and `call` over the formats' `body_{i}` rules (a call after `<tool_call>`)."""
    return [
        f"calls: {json.dumps(OPEN)} calls_tail",
        f"calls_tail: body{_MORE if parallel else ''}",
        "body: " + " | ".join(f"body_{i}" for i in range(n)),
        f"call: {json.dumps(OPEN)} body",
    ]


def _blocks(part: str, errors: list[str]) -> list[str]:
    """The bodies of the `<tool_call>...</tool_call>` blocks of `part`."""
    out: list[str] = []
    pos = 0
    while pos < len(part):
        i = part.find(OPEN, pos)
        if i < 0:
            if part[pos:].strip():
                errors.append(f"text after the tool calls: {part[pos:][:80]!r}")
            break
        if part[pos:i].strip():
            errors.append(f"text between tool calls: {part[pos:i][:80]!r}")
        j = part.find(CLOSE, i)
        if j < 0:
            errors.append("a tool call is not closed (generation stopped inside it)")
            break
        out.append(part[i + len(OPEN) : j])
        pos = j + len(CLOSE)
    return out


class HermesToolCalls(ToolCallFormat):
    name = "hermes"
    start = OPEN
    markers = (OPEN, CLOSE)

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        return OPEN in template_source and "<function=" not in template_source

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        errors: list[str] = []
        calls = []
        for body in _blocks(part, errors):
            try:
                obj = json.loads(body)
            except ValueError as exc:
                errors.append(f"a tool call is not valid JSON: {exc}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                errors.append("a tool call must be a JSON object with a string 'name'")
                continue
            args = json.dumps(obj.get("arguments", {}), ensure_ascii=False)
            if check_arguments(obj["name"], args, tools, errors):
                calls.append(call_dict(new_call_id(), obj["name"], args))
        return calls, errors

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        rules = _call_rules(len(tools), parallel)
        for i, t in enumerate(tools):
            schema = {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": dict(t.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            defs = t.parameters.get("$defs")
            if isinstance(defs, Mapping):  # refs are written against the parameters' root
                schema = _rebase_refs(schema, "#/properties/arguments")
            rules.append(
                f"body_{i}: {json.dumps(chr(10))} %json {json.dumps(schema)} {json.dumps(chr(10) + CLOSE)}"
            )
        return "\n".join(rules)


def _rebase_refs(value: Any, prefix: str) -> Any:
    """`$ref: "#/..."` -> `$ref: prefix + "/..."` (a schema moved under `prefix`)."""
    if isinstance(value, Mapping):
        out = {k: _rebase_refs(v, prefix) for k, v in value.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = prefix + ref[1:]
        return out
    if isinstance(value, list):
        return [_rebase_refs(v, prefix) for v in value]
    return value


class Qwen3XmlToolCalls(ToolCallFormat):
    name = "qwen3_xml"
    start = OPEN
    markers = (OPEN, CLOSE)
    _fn = re.compile(r"^\s*<function=(?P<name>[^>\n]+)>(?P<body>.*)</function>\s*$", re.DOTALL)
    _param = re.compile(r"<parameter=(?P<name>[^>\n]+)>\n?(?P<value>.*?)\n?</parameter>", re.DOTALL)

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        return OPEN in template_source and "<function=" in template_source

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        errors: list[str] = []
        calls = []
        for body in _blocks(part, errors):
            m = self._fn.match(body)
            if m is None:
                errors.append(f"a tool call is not a <function=NAME> block: {body[:80]!r}")
                continue
            name = m.group("name").strip()
            props = (tools[name].parameters.get("properties") or {}) if tools and name in tools else {}
            args: dict[str, Any] = {}
            for p in self._param.finditer(m.group("body")):
                key, raw = p.group("name").strip(), p.group("value")
                kind = (props.get(key) or {}).get("type") if isinstance(props.get(key), Mapping) else None
                if kind == "string":
                    args[key] = raw
                    continue
                try:
                    args[key] = json.loads(raw)
                except ValueError:
                    args[key] = raw
            text = json.dumps(args, ensure_ascii=False)
            if check_arguments(name, text, tools, errors):
                calls.append(call_dict(new_call_id(), name, text))
        return calls, errors

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        rules = [*_call_rules(len(tools), parallel), _STRING_VALUE]
        for i, t in enumerate(tools):
            props = t.parameters.get("properties") or {}
            required = set(t.parameters.get("required") or [])
            defs = t.parameters.get("$defs")
            parts = []
            for j, (key, sub) in enumerate(props.items()):
                head = json.dumps(f"<parameter={key}>\n")
                if isinstance(sub, Mapping) and sub.get("type") == "string":
                    # raw text in this format: an enum is its alternatives; other string keywords
                    # (pattern, lengths) are not expressed
                    enum = [v for v in sub.get("enum", []) if isinstance(v, str)]
                    end = json.dumps("\n</parameter>\n")
                    value = f"({' | '.join(map(json.dumps, enum))}) {end}" if enum else "STRING_VALUE"
                else:
                    sub = dict(sub) if isinstance(sub, Mapping) else {}
                    if isinstance(defs, Mapping):
                        sub["$defs"] = defs
                    value = "%json " + json.dumps(sub) + " " + json.dumps("\n</parameter>\n")
                rules.append(f"p_{i}_{j}: {head} {value}")
                parts.append(f"p_{i}_{j}" + ("" if key in required else "?"))
            opener = json.dumps(f"\n<function={t.name}>\n")
            closer = json.dumps(f"</function>\n{CLOSE}")
            rules.append(f"body_{i}: {opener} {' '.join(parts)} {closer}")
        return "\n".join(rules)
