"""Composition root: build the real components from `Settings` (the only place that chooses)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from orchestrator.config import Settings
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.dispatch import Dispatcher, make_dispatcher
from orchestrator.embedded_client import EmbeddedChatClient
from orchestrator.inference_client import InferenceClient, OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from tools.registry import ToolRegistry
from workers.tool_jobs import build_registry, set_process_registry


class SchemaNotCurrent(RuntimeError):
    """The database schema is behind the code: run `dayzero db upgrade`."""


def make_db(settings: Settings, *, upgrade: bool = False) -> Engine:
    engine = make_engine(settings.database_url)
    if upgrade:
        migrate.upgrade(engine)
    elif not migrate.is_up_to_date(engine):
        raise SchemaNotCurrent(
            f"database schema is at {migrate.current_revision(engine)!r}, code expects {migrate.head_revision()!r}: "
            "run `dayzero db upgrade`"
        )
    return engine


def make_inference(settings: Settings) -> InferenceClient:
    if settings.inference_url:
        return OpenAIChatClient(
            settings.inference_url,
            settings.inference_model,
            api_key=settings.inference_api_key,
            timeout_s=settings.inference_timeout_s,
            images_by_reference=settings.inference_images_by_reference,
        )
    return EmbeddedChatClient.default(settings.inference_model, blob_url=settings.blob_dir)


def make_tools(settings: Settings) -> ToolRegistry:
    registry = build_registry(settings.tools_config())
    set_process_registry(registry)
    return registry


@dataclass
class RunnerParts:
    engine: Engine
    inference: InferenceClient
    dispatcher: Dispatcher
    tools: ToolRegistry
    runner: Runner

    def close(self) -> None:
        self.runner.stop()
        self.dispatcher.close()
        self.inference.close()
        self.engine.dispose()


def make_runner(
    settings: Settings,
    *,
    inference: InferenceClient | None = None,
    upgrade: bool = False,
    runner_id: str | None = None,
    dispatcher: Dispatcher | None = None,
) -> RunnerParts:
    engine = make_db(settings, upgrade=upgrade)
    tools = make_tools(settings)
    dispatcher = dispatcher or make_dispatcher(
        settings.celery_broker_url, settings.celery_result_backend, tools
    )
    inference = inference or make_inference(settings)
    cfg = RunnerConfig(
        lease_s=settings.lease_s,
        poll_interval_s=settings.poll_interval_s,
        workspace_dir=settings.workspace_dir,
        workspace_retention_s=settings.workspace_retention_s,
        blob_url=settings.blob_dir,
        preprocess=settings.preprocess.config(),
        preprocess_tenants=settings.preprocess.tenants,
        **({"runner_id": runner_id} if runner_id else {}),
    )
    return RunnerParts(
        engine, inference, dispatcher, tools, Runner(engine, inference, dispatcher, tools, cfg)
    )
