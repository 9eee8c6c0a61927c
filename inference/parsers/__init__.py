"""Model output -> OpenAI messages, one format per family (tool calls, reasoning), and the grammar
that produces each format (see `base.ToolCallFormat`)."""

from inference.parsers.base import Markup, ParsedMessage, ToolCallFormat, ToolSpec
from inference.parsers.output import OutputContext, OutputParser, StreamParser
from inference.parsers.registry import TOOL_FORMAT_NAMES, make_output_parser

__all__ = [
    "TOOL_FORMAT_NAMES",
    "Markup",
    "OutputContext",
    "OutputParser",
    "ParsedMessage",
    "StreamParser",
    "ToolCallFormat",
    "ToolSpec",
    "make_output_parser",
]
