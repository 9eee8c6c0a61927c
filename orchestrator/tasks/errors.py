"""Errors of the task store, each saying what the caller should do."""

from __future__ import annotations


class TaskNotFound(LookupError):
    """No such task for this tenant (ids of other tenants are indistinguishable from missing ones)."""


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request body: use a new key."""

    def __init__(self, task_id: str):
        super().__init__(f"idempotency key already used for task {task_id} with a different request")
        self.task_id = task_id


class StaleTransition(Exception):
    """The row was not in the expected state: another process changed it first (re-read it)."""


class TaskFinished(Exception):
    """The task has already ended (its status says how): too late to cancel it."""

    def __init__(self, task_id: str, status: str):
        super().__init__(f"task {task_id} already ended {status}")
        self.status = status
