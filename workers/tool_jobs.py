"""The tool job: run one validated tool call and return a JSON-serialisable outcome.

Called directly by the in-process dispatcher and wrapped by the Celery task `dayzero.run_tool`.
Never raises for a tool failure: failures are outcomes (`ok: false`) the orchestrator judges.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.payloads import ToolJob
from tools.base import Attachment, ToolContext, ToolError
from tools.builtin import build_default_registry
from tools.config import ToolsConfig, tools_config_from_csv
from tools.registry import ToolRegistry
from workers.telemetry import job_span

_registry: ToolRegistry | None = None
_registry_lock = threading.Lock()


def set_process_registry(registry: ToolRegistry) -> None:
    """Install the registry this process uses (the embedded default passes its own)."""
    global _registry
    _registry = registry


def process_registry() -> ToolRegistry:
    """The worker process's registry, configured like the orchestrator's from the environment
    (`DAYZERO_TOOLS`, `DAYZERO_HTTP_ALLOW_HOSTS`, `DAYZERO_TOOL_MODULES`): read here, at the
    worker's entry, and passed down as a `ToolsConfig`."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = build_registry(config_from_env(os.environ))
        return _registry


def config_from_env(env: Mapping[str, str]) -> ToolsConfig:
    return tools_config_from_csv(
        env.get("DAYZERO_TOOLS"),
        env.get("DAYZERO_HTTP_ALLOW_HOSTS", ""),
        env.get("DAYZERO_TOOL_MODULES", ""),
        env.get("DAYZERO_WORKSPACE_TENANT_MAX_BYTES"),
    )


def build_registry(config: ToolsConfig | None = None) -> ToolRegistry:
    """Built-ins per `config`, plus entry-point tools and `config.modules`."""
    return build_default_registry(config or ToolsConfig(skip_unavailable=True))


def tool_context(job: ToolJob) -> ToolContext:
    return ToolContext(
        task_id=job.task_id,
        step_id=str(job.step_index),
        attempt=job.attempt,
        idempotency_key=job.idempotency_key,
        workspace=Path(job.workspace) if job.workspace else None,
        attachments=tuple(
            Attachment(
                id=a.id,
                media_type=a.media_type,
                path=Path(a.path) if a.path else None,
                text=a.text,
                content_hash=a.content_hash,
            )
            for a in job.attachments
        ),
        deadline_s=job.timeout_s,
    )


def run_tool(payload: ToolJob | Mapping[str, Any], registry: ToolRegistry | None = None) -> dict[str, Any]:
    """Execute the job's tool with its arguments; returns `{ok, content|error, duration_ms}`."""
    registry = registry or process_registry()
    t0 = time.perf_counter()
    try:
        job = payload if isinstance(payload, ToolJob) else ToolJob.from_dict(payload)
    except (KeyError, TypeError, ValueError) as exc:  # a malformed payload is this job's failure only
        error = {"error": f"malformed tool job payload: {type(exc).__name__}: {exc}", "kind": "permanent"}
        return {"ok": False, "error": error, "duration_ms": (time.perf_counter() - t0) * 1000}
    attrs = {
        "dayzero.tool": job.tool,
        "dayzero.attempt": job.attempt,
        "dayzero.idempotency_key": job.idempotency_key,
    }
    with job_span(job.traceparent, "tool", attrs) as span:
        try:
            ctx = tool_context(job)
            if ctx.workspace is not None:
                ctx.workspace.mkdir(parents=True, exist_ok=True)
            result = registry.execute(job.tool, job.arguments, ctx)
            out: dict[str, Any] = {"ok": True, "content": result.content}
            span.set_attribute("dayzero.tool.outcome", "ok")
        except ToolError as exc:
            out = {"ok": False, "error": exc.to_dict()}
            span.set_attribute("dayzero.tool.outcome", exc.kind.value)
            span.fail(type(exc).__name__, str(exc))
    return {**out, "duration_ms": (time.perf_counter() - t0) * 1000}
