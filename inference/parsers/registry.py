"""Parsers by name (vLLM's `--tool-call-parser` / `--reasoning-parser` names where they exist), and
the choice for a checkpoint from its own files: its special tokens and chat template."""

from __future__ import annotations

from collections.abc import Mapping

from inference.parsers.base import Markup, NoToolCalls, ToolCallFormat
from inference.parsers.deepseek import DeepSeekV31ToolCalls
from inference.parsers.kimi import KimiToolCalls
from inference.parsers.output import OutputParser
from inference.parsers.qwen import HermesToolCalls, Qwen3XmlToolCalls
from inference.parsers.reasoning import REASONING_FORMATS, ReasoningFormat

# detection order: the first format whose markers a checkpoint has
TOOL_FORMATS: tuple[type[ToolCallFormat], ...] = (
    KimiToolCalls,
    DeepSeekV31ToolCalls,
    Qwen3XmlToolCalls,
    HermesToolCalls,
)
TOOL_FORMAT_NAMES: dict[str, type[ToolCallFormat]] = {
    "kimi_k2": KimiToolCalls,
    "kimi": KimiToolCalls,
    "deepseek_v31": DeepSeekV31ToolCalls,
    "deepseek_v3": DeepSeekV31ToolCalls,
    "hermes": HermesToolCalls,
    "qwen3": HermesToolCalls,
    "qwen3_xml": Qwen3XmlToolCalls,
    "qwen3_coder": Qwen3XmlToolCalls,
    "none": NoToolCalls,
}


def make_output_parser(
    special_tokens: Mapping[str, int],
    template_source: str,
    *,
    tool_call_parser: str = "auto",
    reasoning_parser: str = "auto",
) -> OutputParser:
    """`auto`: chosen from the checkpoint; a name: that parser (ValueError naming the known ones)."""
    markup = Markup(special_tokens)
    if tool_call_parser == "auto":
        fmt: type[ToolCallFormat] = next(
            (f for f in TOOL_FORMATS if f.detect(special_tokens, template_source)), NoToolCalls
        )
    elif tool_call_parser in TOOL_FORMAT_NAMES:
        fmt = TOOL_FORMAT_NAMES[tool_call_parser]
    else:
        raise ValueError(
            f"unknown tool-call parser {tool_call_parser!r}; known: auto, {', '.join(sorted(TOOL_FORMAT_NAMES))}"
        )
    reasoning: ReasoningFormat | None
    if reasoning_parser == "auto":
        candidate = REASONING_FORMATS["think"]
        reasoning = candidate if candidate.detect(special_tokens, template_source) else None
    elif reasoning_parser == "none":
        reasoning = None
    elif reasoning_parser in REASONING_FORMATS:
        reasoning = REASONING_FORMATS[reasoning_parser]
    else:
        raise ValueError(
            f"unknown reasoning parser {reasoning_parser!r}; known: auto, none, {', '.join(sorted(REASONING_FORMATS))}"
        )
    return OutputParser(markup, fmt(markup), reasoning)
