"""Tool registry: lookup, argument validation, the OpenAI `tools` list, execution.

Third-party tools register through the `dayzero.tools` entry-point group: each entry point names
a callable returning a `Tool` (or an iterable of them).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

import jsonschema

from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    UnknownToolError,
)

ENTRY_POINT_GROUP = "dayzero.tools"
# OpenAI function names: letters, digits, underscores and dashes, at most 64.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_JSON_DEPTH = 64


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_depth(value: Any, limit: int) -> int:
    """Nesting depth of decoded JSON, iteratively (no recursion on hostile input)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class ToolRegistry:
    """Holds tools by name and runs them with validated arguments."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._result_validators: dict[str, jsonschema.protocols.Validator] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        name = tool.spec.name
        if not _NAME_RE.match(name):
            raise ValueError(f"tool name {name!r} must match {_NAME_RE.pattern}")
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        validator_cls = jsonschema.validators.validator_for(tool.spec.parameters)
        validator_cls.check_schema(tool.spec.parameters)
        if tool.spec.result_schema is not None:
            result_cls = jsonschema.validators.validator_for(tool.spec.result_schema)
            result_cls.check_schema(tool.spec.result_schema)
            self._result_validators[name] = result_cls(tool.spec.result_schema)
        self._tools[name] = tool
        self._validators[name] = validator_cls(tool.spec.parameters)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(
                f"unknown tool {name!r}; available tools: {', '.join(self.names()) or '(none)'}",
                details={"tool": name, "available": self.names()},
            ) from None

    def spec(self, name: str) -> ToolSpec:
        return self.get(name).spec

    def openai_tools(self, allowed: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The OpenAI `tools` list, restricted to `allowed` names when given."""
        names = self.names() if allowed is None else [n for n in allowed if n in self._tools]
        return [self._tools[n].spec.openai_tool() for n in names]

    def parse_arguments(self, name: str, raw: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
        """Decode and validate a model's tool-call arguments; raises `InvalidArgumentsError`."""
        spec = self.spec(name)
        if isinstance(raw, str | bytes):
            size = len(raw.encode() if isinstance(raw, str) else raw)
            self._check_size(name, size, spec.max_argument_bytes)
            try:
                args = json.loads(raw, parse_constant=_reject_constant) if raw.strip() else {}
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise InvalidArgumentsError(
                    f"arguments for {name!r} are not valid JSON: {str(exc)[:200]}", details={"tool": name}
                ) from None
        else:
            args = dict(raw)
            try:
                size = len(json.dumps(args, allow_nan=False).encode())
            except (TypeError, ValueError, RecursionError) as exc:
                raise InvalidArgumentsError(
                    f"arguments for {name!r} are not JSON-serialisable: {str(exc)[:200]}",
                    details={"tool": name},
                ) from None
            self._check_size(name, size, spec.max_argument_bytes)
        if not isinstance(args, dict):
            raise InvalidArgumentsError(
                f"arguments for {name!r} must be a JSON object, got {type(args).__name__}",
                details={"tool": name},
            )
        if _json_depth(args, _MAX_JSON_DEPTH) > _MAX_JSON_DEPTH:
            raise InvalidArgumentsError(
                f"arguments for {name!r} nest deeper than {_MAX_JSON_DEPTH} levels", details={"tool": name}
            )
        errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.path))
        if errors:
            msgs = [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:5]]
            raise InvalidArgumentsError(
                f"arguments for {name!r} violate its schema: " + "; ".join(msgs),
                details={"tool": name, "violations": msgs},
            )
        return args

    @staticmethod
    def _check_size(name: str, size: int, limit: int) -> None:
        if size > limit:
            raise InvalidArgumentsError(
                f"arguments for {name!r} are {size} bytes; the limit is {limit}",
                details={"tool": name, "size_bytes": size, "limit_bytes": limit},
            )

    def execute(self, name: str, raw_arguments: str | Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Validate and run one tool call. Errors are `ToolError`s; anything else is a bug in the tool."""
        tool = self.get(name)
        args = self.parse_arguments(name, raw_arguments)
        try:
            result = tool.run(args, context)
        except ToolError:
            raise
        except Exception as exc:  # a tool's own bug is a permanent failure the model can read
            raise ToolError(
                f"tool {name!r} failed: {type(exc).__name__}: {str(exc)[:500]}", details={"tool": name}
            ) from exc
        if not isinstance(result, ToolResult):
            result = ToolResult(content=result)
        result_validator = self._result_validators.get(name)
        if result_validator is not None:
            errors = list(result_validator.iter_errors(result.content))
            if errors:  # the tool broke its own contract: a bug, not something a retry fixes
                raise PermanentToolError(
                    f"tool {name!r} returned a result that violates its result schema: {errors[0].message[:200]}",
                    details={"tool": name},
                )
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
