"""Agent tools: protocol, registry, built-in tools, sandbox. Knows nothing of tasks or the DB."""

from tools.base import (
    Attachment,
    ErrorKind,
    InvalidArgumentsError,
    PermanentToolError,
    RetryableToolError,
    RetryPolicy,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    ToolTimeoutError,
    UnknownToolError,
)
from tools.registry import ToolRegistry

__all__ = [
    "Attachment",
    "ErrorKind",
    "InvalidArgumentsError",
    "PermanentToolError",
    "RetryPolicy",
    "RetryableToolError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolTimeoutError",
    "UnknownToolError",
]
