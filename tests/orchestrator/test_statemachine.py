"""The transition tables: every listed move is allowed, everything else raises."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.statemachine import (
    STEP_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL_TASK_STATUSES,
    IllegalTransition,
    StepEvent,
    StepStatus,
    TaskEvent,
    TaskStatus,
    next_step_status,
    next_task_status,
)
from orchestrator.store import StaleTransition, transition_task
from tests.orchestrator.conftest import submit


@pytest.mark.parametrize(("status", "event"), list(itertools.product(TaskStatus, TaskEvent)), ids=str)
def test_task_table_is_the_only_truth(status, event):
    if (status, event) in TASK_TRANSITIONS:
        assert next_task_status(status, event) == TASK_TRANSITIONS[(status, event)]
    else:
        with pytest.raises(IllegalTransition):
            next_task_status(status, event)


@pytest.mark.parametrize(("status", "event"), list(itertools.product(StepStatus, StepEvent)), ids=str)
def test_step_table_is_the_only_truth(status, event):
    if (status, event) in STEP_TRANSITIONS:
        assert next_step_status(status, event) == STEP_TRANSITIONS[(status, event)]
    else:
        with pytest.raises(IllegalTransition):
            next_step_status(status, event)


def test_terminal_task_states_have_no_way_out():
    assert not [k for k in TASK_TRANSITIONS if k[0] in TERMINAL_TASK_STATUSES]


def test_illegal_transition_in_the_database_raises_and_changes_nothing(db):
    task_id = submit(db, {"cycles": 0})
    with pytest.raises(IllegalTransition), db.begin() as conn:
        transition_task(conn, task_id, "READY", TaskEvent.SUCCEED)
    with pytest.raises(StaleTransition), db.begin() as conn:
        transition_task(conn, task_id, "RUNNING", TaskEvent.SUCCEED)  # the row is READY, not RUNNING
    with db.connect() as conn:
        from orchestrator.store import get_task, list_events

        assert get_task(conn, task_id).status == "READY"
        assert [e.type for e in list_events(conn, task_id)] == ["task.created", "task.ready"]


def test_a_task_transition_carries_its_event_and_row_values():
    import datetime as dt

    from orchestrator.statemachine import TaskTransition

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    start = TaskTransition("READY", TaskEvent.START, now)
    assert (start.new, start.event_type) == (TaskStatus.RUNNING, "task.running")
    assert start.event_payload == {"from": "READY", "to": "RUNNING"}
    assert start.row == {"status": "RUNNING"}  # not terminal: the lease stays
    done = TaskTransition("RUNNING", TaskEvent.FAIL, now, {"error": {"kind": "x"}})
    assert done.event_payload == {"from": "RUNNING", "to": "FAILED", "error": {"kind": "x"}}
    assert done.row == {"status": "FAILED", "finished_at": now, "lease_owner": None, "lease_until": None}
    with pytest.raises(IllegalTransition):
        TaskTransition("SUCCEEDED", TaskEvent.START, now)
