"""Kimi-K2 / Kimi-Linear tool calls: `<|tool_calls_section_begin|>` then per call
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`, then
`<|tool_calls_section_end|>`. The call id is the text between the first two markers, as the
family's template writes it back."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inference.parsers.base import ToolCallFormat, ToolSpec, call_dict, check_arguments, schema_term

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


class KimiToolCalls(ToolCallFormat):
    name = "kimi_k2"
    start = SECTION_BEGIN
    markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)
    _call = re.compile(
        re.escape(CALL_BEGIN)
        + r"(?P<id>.*?)"
        + re.escape(ARG_BEGIN)
        + r"(?P<args>.*?)"
        + re.escape(CALL_END),
        re.DOTALL,
    )
    _id = re.compile(r"^(?:functions\.)?(?P<name>[\w\-.]+):(?P<idx>\d+)$")

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        return SECTION_BEGIN in special_tokens

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        body = part[len(SECTION_BEGIN) :]
        errors: list[str] = []
        end = body.find(SECTION_END)
        if end < 0:
            errors.append("the tool-calls section is not closed (generation stopped inside it)")
        else:
            if body[end + len(SECTION_END) :].strip():
                errors.append("text after the tool-calls section")
            body = body[:end]
        calls: list[dict[str, Any]] = []
        pos = 0
        for m in self._call.finditer(body):
            if body[pos : m.start()].strip():
                errors.append(f"unparsable text in the tool-calls section: {body[pos : m.start()][:80]!r}")
            pos = m.end()
            raw_id, args = m.group("id").strip(), m.group("args").strip()
            idm = self._id.match(raw_id)
            if idm is None:
                errors.append(f"malformed tool-call id {raw_id[:60]!r} (want functions.NAME:INDEX)")
            elif check_arguments(idm.group("name"), args, tools, errors):
                calls.append(call_dict(raw_id, idm.group("name"), args))
        if body[pos:].strip():
            errors.append(f"incomplete or unparsable tool call: {body[pos:][:80]!r}")
        return calls, errors

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        lit = self.markup.lark
        rules = [
            f"calls: {lit(SECTION_BEGIN)} calls_tail",
            f"calls_tail: call{' call*' if parallel else ''} {lit(SECTION_END)}",
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, t in enumerate(tools):
            rules.append(
                f"call_{i}: {lit(CALL_BEGIN)} {json.dumps(f'functions.{t.name}:')} /[0-9]{{1,4}}/ {lit(ARG_BEGIN)} args_{i} {lit(CALL_END)}"
            )
            rules.append(f"args_{i}: {schema_term(t)}")
        return "\n".join(rules)
