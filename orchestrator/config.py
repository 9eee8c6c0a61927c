"""The one settings object of the service side: `Settings`, with its parts nested in it.

Read once at process start (`Settings()` reads the environment and `.env`), then passed down.
Nothing below the entry points reads the environment itself. The variable names are those the
Helm chart sets: top-level ones by alias, each part by its prefix (`DAYZERO_BUDGET_*`,
`DAYZERO_PREPROCESS_*`, `DAYZERO_INGRESS_*`, `DAYZERO_KAFKA_*`).
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


class IngressSettings(BaseSettings):
    """Limits and knobs of the ingress (REST and Kafka share the body limits)."""

    model_config = SettingsConfigDict(
        env_prefix="DAYZERO_INGRESS_", env_file=".env", extra="ignore", frozen=True
    )

    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="task body (REST) / message value (Kafka)"
    )
    max_json_depth: int = Field(
        32, ge=4, le=256, description="nesting of arrays/objects in a JSON body (checked before parsing)"
    )
    max_in_flight: int = Field(
        8,
        ge=0,
        description="requests per process being served at once (0 = no shedding); event streams and "
        "probes are not counted",
    )
    max_queue: int = Field(
        64, ge=0, description="requests waiting for a slot; past it, 429 + Retry-After at once"
    )
    max_queue_wait_s: float = Field(
        0.25,
        ge=0,
        description="longest wait for a slot, estimated or actual; past it, 429 + Retry-After. It bounds "
        "the latency the queue adds to accepted requests",
    )
    db_retry_after_s: int = Field(
        2, ge=1, description="Retry-After of the 503 answered while the database is down"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="longest wait for the next piece of a request body; past it, 408"
    )
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="one POST /v1/attachments upload")
    sse_poll_s: float = Field(
        0.5, gt=0, description="SSE re-check interval without (or besides) the outbox tail"
    )
    sse_listen: bool = Field(
        True,
        description="wake SSE streams from a tail of the outbox (every sse_tail_s; else poll every sse_poll_s)",
    )
    sse_tail_s: float = Field(0.05, gt=0, le=5, description="how often the outbox tail looks for new events")
    sse_keepalive_s: float = Field(15.0, gt=0)
    list_limit_max: int = Field(200, ge=1)
    trace_url_template: str | None = Field(
        None,
        description="link-out of the /ui timeline to a trace viewer; `{trace_id}` is replaced, e.g. "
        "http://localhost:16686/trace/{trace_id} (Jaeger) or a Grafana Explore URL for Tempo",
    )
    gc_freeze: bool = Field(
        True,
        description="after start-up, move every live object out of the cyclic GC's reach (gc.freeze) so "
        "full collections scan only request garbage: they otherwise cost 50-150 ms on this heap",
    )


class KafkaSettings(BaseSettings):
    """Kafka topics and client knobs (the bootstrap servers are `Settings.kafka_bootstrap_servers`)."""

    model_config = SettingsConfigDict(
        env_prefix="DAYZERO_KAFKA_", env_file=".env", extra="ignore", frozen=True, populate_by_name=True
    )

    tasks_topic: str = "dayzero.tasks"
    dlq_topic: str = "dayzero.tasks.dlq"
    events_topic: str = "dayzero.events"
    results_topic: str = "dayzero.results"
    group_id: str = "dayzero-ingest"
    partitions: int = Field(6, ge=1, description="partitions for topics this service creates")
    batch_max: int = Field(1000, ge=1, description="records per poll = per DB transaction")
    poll_timeout_ms: int = Field(200, ge=1)
    max_pending: int = Field(50_000, ge=1, description="pause ingest while this many tasks are PENDING/READY")
    resume_fraction: float = Field(0.8, gt=0, le=1, description="resume below max_pending * this")
    session_timeout_ms: int = Field(10_000, ge=1000)
    heartbeat_interval_ms: int = Field(3_000, ge=100)
    max_poll_interval_ms: int = Field(300_000, ge=1000)
    # The tenant model: a record names its tenant, and this deployment may create tasks only for
    # the tenants listed here (each must also hold an API key). Whoever can write to the topic
    # can act as any listed tenant, so list the tenants whose producers share this topic; give
    # tenants that must not impersonate each other their own topics and ingest deployments.
    # "*" allows every tenant holding an API key (one trusted producer); empty allows none.
    tenants_csv: str = Field(
        "",
        alias="DAYZERO_KAFKA_TENANTS",
        description="comma-separated tenants this ingest may create tasks for; '*' = any with an API key",
    )

    @property
    def allowed_tenants(self) -> frozenset[str] | None:
        """The allow-list; None means any tenant holding an API key ("*")."""
        names = {t.strip() for t in self.tenants_csv.split(",") if t.strip()}
        return None if "*" in names else frozenset(names)


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
    # A task's workspace is deleted this long after the task ended (0: at once).
    workspace_retention_s: float = Field(0.0, ge=0, alias="DAYZERO_WORKSPACE_RETENTION_S")
    # All of a tenant's workspaces together (the workers read the same variable); None: the default.
    workspace_tenant_max_bytes: int | None = Field(None, gt=0, alias="DAYZERO_WORKSPACE_TENANT_MAX_BYTES")

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
    # The parts, each read from its own DAYZERO_<PART>_* variables.
    budgets: Budgets = Field(default_factory=Budgets)
    preprocess: PreprocessSettings = Field(default_factory=PreprocessSettings)
    ingress: IngressSettings = Field(default_factory=IngressSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)

    # Tracing: OTLP endpoint, or none (spans still carry context across processes). The other
    # OTEL_* variables (service name, batching, traces endpoint) are read by the SDK itself.
    otlp_endpoint: str | None = Field(None, alias="OTEL_EXPORTER_OTLP_ENDPOINT")

    def tools_config(self) -> Any:
        """The `tools.ToolsConfig` these settings describe (tools never read the environment)."""
        from tools.config import tools_config_from_csv

        return tools_config_from_csv(
            self.tools_enabled_csv,
            self.http_allow_hosts_csv,
            self.tool_modules_csv,
            self.workspace_tenant_max_bytes,
        )

    def known_tools(self) -> frozenset[str]:
        """The tool names this deployment's registries hold; `allowed_tools` must name only these."""
        from tools.builtin import tool_names

        return tool_names(self.tools_config())

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
