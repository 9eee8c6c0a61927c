"""A third-party tool published through the `dayzero.tools` entry-point group (test fixture)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.base import ToolContext, ToolResult, ToolSpec


class ShoutTool:
    spec = ToolSpec(
        name="shout",
        description="Upper-cases text.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        result_schema={"type": "string"},
    )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content=arguments["text"].upper())


def make_tools() -> list[ShoutTool]:
    return [ShoutTool()]


def dayzero_tools() -> ShoutTool:
    return ShoutTool()
