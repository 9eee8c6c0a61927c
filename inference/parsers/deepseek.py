"""DeepSeek-V3.1 / V3.2-Exp tool calls: `<｜tool▁calls▁begin｜>` then per call
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`.
The format carries no call id: each parsed call gets a fresh one."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inference.parsers.base import (
    ToolCallFormat,
    ToolSpec,
    call_dict,
    check_arguments,
    new_call_id,
    schema_term,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
SEP = "<｜tool▁sep｜>"
CALL_END = "<｜tool▁call▁end｜>"


class DeepSeekV31ToolCalls(ToolCallFormat):
    name = "deepseek_v31"
    start = CALLS_BEGIN
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, SEP, CALL_END)
    _call = re.compile(
        re.escape(CALL_BEGIN) + r"(?P<name>.*?)" + re.escape(SEP) + r"(?P<args>.*?)" + re.escape(CALL_END),
        re.DOTALL,
    )

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        return CALLS_BEGIN in special_tokens or CALLS_BEGIN in template_source

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        body = part[len(CALLS_BEGIN) :]
        errors: list[str] = []
        end = body.find(CALLS_END)
        if end < 0:
            errors.append("the tool-calls block is not closed (generation stopped inside it)")
        else:
            if body[end + len(CALLS_END) :].strip():
                errors.append("text after the tool-calls block")
            body = body[:end]
        calls: list[dict[str, Any]] = []
        pos = 0
        for m in self._call.finditer(body):
            if body[pos : m.start()].strip():
                errors.append(f"unparsable text in the tool-calls block: {body[pos : m.start()][:80]!r}")
            pos = m.end()
            name, args = m.group("name").strip(), m.group("args").strip()
            if check_arguments(name, args, tools, errors):
                calls.append(call_dict(new_call_id(), name, args))
        if body[pos:].strip():
            errors.append(f"incomplete or unparsable tool call: {body[pos:][:80]!r}")
        return calls, errors

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        lit = self.markup.lark
        rules = [
            f"calls: {lit(CALLS_BEGIN)} calls_tail",
            f"calls_tail: call{' call*' if parallel else ''} {lit(CALLS_END)}",
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, t in enumerate(tools):
            rules.append(
                f"call_{i}: {lit(CALL_BEGIN)} {json.dumps(t.name)} {lit(SEP)} args_{i} {lit(CALL_END)}"
            )
            rules.append(f"args_{i}: {schema_term(t)}")
        return "\n".join(rules)
