"""What a step function may use of the runner that drives it, and the runner's configuration.

The step modules (`model_step`, `tool_step`, `preprocess_step`) take a `StepContext`, not the
`Runner`: they depend on this module, and only the loop depends on them. `Runner` is the one
implementation (checked structurally by the type checker)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from core.retry import RetryPolicy

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

    from orchestrator.dispatch import Dispatcher
    from orchestrator.inference_client import InferenceClient
    from orchestrator.probes import Health
    from orchestrator.runner.cancel import CancelSignal
    from orchestrator.runner.payloads import PayloadCache
    from orchestrator.runner.txn import StepTxn, TaskView
    from tools.registry import ToolRegistry


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    runner_id: str = field(default_factory=lambda: f"runner-{uuid.uuid4().hex[:12]}")
    lease_s: float = 30.0
    poll_interval_s: float = 0.2
    workspace_dir: str | None = None
    # a task's workspace is deleted this long after it ended (0: at once), by `workspaces.sweep`
    # every `workspace_sweep_s`
    workspace_retention_s: float = 0.0
    workspace_sweep_s: float = 60.0
    # Retry backoffs shorter than this are waited out while holding the lease.
    local_wait_max_s: float = 1.0
    # Where attachment bytes live (a BlobStore URL) and how images are preprocessed.
    blob_url: str = "./.dayzero/blobs"
    preprocess: dict[str, Any] | None = None  # PreprocessConfig fields (Settings.preprocess)
    preprocess_tenants: dict[str, dict[str, Any]] | None = None  # per-tenant overrides of those
    # Attachment preprocessing: attempts, backoff (the task is parked meanwhile) and timeout.
    preprocess_retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=3, backoff_base_s=2.0, backoff_max_s=60.0, timeout_s=120.0
        )
    )
    # tasks whose transcripts this runner keeps between claims (`runner.transcripts`; 0: none)
    transcript_cache_tasks: int = 256
    # tool results longer than this (bytes of text) go to the blob store, referenced from the
    # history row (`runner.payloads`); None: always inline
    payload_ref_bytes: int | None = 16384
    model_retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=3, backoff_base_s=0.5, backoff_max_s=10.0, timeout_s=300.0
        )
    )


class StepContext(Protocol):
    """The runner as a step sees it."""

    config: RunnerConfig
    engine: Engine  # the database, for reads outside the step's transaction
    inference: InferenceClient
    dispatcher: Dispatcher
    tools: ToolRegistry
    health: Health  # readiness while a dependency is waited out inside a step
    conn: Connection | None  # the connection driving the current task
    cancel_signal: CancelSignal | None  # of the step in flight

    @property
    def stopping(self) -> threading.Event: ...

    def txn(self, task: TaskView) -> StepTxn:
        """A transaction for the task's next write, fenced on its lease."""
        ...

    @property
    def payloads(self) -> PayloadCache:
        """Blob texts (big tool results, attachment texts), read once per process."""
        ...

    def offload_payload(self, text: str) -> Any:
        """A big tool result stored by reference (or the text itself)."""
        ...
