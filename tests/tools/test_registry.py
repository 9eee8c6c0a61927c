"""Registry: structured errors for unknown tools, schema violations and oversized arguments."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from tools import (
    ErrorKind,
    InvalidArgumentsError,
    ToolContext,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    UnknownToolError,
)
from tools.base import PermanentToolError, RetryableToolError, RetryPolicy, ToolError
from tools.builtin import build_default_registry
from tools.config import ToolsConfig


class EchoTool:
    spec = ToolSpec(
        name="echo",
        description="echo",
        parameters={
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 10},
                "n": {"type": "integer", "minimum": 0},
            },
            "required": ["text"],
            "additionalProperties": False,
        },
        result_schema={"type": "object", "required": ["text"]},
        max_argument_bytes=100,
    )

    def __init__(self, result: Any = None) -> None:
        self.result = result

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        if self.result is not None:
            return ToolResult(content=self.result)
        return ToolResult(content={"text": arguments["text"]})


def _error(exc_info: pytest.ExceptionInfo[ToolError]) -> dict[str, Any]:
    d = exc_info.value.to_dict()
    json.dumps(d)  # what the model reads must be JSON
    return d


def test_unknown_tool_is_structured(ctx: ToolContext) -> None:
    reg = ToolRegistry([EchoTool()])
    with pytest.raises(UnknownToolError) as ei:
        reg.execute("rm_rf", "{}", ctx)
    d = _error(ei)
    assert d["kind"] == "invalid_arguments"
    assert d["details"] == {"tool": "rm_rf", "available": ["echo"]}
    assert "unknown tool 'rm_rf'" in d["error"]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        pytest.param('{"text": 5}', "text: 5 is not of type 'string'", id="wrong-type"),
        pytest.param("{}", "'text' is a required property", id="missing-required"),
        pytest.param('{"text": "a", "extra": 1}', "Additional properties", id="extra-property"),
        pytest.param('{"text": "a", "n": -1}', "minimum", id="below-minimum"),
        pytest.param('{"text": "aaaaaaaaaaaaaaa"}', "too long", id="string-too-long"),
        pytest.param("[1, 2]", "must be a JSON object", id="not-an-object"),
        pytest.param("{not json", "not valid JSON", id="bad-json"),
        pytest.param('{"text": NaN}', "not valid JSON", id="nan-constant"),
    ],
)
def test_schema_violations_are_structured(ctx: ToolContext, raw: str, needle: str) -> None:
    reg = ToolRegistry([EchoTool()])
    with pytest.raises(InvalidArgumentsError) as ei:
        reg.execute("echo", raw, ctx)
    d = _error(ei)
    assert d["kind"] == ErrorKind.INVALID_ARGUMENTS.value
    assert needle in d["error"]
    assert ei.value.started is False


def test_oversized_arguments_refused_before_parsing(ctx: ToolContext) -> None:
    reg = ToolRegistry([EchoTool()])
    raw = json.dumps({"text": "x" * 500})
    with pytest.raises(InvalidArgumentsError) as ei:
        reg.execute("echo", raw, ctx)
    d = _error(ei)
    assert d["details"]["limit_bytes"] == 100
    assert d["details"]["size_bytes"] == len(raw)
    # a mapping (already decoded by a client) is measured the same way
    with pytest.raises(InvalidArgumentsError, match="bytes; the limit is 100"):
        reg.execute("echo", {"text": "x" * 500}, ctx)


def test_deeply_nested_arguments_refused(ctx: ToolContext) -> None:
    class Roomy(EchoTool):
        spec = ToolSpec(
            name="roomy",
            description="",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
            max_argument_bytes=1_000_000,
        )

    reg = ToolRegistry([Roomy()])
    with pytest.raises(InvalidArgumentsError, match="not valid JSON"):  # would blow the C stack
        reg.parse_arguments("roomy", '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    nested: Any = "x"
    for _ in range(70):
        nested = {"a": nested}
    with pytest.raises(InvalidArgumentsError, match="nest deeper"):
        reg.parse_arguments("roomy", {"text": "a", "n": nested})


def test_valid_call_returns_result(ctx: ToolContext) -> None:
    reg = ToolRegistry([EchoTool()])
    assert reg.execute("echo", '{"text": "hi"}', ctx).content == {"text": "hi"}
    assert reg.execute("echo", {"text": "hi"}, ctx).content == {"text": "hi"}


def test_result_schema_is_enforced(ctx: ToolContext) -> None:
    reg = ToolRegistry([EchoTool(result={"nope": 1})])
    with pytest.raises(PermanentToolError, match="violates its result schema"):
        reg.execute("echo", '{"text": "hi"}', ctx)


def test_tool_bug_becomes_permanent_structured_error(ctx: ToolContext) -> None:
    class Broken(EchoTool):
        def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            raise KeyError("boom")

    reg = ToolRegistry([Broken()])
    with pytest.raises(ToolError) as ei:
        reg.execute("echo", '{"text": "hi"}', ctx)
    assert ei.value.to_dict()["kind"] == "permanent"
    assert "KeyError" in ei.value.to_dict()["error"]


def test_bad_tool_names_and_duplicates_refused() -> None:
    class Bad(EchoTool):
        spec = ToolSpec(name="has space", description="", parameters={"type": "object"})

    with pytest.raises(ValueError, match="must match"):
        ToolRegistry([Bad()])
    with pytest.raises(ValueError, match="already registered"):
        ToolRegistry([EchoTool(), EchoTool()])


def test_openai_tools_list_from_default_registry() -> None:
    reg = build_default_registry(ToolsConfig(enabled=("calculator", "workspace_read", "workspace_write")))
    tools = reg.openai_tools()
    assert [t["function"]["name"] for t in tools] == ["calculator", "workspace_read", "workspace_write"]
    for t in tools:
        assert t["type"] == "function"
        assert t["function"]["parameters"]["type"] == "object"
    assert reg.openai_tools(allowed=["calculator", "nope"])[0]["function"]["name"] == "calculator"


def test_every_builtin_declares_an_honest_spec() -> None:
    from tools.config import HttpConfig

    reg = build_default_registry(
        ToolsConfig(http=HttpConfig(allow_hosts=("example.org",)), load_entry_points=False)
    )
    assert set(reg.names()) == {
        "calculator",
        "python",
        "search_documents",
        "image_info",
        "image_crop_zoom",
        "http_get",
        "workspace_read",
        "workspace_write",
    }
    for name in reg.names():
        spec = reg.spec(name)
        assert spec.description and spec.result_schema is not None, name
        assert spec.parameters.get("additionalProperties") is False, name
        assert isinstance(spec.retry, RetryPolicy) and spec.retry.timeout_s > 0, name
        # a tool with side effects either dedupes on the idempotency key or is idempotent
        assert spec.idempotent or spec.accepts_idempotency_key, name
    assert reg.spec("workspace_write").accepts_idempotency_key
    assert "network" in reg.spec("http_get").resources
    assert "workspace" in reg.spec("workspace_write").resources


def test_http_get_disabled_without_allow_list() -> None:
    reg = build_default_registry(ToolsConfig(enabled=("http_get", "calculator"), load_entry_points=False))
    assert reg.names() == ["calculator"]


def test_error_kinds_round_trip() -> None:
    assert RetryableToolError("x").to_dict() == {"error": "x", "kind": "retryable"}
    assert PermanentToolError("x", details={"a": 1}).to_dict() == {
        "error": "x",
        "kind": "permanent",
        "details": {"a": 1},
    }
