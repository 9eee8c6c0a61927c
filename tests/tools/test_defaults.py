"""The default registry: built-ins from `ToolsConfig`, entry-point tools, configured modules."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from tools.base import ToolContext
from tools.builtin import build_default_registry, register_builtin_tools
from tools.config import HttpConfig, SandboxLimits, ToolsConfig
from tools.registry import ToolRegistry


def test_entry_point_tools_are_registered(monkeypatch: pytest.MonkeyPatch, ctx: ToolContext) -> None:
    ep = EntryPoint(name="shout", value="tests.tools._plugin:make_tools", group="dayzero.tools")
    monkeypatch.setattr("tools.registry.entry_points", lambda group: [ep] if group == "dayzero.tools" else [])
    reg = build_default_registry(ToolsConfig(enabled=("calculator",)))
    assert reg.names() == ["calculator", "shout"]
    assert reg.execute("shout", '{"text": "hi"}', ctx).content == "HI"


def test_configured_modules_are_registered(ctx: ToolContext) -> None:
    reg = build_default_registry(
        ToolsConfig(enabled=(), load_entry_points=False, modules=("tests.tools._plugin",))
    )
    assert reg.names() == ["shout"]


def test_register_builtin_tools_into_an_existing_registry() -> None:
    reg = ToolRegistry()
    register_builtin_tools(reg, ToolsConfig(enabled=("calculator", "workspace_read")))
    assert reg.names() == ["calculator", "workspace_read"]


def test_config_is_frozen_and_validated() -> None:
    cfg = ToolsConfig()
    with pytest.raises(AttributeError):
        cfg.enabled = ()  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown built-in tools"):
        ToolsConfig(enabled=("calculator", "shell"))
    with pytest.raises(ValueError, match="must be positive"):
        SandboxLimits(timeout_s=0)


def test_allow_list_turns_http_get_on() -> None:
    cfg = ToolsConfig(enabled=("http_get",), http=HttpConfig(allow_hosts=("docs.python.org",)))
    assert build_default_registry(cfg).names() == ["http_get"]
