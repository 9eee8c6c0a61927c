"""Limits and knobs of the ingress (REST and Kafka share the body limits)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class IngressSettings(BaseSettings):
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
        128,
        ge=0,
        description="requests per process being served at once; past it, 503 + Retry-After at once "
        "(0 = unlimited). Event streams and probes are not counted",
    )
    db_retry_after_s: int = Field(
        2, ge=1, description="Retry-After of the 503 answered while the database is down"
    )
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="one POST /v1/attachments upload")
    sse_poll_s: float = Field(0.5, gt=0, description="SSE re-check interval without (or besides) NOTIFY")
    sse_listen: bool = Field(
        True, description="on PostgreSQL, wake SSE streams by LISTEN/NOTIFY (else poll every sse_poll_s)"
    )
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
