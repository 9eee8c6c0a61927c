"""Kafka topics and client knobs (the bootstrap servers come from `Settings.kafka_bootstrap_servers`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class KafkaSettings(BaseSettings):
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
