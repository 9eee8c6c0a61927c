"""The task and step state machines: explicit transition tables, nothing implicit.

Every change of a task's or step's status goes through `next_task_status` / `next_step_status`,
which raise `IllegalTransition` for any pair not in the table. The store applies a transition
with `UPDATE … WHERE status = :expected` and appends the outbox event in the same transaction.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any


class TaskStatus(enum.StrEnum):
    PENDING = "PENDING"
    PREPROCESSING = "PREPROCESSING"
    READY = "READY"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


class TaskEvent(enum.StrEnum):
    PREPROCESS = "preprocess"  # attachments must be processed first
    PREPROCESSED = "preprocessed"
    ADMIT = "admit"  # nothing to preprocess
    START = "start"  # a runner took it
    WAIT = "wait"  # blocked on a retry backoff; released its lease
    RESUME = "resume"
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"
    TIME_OUT = "time_out"


class StepStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RETRY_WAIT = "RETRY_WAIT"


class StepEvent(enum.StrEnum):
    START = "start"
    RESUME = "resume"  # another runner takes over an attempt whose runner died (same idempotency key)
    SUCCEED = "succeed"
    FAIL = "fail"
    RETRY = "retry"
    ABANDON = "abandon"  # the task ended (cancelled, timed out) before this step ran


T = TaskStatus
S = StepStatus

TERMINAL_TASK_STATUSES = frozenset({T.SUCCEEDED, T.FAILED, T.CANCELLED, T.TIMED_OUT})
RUNNABLE_TASK_STATUSES = frozenset({T.READY, T.RUNNING, T.WAITING})
# What a runner claims: the runnable tasks and those whose attachments still need preprocessing
# (the partial index `ix_tasks_claimable` is over exactly these).
CLAIMABLE_TASK_STATUSES = frozenset({*RUNNABLE_TASK_STATUSES, T.PREPROCESSING})
TERMINAL_STEP_STATUSES = frozenset({S.SUCCEEDED, S.FAILED})

_ACTIVE = (T.PENDING, T.PREPROCESSING, T.READY, T.RUNNING, T.WAITING)

TASK_TRANSITIONS: dict[tuple[TaskStatus, TaskEvent], TaskStatus] = {
    (T.PENDING, TaskEvent.PREPROCESS): T.PREPROCESSING,
    (T.PENDING, TaskEvent.ADMIT): T.READY,
    (T.PREPROCESSING, TaskEvent.PREPROCESSED): T.READY,
    (T.PREPROCESSING, TaskEvent.FAIL): T.FAILED,
    (T.READY, TaskEvent.START): T.RUNNING,
    (T.WAITING, TaskEvent.RESUME): T.RUNNING,
    (T.RUNNING, TaskEvent.WAIT): T.WAITING,
    (T.RUNNING, TaskEvent.SUCCEED): T.SUCCEEDED,
    (T.RUNNING, TaskEvent.FAIL): T.FAILED,
    (T.WAITING, TaskEvent.FAIL): T.FAILED,
    **{(s, TaskEvent.CANCEL): T.CANCELLED for s in _ACTIVE},
    **{(s, TaskEvent.TIME_OUT): T.TIMED_OUT for s in _ACTIVE},
}

STEP_TRANSITIONS: dict[tuple[StepStatus, StepEvent], StepStatus] = {
    (S.PENDING, StepEvent.START): S.RUNNING,
    (S.RETRY_WAIT, StepEvent.START): S.RUNNING,
    (S.RUNNING, StepEvent.RESUME): S.RUNNING,
    (S.RUNNING, StepEvent.SUCCEED): S.SUCCEEDED,
    (S.RUNNING, StepEvent.FAIL): S.FAILED,
    (S.RUNNING, StepEvent.RETRY): S.RETRY_WAIT,
    (S.PENDING, StepEvent.ABANDON): S.FAILED,
    (S.RUNNING, StepEvent.ABANDON): S.FAILED,
    (S.RETRY_WAIT, StepEvent.ABANDON): S.FAILED,
}


class IllegalTransition(Exception):
    """A status change that the transition table does not allow. A bug, or a lost race."""

    def __init__(self, kind: str, status: str, event: str):
        super().__init__(f"illegal {kind} transition: {event!r} from {status!r}")
        self.kind, self.status, self.event = kind, status, event


def next_task_status(status: str, event: TaskEvent) -> TaskStatus:
    try:
        return TASK_TRANSITIONS[(TaskStatus(status), event)]
    except (KeyError, ValueError):
        raise IllegalTransition("task", status, event.value) from None


def next_step_status(status: str, event: StepEvent) -> StepStatus:
    try:
        return STEP_TRANSITIONS[(StepStatus(status), event)]
    except (KeyError, ValueError):
        raise IllegalTransition("step", status, event.value) from None


class TaskTransition:
    """What moving a task by one event writes, decided here once for every writer (a runner's
    step transaction, a transition of a task nobody holds, a task's creation): the new status,
    the outbox event `task.<new status>` with `from`/`to`, and the task-row columns — a
    terminal status also stamps `finished_at` and releases the lease."""

    __slots__ = ("event_payload", "event_type", "new", "old", "row")

    def __init__(self, old: str, event: TaskEvent, now: dt.datetime, payload: dict[str, Any] | None = None):
        self.old = old
        self.new = next_task_status(old, event)
        self.event_type = "task." + self.new.value.lower()
        self.event_payload = {"from": old, "to": self.new.value, **(payload or {})}
        self.row: dict[str, Any] = {"status": self.new.value}
        if self.new in TERMINAL_TASK_STATUSES:
            self.row.update(finished_at=now, lease_owner=None, lease_until=None)
