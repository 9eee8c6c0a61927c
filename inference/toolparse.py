"""Tool-call parsers, one per model family, chosen by name (`get_tool_parser("kimi")`).

A parser turns the text a model generated (special tokens kept as text) into OpenAI-style
`tool_calls`. A malformed call never raises: it becomes an entry in `errors`, the valid calls are
still returned, and the raw text is kept as the message content so nothing the model said is lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ParsedMessage:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolParser:
    name = "none"

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> ParsedMessage:
        return ParsedMessage(text)


SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


class KimiToolParser(ToolParser):
    """`<|tool_calls_section_begin|>` (`<|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{json}<|tool_call_end|>`)* `<|tool_calls_section_end|>`."""

    name = "kimi"
    _call = re.compile(
        re.escape(CALL_BEGIN)
        + r"(?P<id>.*?)"
        + re.escape(ARG_BEGIN)
        + r"(?P<args>.*?)"
        + re.escape(CALL_END),
        re.DOTALL,
    )
    _id = re.compile(r"^(?:functions\.)?(?P<name>[A-Za-z_][\w\-.]*):(?P<idx>\d+)$")

    def parse(self, text: str, tool_names: Collection[str] | None = None) -> ParsedMessage:
        start = text.find(SECTION_BEGIN)
        if start < 0:
            if CALL_BEGIN in text or ARG_BEGIN in text:
                return ParsedMessage(text, errors=["tool-call tokens outside a tool-calls section"])
            return ParsedMessage(text or None)
        head = text[:start]
        body_start = start + len(SECTION_BEGIN)
        end = text.find(SECTION_END, body_start)
        errors: list[str] = []
        if end < 0:
            errors.append("the tool-calls section is not closed (generation stopped inside it)")
            body, tail = text[body_start:], ""
        else:
            body, tail = text[body_start:end], text[end + len(SECTION_END) :]
        calls: list[dict[str, Any]] = []
        pos = 0
        for m in self._call.finditer(body):
            if body[pos : m.start()].strip():
                errors.append(f"unparsable text in the tool-calls section: {body[pos : m.start()][:80]!r}")
            pos = m.end()
            call = self._one(m.group("id").strip(), m.group("args").strip(), tool_names, errors)
            if call is not None:
                calls.append(call)
        if body[pos:].strip():
            errors.append(f"incomplete or unparsable tool call: {body[pos:][:80]!r}")
        if tail.strip():
            errors.append("text after the tool-calls section")
        if errors:
            return ParsedMessage(text, calls, errors)
        return ParsedMessage(head or None, calls, errors)

    def _one(
        self, raw_id: str, args: str, tool_names: Collection[str] | None, errors: list[str]
    ) -> dict | None:
        m = self._id.match(raw_id)
        if m is None:
            errors.append(f"malformed tool-call id {raw_id[:60]!r} (want functions.NAME:INDEX)")
            return None
        name = m.group("name")
        if tool_names is not None and name not in tool_names:
            errors.append(f"call of unknown tool {name!r}")
            return None
        try:
            parsed = json.loads(args)
        except ValueError as exc:
            errors.append(f"arguments of {name!r} are not valid JSON: {exc}")
            return None
        if not isinstance(parsed, dict):
            errors.append(f"arguments of {name!r} must be a JSON object")
            return None
        return {"id": raw_id, "type": "function", "function": {"name": name, "arguments": args}}


_PARSERS: dict[str, Callable[[], ToolParser]] = {"none": ToolParser, "kimi": KimiToolParser}


def get_tool_parser(name: str) -> ToolParser:
    try:
        return _PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {sorted(_PARSERS)}") from None
