"""The one settings object of the service side.

Read once at process start (`Settings()` reads the environment and `.env`), then passed down.
Nothing below the entry points reads the environment itself.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Budgets(BaseSettings):
    """Default per-task budgets; a task may ask for less, never more."""

    model_config = SettingsConfigDict(env_prefix="DAYZERO_BUDGET_", frozen=True)

    max_steps: int = Field(64, ge=1, description="model turns + tool calls per task")
    max_tokens: int = Field(1_000_000, ge=1, description="prompt + completion tokens per task")
    deadline_s: float = Field(3600.0, gt=0, description="wall-clock seconds from submission")


class PreprocessSettings(BaseSettings):
    """How attachments are preprocessed on the workers: privacy redaction, per tenant.

    `DAYZERO_PREPROCESS_TENANTS` is a JSON object of per-tenant overrides of any
    `PreprocessConfig` field, e.g. `{"acme": {"redact_faces": true, "redact_documents": true}}`.
    """

    model_config = SettingsConfigDict(env_prefix="DAYZERO_PREPROCESS_", frozen=True)

    redact_faces: bool = Field(False, description="blur faces in every image before any model sees it")
    redact_documents: bool = Field(False, description="blur blocks of printed text (IDs, letters)")
    redaction_mode: Literal["blur", "black"] = "blur"
    tenants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    pdf_dpi: int = Field(100, ge=36, le=600, description="page images are rendered at this DPI")
    pdf_max_pages: int = Field(1000, ge=1)

    @field_validator("tenants")
    @classmethod
    def _known_fields(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from preprocess.config import PreprocessConfig  # light: no torch, no OpenCV

        for tenant, overrides in value.items():
            try:
                PreprocessConfig.from_dict(overrides)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"DAYZERO_PREPROCESS_TENANTS[{json.dumps(tenant)}]: {exc}") from None
        return value

    def config(self) -> dict[str, Any]:
        """The `PreprocessConfig` fields every tenant gets (tenant overrides apply on top)."""
        return {
            "redact_faces": self.redact_faces,
            "redact_documents": self.redact_documents,
            "redaction_mode": self.redaction_mode,
            "pdf_dpi": self.pdf_dpi,
            "pdf_max_pages": self.pdf_max_pages,
        }


class Settings(BaseSettings):
    """Service configuration. Every real component is chosen here, never by code changes."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", frozen=True)

    database_url: str = Field("sqlite:///./dayzero.db", alias="DATABASE_URL")
    kafka_bootstrap_servers: str | None = Field(None, alias="KAFKA_BOOTSTRAP_SERVERS")
    celery_broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")
    celery_result_backend: str | None = Field(None, alias="CELERY_RESULT_BACKEND")
    inference_url: str | None = Field(None, alias="DAYZERO_INFERENCE_URL")
    inference_model: str = Field("dayzero-small", alias="DAYZERO_INFERENCE_MODEL")
    inference_api_key: str | None = Field(None, alias="DAYZERO_INFERENCE_API_KEY")
    inference_timeout_s: float = Field(300.0, gt=0, alias="DAYZERO_INFERENCE_TIMEOUT_S")
    # Our own server sharing DAYZERO_BLOB_DIR takes the workers' processed images by reference;
    # any other server gets image bytes (the redacted ones when redaction is on).
    inference_images_by_reference: bool = Field(False, alias="DAYZERO_INFERENCE_IMAGES_BY_REFERENCE")
    blob_dir: str = Field("./.dayzero/blobs", alias="DAYZERO_BLOB_DIR")
    workspace_dir: str = Field("./.dayzero/workspaces", alias="DAYZERO_WORKSPACE_DIR")

    # Runner
    lease_s: float = Field(30.0, gt=0, alias="DAYZERO_LEASE_S")
    poll_interval_s: float = Field(0.2, gt=0, alias="DAYZERO_POLL_INTERVAL_S")
    tool_modules_csv: str = Field(
        "",
        alias="DAYZERO_TOOL_MODULES",
        description="comma-separated modules whose dayzero_tools() register tools",
    )
    tools_enabled_csv: str | None = Field(
        None, alias="DAYZERO_TOOLS", description="comma-separated built-in tools to enable (default: all)"
    )
    http_allow_hosts_csv: str = Field(
        "", alias="DAYZERO_HTTP_ALLOW_HOSTS", description="hosts http_get may fetch; empty disables the tool"
    )
    budgets: Budgets = Field(default_factory=Budgets)
    preprocess: PreprocessSettings = Field(default_factory=PreprocessSettings)

    # Tracing: OTLP endpoint, or none (spans still carry context across processes). The other
    # OTEL_* variables (service name, batching, traces endpoint) are read by the SDK itself.
    otlp_endpoint: str | None = Field(None, alias="OTEL_EXPORTER_OTLP_ENDPOINT")

    @property
    def tool_modules(self) -> tuple[str, ...]:
        return _csv(self.tool_modules_csv)

    def tools_config(self) -> Any:
        """The `tools.ToolsConfig` these settings describe (tools never read the environment)."""
        from tools.config import BUILTIN_TOOLS, HttpConfig, ToolsConfig

        enabled = _csv(self.tools_enabled_csv) if self.tools_enabled_csv is not None else BUILTIN_TOOLS
        return ToolsConfig(
            enabled=enabled,
            http=HttpConfig(allow_hosts=_csv(self.http_allow_hosts_csv)),
            skip_unavailable=True,
            modules=self.tool_modules,
        )

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())
