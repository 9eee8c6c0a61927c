"""What every family's output format offers: a parse of generated text into content, reasoning and
OpenAI tool calls, and the grammar (llguidance's Lark) that produces exactly that format.

A parse never raises: a malformed call becomes an entry in `errors` (what is wrong, briefly), the
valid calls are still returned, and `content` is the text before the tool-call part. Special
tokens never reach `content` or `reasoning` (`Markup.clean`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(slots=True)
class ParsedMessage:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One offered function: its name, the JSON schema of its arguments, and whether the request
    asked for it to be followed exactly (`strict`)."""

    name: str
    parameters: Mapping[str, Any]
    strict: bool = False

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolSpec]:
        out = []
        for t in tools or ():
            fn = t.get("function") or {}
            params = fn.get("parameters")
            out.append(
                cls(
                    fn["name"],
                    params if isinstance(params, Mapping) else {"type": "object"},
                    bool(fn.get("strict")),
                )
            )
        return out


class Markup:
    """A tokenizer's view of format markers: a marker that is a special token is matched (and
    grammar-written) as that token; any other marker is plain text."""

    def __init__(self, special_tokens: Mapping[str, int]) -> None:
        self.special = dict(special_tokens)
        names = sorted(self.special, key=len, reverse=True)
        self._strip = re.compile("|".join(map(re.escape, names))) if names else None

    def lark(self, marker: str) -> str:
        """A Lark term producing `marker`."""
        i = self.special.get(marker)
        return f"<[{i}]>" if i is not None else json.dumps(marker)

    def is_special(self, marker: str) -> bool:
        return marker in self.special

    def clean(self, text: str | None) -> str | None:
        """`text` without special tokens (None stays None)."""
        if text is None or self._strip is None:
            return text
        return self._strip.sub("", text)


def text_without(markup: Markup, markers: Iterable[str]) -> str:
    """A Lark lexeme of free text (special tokens never match a text lexeme) that contains none of
    the plain-text `markers`."""
    plain = [m for m in markers if not markup.is_special(m)]
    base = "/(?s:.+)/"
    if not plain:
        return base
    banned = "|".join(re.escape(m).replace("/", "\\/") for m in plain)
    return f"{base} & ~/(?s:.*({banned}).*)/"


def schema_term(spec: ToolSpec) -> str:
    return "%json " + json.dumps(spec.parameters, ensure_ascii=False, separators=(",", ":"))


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_dict(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def check_arguments(name: str, args: str, tools: Mapping[str, ToolSpec] | None, errors: list[str]) -> bool:
    """Whether a call of `name` with JSON `args` is well formed (errors says why not)."""
    if tools is not None and name not in tools:
        errors.append(f"call of unknown tool {name!r}")
        return False
    try:
        parsed = json.loads(args)
    except ValueError as exc:
        errors.append(f"arguments of {name!r} are not valid JSON: {exc}")
        return False
    if not isinstance(parsed, dict):
        errors.append(f"arguments of {name!r} must be a JSON object")
        return False
    return True


class ToolCallFormat:
    """A family's tool-call format. Subclasses set `name`, `start` (the marker that opens the tool
    calls), `markers` (every marker of the format) and implement `parse_calls` and `calls_rule`."""

    name: ClassVar[str] = "none"
    start: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, markup: Markup) -> None:
        self.markup = markup

    @classmethod
    def detect(cls, special_tokens: Mapping[str, int], template_source: str) -> bool:
        """Whether a checkpoint (its special tokens, its chat template) uses this format."""
        return False

    def split(self, text: str) -> tuple[str, str | None]:
        """(text before the tool calls, the tool-call part or None)."""
        if not self.start:
            return text, None
        i = text.find(self.start)
        return (text, None) if i < 0 else (text[:i], text[i:])

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        raise NotImplementedError

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        """Lark rules defining `calls`, one tool-call part calling `tools` (one call unless
        `parallel`), and `calls_tail`, the same part after its opening `start` marker."""
        raise NotImplementedError

    def stray_markup(self, text: str) -> bool:
        """Whether text outside the tool-call part holds markers of the format (a broken call)."""
        return any(m in text for m in self.markers if m != self.start)


class DelimitedToolCalls(ToolCallFormat):
    """A format whose calls sit between an opening and a closing special token (`start`, `end`),
    each call matched by `call_pattern` (Kimi-K2, DeepSeek-V3.1). Subclasses turn one match into a
    call (`one_call`) and write one tool's call as Lark terms (`call_terms`)."""

    end: ClassVar[str] = ""
    call_pattern: ClassVar[re.Pattern[str]]

    def one_call(
        self, m: re.Match[str], tools: Mapping[str, ToolSpec] | None, errors: list[str]
    ) -> dict[str, Any] | None:
        raise NotImplementedError

    def call_terms(self, index: int, tool: ToolSpec) -> str:
        raise NotImplementedError

    def parse_calls(
        self, part: str, tools: Mapping[str, ToolSpec] | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        body = part[len(self.start) :]
        errors: list[str] = []
        end = body.find(self.end)
        if end < 0:
            errors.append("the tool calls are not closed (generation stopped inside them)")
        else:
            if body[end + len(self.end) :].strip():
                errors.append("text after the tool calls")
            body = body[:end]
        calls: list[dict[str, Any]] = []
        pos = 0
        for m in self.call_pattern.finditer(body):
            if body[pos : m.start()].strip():
                errors.append(f"unparsable text among the tool calls: {body[pos : m.start()][:80]!r}")
            pos = m.end()
            if (call := self.one_call(m, tools, errors)) is not None:
                calls.append(call)
        if body[pos:].strip():
            errors.append(f"incomplete or unparsable tool call: {body[pos:][:80]!r}")
        return calls, errors

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        lit = self.markup.lark
        rules = [
            f"calls: {lit(self.start)} calls_tail",
            f"calls_tail: call{' call*' if parallel else ''} {lit(self.end)}",
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        ]
        for i, t in enumerate(tools):
            rules += [f"call_{i}: {self.call_terms(i, t)}", f"args_{i}: {schema_term(t)}"]
        return "\n".join(rules)


class NoToolCalls(ToolCallFormat):
    """Models without a tool-call format: the text is the content."""

    def parse_calls(self, part: str, tools: Mapping[str, ToolSpec] | None) -> tuple[list, list[str]]:
        return [], []

    def calls_rule(self, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
        raise ValueError("this model has no tool-call format; pass --tool-call-parser")
