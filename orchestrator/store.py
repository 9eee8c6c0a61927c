"""The task store's import surface for scripts and tests: names only, no logic (the code lives
in `orchestrator.tasks` and `orchestrator.db.tables`)."""

from orchestrator.db.tables import attachments_t, attempts_t, events_t, messages_t, tasks_t
from orchestrator.tasks.control import delete_task, request_cancel
from orchestrator.tasks.create import NewTask, create_task, create_tasks
from orchestrator.tasks.errors import IdempotencyConflict, StaleTransition, TaskNotFound
from orchestrator.tasks.queries import (
    get_task,
    list_attempts,
    list_events,
    list_messages,
    list_steps,
    message_dict,
)
from orchestrator.tasks.writer import transition_task

__all__ = [
    "IdempotencyConflict",
    "NewTask",
    "StaleTransition",
    "TaskNotFound",
    "attachments_t",
    "attempts_t",
    "create_task",
    "create_tasks",
    "delete_task",
    "events_t",
    "get_task",
    "list_attempts",
    "list_events",
    "list_messages",
    "list_steps",
    "message_dict",
    "messages_t",
    "request_cancel",
    "tasks_t",
    "transition_task",
]
