"""What a client may do to a task it owns besides reading it: cancel it, delete it."""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from orchestrator.clock import utcnow
from orchestrator.db.tables import attempts_t, events_t, messages_t, tasks_t
from orchestrator.statemachine import (
    TERMINAL_TASK_STATUSES,
    IllegalTransition,
    StepStatus,
    TaskEvent,
    TaskStatus,
)
from orchestrator.tasks.errors import TaskFinished, TaskNotFound
from orchestrator.tasks.queries import get_task
from orchestrator.tasks.writer import transition_task


def request_cancel(conn: Connection, task_id: str, tenant: str | None = None) -> str:
    """Ask for cancellation. A task no runner holds is cancelled now (its open steps abandoned);
    a running one by its runner, which also interrupts the step in flight (`runner.cancel`).
    Returns the status after the call; raises `TaskFinished` if the task had already ended."""
    q = select(tasks_t.c.status, tasks_t.c.lease_owner, tasks_t.c.lease_until, tasks_t.c.open_status).where(
        tasks_t.c.id == task_id
    )
    if tenant is not None:
        q = q.where(tasks_t.c.tenant == tenant)
    row = conn.execute(q.with_for_update()).first()
    if row is None:
        raise TaskNotFound(task_id)
    if TaskStatus(row.status) in TERMINAL_TASK_STATUSES:
        raise TaskFinished(task_id, row.status)
    held = row.lease_owner is not None and row.lease_until is not None and row.lease_until > utcnow()
    if held:
        conn.execute(update(tasks_t).where(tasks_t.c.id == task_id).values(cancel_requested=True))
        return row.status
    values: dict[str, object] = {"cancel_requested": True}
    if row.open_status in _OPEN_STEP_STATUSES:  # a parked retry, say: it is abandoned with the task
        values["open_status"] = StepStatus.FAILED.value
    try:
        return transition_task(conn, task_id, row.status, TaskEvent.CANCEL, values=values).value
    except IllegalTransition:
        return row.status


_OPEN_STEP_STATUSES = (StepStatus.PENDING.value, StepStatus.RUNNING.value, StepStatus.RETRY_WAIT.value)


def delete_task(conn: Connection, task_id: str, tenant: str | None = None) -> None:
    """Delete a finished task and everything it owns (the per-step tables carry no FKs)."""
    task = get_task(conn, task_id, tenant)
    if TaskStatus(task.status) not in TERMINAL_TASK_STATUSES:
        raise IllegalTransition("task", task.status, "delete")
    for table in (attempts_t, messages_t, events_t):
        conn.execute(table.delete().where(table.c.task_id == task_id))
    conn.execute(tasks_t.delete().where(tasks_t.c.id == task_id))
