"""DeepSeek-V3.1 / V3.2-Exp tool calls: `<｜tool▁calls▁begin｜>` then per call
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`.
The format carries no call id: each parsed call gets a fresh one."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from inference.parsers.base import DelimitedToolCalls, ToolSpec, call_dict, check_arguments, new_call_id

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"


class DeepSeekV31ToolCalls(DelimitedToolCalls):
    name = "deepseek_v31"
    start = CALLS_BEGIN
    end = CALLS_END
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, SEP, CALL_END)
    call_pattern = re.compile(
        re.escape(CALL_BEGIN) + r"(?P<name>.*?)" + re.escape(SEP) + r"(?P<args>.*?)" + re.escape(CALL_END),
        re.DOTALL,
    )

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        return CALLS_BEGIN in special_tokens or CALLS_BEGIN in template_source

    def one_call(
        self, m: re.Match[str], tools: Mapping[str, ToolSpec] | None, errors: list[str]
    ) -> dict[str, Any] | None:
        name, args = m.group("name").strip(), m.group("args").strip()
        return call_dict(new_call_id(), name, args) if check_arguments(name, args, tools, errors) else None

    def call_terms(self, index: int, tool: ToolSpec) -> str:
        lit = self.markup.lark
        return f"{lit(CALL_BEGIN)} {json.dumps(tool.name)} {lit(SEP)} args_{index} {lit(CALL_END)}"
