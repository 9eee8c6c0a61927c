"""Built-in tools and the default registry built from a `ToolsConfig`."""

from __future__ import annotations

import functools
import logging

from tools.base import Tool
from tools.builtin.calculator import CalculatorTool
from tools.builtin.http_get import HttpGetTool
from tools.builtin.images import ImageCropZoomTool, ImageInfoTool
from tools.builtin.python_exec import PythonTool
from tools.builtin.search import SearchDocumentsTool
from tools.builtin.workspace import WorkspaceReadTool, WorkspaceWriteTool
from tools.config import ToolsConfig
from tools.registry import ToolRegistry, load_entry_point_tools, load_tool_modules
from tools.sandbox import Sandbox, SandboxUnavailableError

log = logging.getLogger(__name__)


def builtin_tools(config: ToolsConfig | None = None, *, probe: bool = True) -> list[Tool]:
    """The enabled built-ins. `http_get` is left out while its allow-list is empty; `python` raises
    `SandboxUnavailableError` when the host cannot isolate it (unless `skip_unavailable`);
    `probe=False` takes it as configured without running the sandbox (`tool_names`)."""
    cfg = config or ToolsConfig()
    on = set(cfg.enabled)
    tools: list[Tool] = []
    if "calculator" in on:
        tools.append(CalculatorTool())
    if "python" in on:
        sandbox = Sandbox(cfg.sandbox)
        try:
            if probe:
                sandbox.probe()
            tools.append(PythonTool(sandbox=sandbox))
        except SandboxUnavailableError as exc:
            if not cfg.skip_unavailable:
                raise SandboxUnavailableError(
                    f"the python tool cannot be enabled: {exc}. Run as root or where unprivileged user "
                    "namespaces are allowed, or remove 'python' from ToolsConfig.enabled."
                ) from exc
            log.warning("python tool disabled: %s", exc)
    if "search_documents" in on:
        tools.append(SearchDocumentsTool(cfg.search))
    if "image_info" in on:
        tools.append(ImageInfoTool(cfg.images))
    if "image_crop_zoom" in on:
        tools.append(ImageCropZoomTool(cfg.images))
    if "http_get" in on and cfg.http.allow_hosts:
        tools.append(HttpGetTool(cfg.http))
    if "workspace_read" in on:
        tools.append(WorkspaceReadTool(cfg.workspace))
    if "workspace_write" in on:
        tools.append(WorkspaceWriteTool(cfg.workspace))
    return tools


def register_builtin_tools(registry: ToolRegistry, config: ToolsConfig | None = None) -> None:
    for tool in builtin_tools(config):
        registry.register(tool)


def build_default_registry(config: ToolsConfig | None = None, *, probe: bool = True) -> ToolRegistry:
    """Built-ins per `config`, then entry-point tools (`dayzero.tools`) and `config.modules`."""
    cfg = config or ToolsConfig()
    registry = ToolRegistry(builtin_tools(cfg, probe=probe))
    if cfg.load_entry_points:
        load_entry_point_tools(registry)
    load_tool_modules(registry, cfg.modules)
    return registry


@functools.lru_cache(maxsize=8)
def tool_names(config: ToolsConfig) -> frozenset[str]:
    """The tools a deployment configured with `config` knows: what its runners' and workers'
    registries hold (`build_default_registry`), the python tool counted as configured (the host
    asking, e.g. the API's, need not be able to run the sandbox). Task submission checks
    `allowed_tools` against this set."""
    return frozenset(build_default_registry(config, probe=False).names())


__all__ = [
    "CalculatorTool",
    "HttpGetTool",
    "ImageCropZoomTool",
    "ImageInfoTool",
    "PythonTool",
    "SearchDocumentsTool",
    "WorkspaceReadTool",
    "WorkspaceWriteTool",
    "build_default_registry",
    "builtin_tools",
    "register_builtin_tools",
    "tool_names",
]
