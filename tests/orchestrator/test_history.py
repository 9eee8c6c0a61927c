"""Steps have no rows of their own (migration 0011): what the readers derive from the history rows
and the task row must be what the step rows said (checked against the code before 0011 with the
same scenarios: open tool calls of a model turn, a recovery mid-turn, abandoned steps, a parked
retry)."""

from __future__ import annotations

import pytest

from orchestrator.runner.fence import attempt_refusal
from orchestrator.store import get_task, list_attempts, list_steps, request_cancel
from tests.orchestrator.conftest import submit


class _Crash(Exception):
    pass


def _statuses(steps) -> list[tuple]:
    return [(s.step_index, s.kind, s.status, s.tool_call_id, s.attempt_count) for s in steps]


def test_a_runner_resumes_a_model_turns_open_tool_calls(db, make_runner):
    """A runner dies before the turn's second of three tool calls runs: the open steps are the
    second RUNNING (started by the first's transaction) and the third PENDING, with their calls;
    another runner resumes from them."""
    tid = submit(db, {"cycles": 1, "parallel": 3})
    first = make_runner(lease_s=0.3)
    ran: list[int] = []
    real = first._execute_tool

    def execute_tool(task, step, *, in_doubt):
        if ran:
            raise _Crash  # the runner dies with step 2 started
        ran.append(step.index)
        real(task, step, in_doubt=in_doubt)

    first._execute_tool = execute_tool
    with pytest.raises(_Crash):
        first.run_once()
    with db.connect() as conn:
        steps = list_steps(conn, tid)
        turn_end = steps[0].finished_at
        assert _statuses(steps) == [
            (0, "model", "SUCCEEDED", None, 1),
            (1, "tool", "SUCCEEDED", "call_0", 1),
            (2, "tool", "RUNNING", "call_1", 1),
            (3, "tool", "PENDING", "call_2", 0),
        ]
        assert [s.created_at for s in steps[1:]] == [turn_end] * 3
        assert steps[2].started_at == steps[1].finished_at and steps[2].arguments == '{"i": 1}'
        job = {"task_id": tid, "step_index": 2, "attempt": 1}
        assert attempt_refusal(conn, job) is None
        assert "PENDING at attempt 0" in attempt_refusal(conn, {**job, "step_index": 3}).reason
        assert "SUCCEEDED" in attempt_refusal(conn, {**job, "step_index": 1}).reason
        assert "no such step" in attempt_refusal(conn, {**job, "step_index": 4}).reason
    view = first._load(tid)
    assert {i: (s.status, s.tool_call_id, s.attempt_count) for i, s in view.steps.items()} == {
        2: ("RUNNING", "call_1", 1),
        3: ("PENDING", "call_2", 0),
    }
    assert view.next_step_index == 4 and len(view.transcript) == 3  # goal, turn, first result
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        assert get_task(conn, tid).status == "SUCCEEDED"
        steps = list_steps(conn, tid)
        assert [s.status for s in steps] == ["SUCCEEDED"] * 5
        assert steps[2].runner_id != steps[1].runner_id and steps[2].resumed == 1  # taken over
        assert [(a.step_index, a.attempt) for a in list_attempts(conn, tid)] == [(i, 1) for i in range(5)]


def test_steps_open_when_the_task_ends_are_abandoned(db, make_runner):
    """The step budget ends the task after the first of three tool calls: the other two fail as
    abandoned at the task's end, at attempt 0, without attempt rows."""
    tid = submit(db, {"cycles": 1, "parallel": 3}, max_steps=2)
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, tid)
        steps = list_steps(conn, tid)
        attempts = list_attempts(conn, tid)
        refusal = attempt_refusal(conn, {"task_id": tid, "step_index": 3, "attempt": 0})
    assert task.status == "FAILED" and task.error["budget"] == "max_steps"
    assert _statuses(steps) == [
        (0, "model", "SUCCEEDED", None, 1),
        (1, "tool", "SUCCEEDED", "call_0", 1),
        (2, "tool", "FAILED", "call_1", 0),
        (3, "tool", "FAILED", "call_2", 0),
    ]
    assert [s.error for s in steps[2:]] == [
        {"kind": "abandoned", "message": "the task ended before this step finished"}
    ] * 2
    assert {s.finished_at for s in steps[1:]} == {task.finished_at}
    assert [(a.step_index, a.status) for a in attempts] == [(0, "SUCCEEDED"), (1, "SUCCEEDED")]
    assert "FAILED at attempt 0" in refusal.reason


def test_a_parked_retry_is_abandoned_when_the_task_is_cancelled(db, make_runner):
    """A tool attempt failed transiently and the task was parked until its retry (the step in
    RETRY_WAIT on the task row); a cancel then ends the task and abandons the step with it
    (it used to stay RETRY_WAIT under a CANCELLED task)."""
    tid = submit(db, {"cycles": 1, "tool": "flaky", "args": {"fail_times": 2}})
    make_runner(local_wait_max_s=0).run_once()
    with db.connect() as conn:
        assert get_task(conn, tid).status == "WAITING"
        parked = list_steps(conn, tid)[1]
    assert (parked.status, parked.attempt_count, parked.finished_at) == ("RETRY_WAIT", 1, None)
    assert parked.next_attempt_at is not None and parked.next_attempt_at > parked.started_at
    with db.begin() as conn:
        assert request_cancel(conn, tid) == "CANCELLED"
    with db.connect() as conn:
        after = list_steps(conn, tid)[1]
        assert (after.status, after.attempt_count) == ("FAILED", 1)
        assert [(a.step_index, a.attempt, a.status) for a in list_attempts(conn, tid)] == [
            (0, 1, "SUCCEEDED"),
            (1, 1, "FAILED"),
        ]
