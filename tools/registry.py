"""Tool registry: lookup, argument validation, the OpenAI `tools` list, execution.

Third-party tools register through the `dayzero.tools` entry-point group: each entry point names
a callable returning a `Tool` (or an iterable of them).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

import jsonschema

from tools.base import (
    InvalidArgumentsError,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    UnknownToolError,
)

ENTRY_POINT_GROUP = "dayzero.tools"


class ToolRegistry:
    """Holds tools by name and runs them with validated arguments."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        name = tool.spec.name
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        validator_cls = jsonschema.validators.validator_for(tool.spec.parameters)
        validator_cls.check_schema(tool.spec.parameters)
        self._tools[name] = tool
        self._validators[name] = validator_cls(tool.spec.parameters)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(
                f"unknown tool {name!r}; available tools: {', '.join(self.names()) or '(none)'}"
            ) from None

    def spec(self, name: str) -> ToolSpec:
        return self.get(name).spec

    def openai_tools(self, allowed: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The OpenAI `tools` list, restricted to `allowed` names when given."""
        names = self.names() if allowed is None else [n for n in allowed if n in self._tools]
        return [self._tools[n].spec.openai_tool() for n in names]

    def parse_arguments(self, name: str, raw: str | Mapping[str, Any]) -> dict[str, Any]:
        """Decode and validate a model's tool-call arguments; raises `InvalidArgumentsError`."""
        spec = self.spec(name)
        if isinstance(raw, str):
            if len(raw.encode()) > spec.max_argument_bytes:
                raise InvalidArgumentsError(
                    f"arguments for {name!r} are {len(raw.encode())} bytes; the limit is {spec.max_argument_bytes}"
                )
            try:
                args = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError as exc:
                raise InvalidArgumentsError(f"arguments for {name!r} are not valid JSON: {exc}") from None
        else:
            args = dict(raw)
        if not isinstance(args, dict):
            raise InvalidArgumentsError(f"arguments for {name!r} must be a JSON object, got {type(args).__name__}")
        errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.path))
        if errors:
            msgs = [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:5]]
            raise InvalidArgumentsError(f"arguments for {name!r} violate its schema: " + "; ".join(msgs))
        return args

    def execute(self, name: str, raw_arguments: str | Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Validate and run one tool call. Errors are `ToolError`s; anything else is a bug in the tool."""
        tool = self.get(name)
        args = self.parse_arguments(name, raw_arguments)
        try:
            result = tool.run(args, context)
        except ToolError:
            raise
        except Exception as exc:  # a tool's own bug is a permanent failure the model can read
            raise ToolError(f"tool {name!r} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, ToolResult):
            result = ToolResult(content=result)
        return result


def load_entry_point_tools(registry: ToolRegistry) -> None:
    """Register every tool published under the `dayzero.tools` entry-point group."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _register_all(registry, ep.load()())


def load_tool_modules(registry: ToolRegistry, modules: Iterable[str]) -> None:
    """Import each module and register what its `dayzero_tools()` returns (used by config)."""
    for mod_name in modules:
        mod = importlib.import_module(mod_name)
        _register_all(registry, mod.dayzero_tools())


def _register_all(registry: ToolRegistry, produced: Tool | Iterable[Tool]) -> None:
    if isinstance(produced, Tool):
        registry.register(produced)
    else:
        for tool in produced:
            registry.register(tool)
