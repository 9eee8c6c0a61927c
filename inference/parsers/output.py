"""One model's output parsing: reasoning first, then content, then the tool-call part; the same
parse serves a whole answer and a stream (whose deltas add up to exactly the whole answer's
content and reasoning: a stream only shows text that no later token can turn into markup)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inference.parsers.base import Markup, ParsedMessage, ToolCallFormat, ToolSpec
from inference.parsers.reasoning import ReasoningFormat


@dataclass(frozen=True, slots=True)
class OutputContext:
    """What a request's parse depends on besides the text."""

    tools: Mapping[str, ToolSpec] | None = None  # offered tools by name (None: any name)
    parse_tools: bool = False  # tool calls expected (tools offered, tool_choice not "none")
    inside_reasoning: bool = False  # the prompt left the model inside its reasoning


class OutputParser:
    def __init__(
        self, markup: Markup, tool_format: ToolCallFormat, reasoning: ReasoningFormat | None
    ) -> None:
        self.markup = markup
        self.tool_format = tool_format
        self.reasoning = reasoning
        texts = [*markup.special, *tool_format.markers]
        if reasoning is not None:
            texts += [reasoning.start, reasoning.end]
        self._prefixes = {t[:k] for t in texts for k in range(1, len(t))}
        self._longest = max((len(t) for t in texts), default=1)

    def parse(self, text: str, ctx: OutputContext) -> ParsedMessage:
        reasoning, rest = None, text
        if self.reasoning is not None:
            reasoning, rest, _ = self.reasoning.split(text, inside=ctx.inside_reasoning)
        head, part = self.tool_format.split(rest) if ctx.parse_tools else (rest, None)
        calls: list[dict[str, Any]] = []
        errors: list[str] = []
        if part is not None:
            calls, errors = self.tool_format.parse_calls(part, ctx.tools)
        elif ctx.parse_tools and self.tool_format.stray_markup(head):
            errors.append("tool-call markup outside a tool-call part")
        content = self.markup.clean(head)
        return ParsedMessage(
            content or None, calls, errors, self.markup.clean(reasoning) if reasoning else None
        )

    def held_back(self, text: str) -> int:
        """How many trailing characters of `text` could still become a marker or special token."""
        for k in range(min(self._longest - 1, len(text)), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0


@dataclass(slots=True)
class StreamParser:
    """Turns a stream of text deltas into OpenAI chat-chunk deltas."""

    parser: OutputParser
    ctx: OutputContext
    text: str = ""
    sent: dict[str, str] = field(default_factory=lambda: {"reasoning_content": "", "content": ""})

    def _diff(self, key: str, now: str | None) -> dict[str, str]:
        now, before = now or "", self.sent[key]
        if len(now) > len(before) and now.startswith(before):
            self.sent[key] = now
            return {key: now[len(before) :]}
        return {}

    def push(self, delta: str) -> dict[str, str]:
        self.text += delta
        if not delta:
            return {}
        safe = self.text[: len(self.text) - self.parser.held_back(self.text)]
        p = self.parser.parse(safe, self.ctx)
        return {**self._diff("reasoning_content", p.reasoning), **self._diff("content", p.content)}

    def finish(self) -> tuple[dict[str, Any], ParsedMessage]:
        """The last delta (what the stream has not shown yet, and the tool calls) and the parse."""
        p = self.parser.parse(self.text, self.ctx)
        final: dict[str, Any] = {
            **self._diff("reasoning_content", p.reasoning),
            **self._diff("content", p.content),
        }
        if p.tool_calls:
            final["tool_calls"] = [{"index": i, **c} for i, c in enumerate(p.tool_calls)]
        return final, p
