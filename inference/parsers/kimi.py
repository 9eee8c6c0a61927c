"""Kimi-K2 / Kimi-Linear tool calls: `<|tool_calls_section_begin|>` then per call
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`, then
`<|tool_calls_section_end|>`. The call id is the text between the first two markers, as the
family's template writes it back."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from inference.parsers.base import DelimitedToolCalls, ToolSpec, call_dict, check_arguments

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


class KimiToolCalls(DelimitedToolCalls):
    name = "kimi_k2"
    start = SECTION_BEGIN
    end = SECTION_END
    markers = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)
    call_pattern = re.compile(
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

    def one_call(
        self, m: re.Match[str], tools: Mapping[str, ToolSpec] | None, errors: list[str]
    ) -> dict[str, Any] | None:
        raw_id, args = m.group("id").strip(), m.group("args").strip()
        idm = self._id.match(raw_id)
        if idm is None:
            errors.append(f"malformed tool-call id {raw_id[:60]!r} (want functions.NAME:INDEX)")
            return None
        return (
            call_dict(raw_id, idm.group("name"), args)
            if check_arguments(idm.group("name"), args, tools, errors)
            else None
        )

    def call_terms(self, index: int, tool: ToolSpec) -> str:
        lit = self.markup.lark
        # at most 4 digits of index: a model that keeps writing digits still reaches its arguments
        head = json.dumps(f"functions.{tool.name}:")
        return f"{lit(CALL_BEGIN)} {head} /[0-9]{{1,4}}/ {lit(ARG_BEGIN)} args_{index} {lit(CALL_END)}"
