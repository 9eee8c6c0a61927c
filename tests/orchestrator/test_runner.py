"""The runner against a real model HTTP server and real tools, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from orchestrator.store import get_task, list_attempts, list_events, list_messages, list_steps, request_cancel
from orchestrator.tasks.errors import TaskFinished
from tests.orchestrator.conftest import submit


def test_twenty_step_task_completes_with_full_history(db, make_runner):
    task_id = submit(db, {"cycles": 10, "tool": "echo"})
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        steps = list_steps(conn, task_id)
        attempts = list_attempts(conn, task_id)
        events = list_events(conn, task_id)
        messages = list_messages(conn, task_id)
    assert task.status == "SUCCEEDED"
    assert task.result == "done after 10 tool calls"
    assert len(steps) == 21 and task.step_count == 21
    assert [s.kind for s in steps] == ["model", "tool"] * 10 + ["model"]
    assert all(s.status == "SUCCEEDED" and s.attempt_count == 1 for s in steps)
    assert [(a.step_index, a.attempt, a.status) for a in attempts] == [(i, 1, "SUCCEEDED") for i in range(21)]
    assert all(a.usage is not None for a in attempts if steps[a.step_index].kind == "model")
    # user goal, then assistant/tool pairs, then the final answer
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "tool"] * 10 + ["assistant"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = [e.type for e in events]
    assert types[:2] == ["task.created", "task.ready"] and types[-1] == "task.succeeded"
    # a step that ends and the next that starts in the same transaction share one event
    assert types.count("step.started") == 1 and types.count("step.succeeded") == 21
    started = [e.payload.get("next") for e in events if e.type == "step.succeeded"][:-1]
    assert [(s["step"], s["attempt"]) for s in started] == [(i, 1) for i in range(1, 21)]
    assert task.prompt_tokens > 0 and task.completion_tokens == 12 * 11


def test_transient_failures_are_retried_with_growing_backoff(db, make_runner, state_dir):
    task_id = submit(db, {"cycles": 1, "tool": "flaky", "args": {"fail_times": 2}})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
        retries = [e.payload for e in list_events(conn, task_id) if e.type == "step.retry_scheduled"]
    assert task.status == "SUCCEEDED"
    assert [a.status for a in attempts] == ["FAILED", "FAILED", "SUCCEEDED"]
    assert all(a.error["kind"] == "retryable" for a in attempts[:2])
    # full jitter: each delay is drawn below a cap that doubles (0.2 s, then 0.4 s)
    assert [r["cap_s"] for r in retries] == [0.2, 0.4]
    assert all(0 <= r["delay_s"] <= r["cap_s"] for r in retries)
    times = [float(x) for x in (state_dir / f"flaky-{task_id}-1.log").read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= r["delay_s"] - 0.01 for g, r in zip(gaps, retries, strict=True))


def test_only_a_lone_model_start_skips_the_flush_wait(db, make_runner, monkeypatch):
    """Every transaction waits for its WAL flush except one that only starts a model attempt
    (here the task's start): results, and the start of a tool attempt (first or retried), are on
    disk before anything acts on them."""
    from orchestrator.runner.txn import StepTxn

    commits: list[tuple[bool, str | None, str | None, int]] = []
    commit = StepTxn.commit

    def spy(self, conn, *, wait_for_flush=True):
        commit(self, conn, wait_for_flush=wait_for_flush)
        step = self.task.open_step()
        commits.append((wait_for_flush, step and step.kind, step and step.status, len(self.task.transcript)))

    monkeypatch.setattr(StepTxn, "commit", spy)
    task_id = submit(db, {"cycles": 2, "tool": "flaky", "args": {"fail_times": 1}})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
    no_flush = [c for c in commits if not c[0]]
    assert no_flush == [(False, "model", "RUNNING", 1)]  # the start: only the goal in the transcript
    assert commits[0] == no_flush[0]
    # the retried tool attempt's start (after its RETRY_WAIT) waited for its flush
    assert any(wait and kind == "tool" and status == "RUNNING" for wait, kind, status, _ in commits[1:])
    assert len(commits) > 6


def test_permanent_error_is_not_retried_and_the_model_sees_it(db, make_runner, state_dir):
    task_id = submit(db, {"cycles": 1, "tool": "broken"})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = list_attempts(conn, task_id)
        tool_msg = next(m for m in list_messages(conn, task_id) if m["role"] == "tool")
    assert task.status == "SUCCEEDED"
    assert (state_dir / f"broken-{task_id}.log").read_text() == "x\n"
    assert [(a.step_index, a.status) for a in attempts] == [(0, "SUCCEEDED"), (1, "FAILED"), (2, "SUCCEEDED")]
    assert json.loads(tool_msg["content"]) == {"error": "this tool is broken", "kind": "permanent"}


def test_hanging_tool_hits_its_timeout(db, make_runner):
    task_id = submit(db, {"cycles": 1, "tool": "hang"})
    t0 = time.monotonic()
    make_runner().run_until_idle(timeout_s=30)
    elapsed = time.monotonic() - t0
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
        tool_msg = next(m for m in list_messages(conn, task_id) if m["role"] == "tool")
    assert task.status == "SUCCEEDED"
    assert [a.error["kind"] for a in attempts] == ["timeout", "timeout"]  # policy: 2 attempts, 0.5 s each
    assert json.loads(tool_msg["content"])["kind"] == "timeout"
    assert elapsed < 4.0


def test_an_inline_tool_runs_on_the_runner_thread_and_others_still_time_out(db, make_runner, monkeypatch):
    """A tool declared `inline` skips the hand-off to a pool thread; a tool that is not, in the
    same task, still runs on a pool thread and is abandoned at its timeout."""
    from orchestrator.runner.loop import Runner

    task_id = submit(db, {"cycles": 2, "tool": "echo_inline"})
    hung = submit(db, {"cycles": 1, "tool": "hang"})
    runner_threads: set[str] = set()
    execute = Runner._execute_tool

    def spy(self, task, step, *, in_doubt):
        runner_threads.add(threading.current_thread().name)
        execute(self, task, step, in_doubt=in_doubt)

    monkeypatch.setattr(Runner, "_execute_tool", spy)
    t0 = time.monotonic()
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        results = [json.loads(m["content"]) for m in list_messages(conn, task_id) if m["role"] == "tool"]
        hung_attempts = [a for a in list_attempts(conn, hung) if a.step_index == 1]
        assert get_task(conn, task_id).status == get_task(conn, hung).status == "SUCCEEDED"
    assert [r["echo"] for r in results] == [{"i": 0}, {"i": 1}]
    assert {r["thread"] for r in results} == runner_threads  # the thread that drives the task
    assert [a.error["kind"] for a in hung_attempts] == ["timeout", "timeout"]
    assert time.monotonic() - t0 < 6.0


def test_unknown_tool_and_malformed_arguments_become_tool_errors(db, make_runner):
    unknown = submit(db, {"cycles": 1, "tool": "no_such_tool"})
    malformed = submit(db, {"cycles": 1, "tool": "echo", "raw_args": '{"i": 1,,'})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        for task_id, needle in ((unknown, "unknown tool 'no_such_tool'"), (malformed, "not valid JSON")):
            assert get_task(conn, task_id).status == "SUCCEEDED"
            err = json.loads(next(m for m in list_messages(conn, task_id) if m["role"] == "tool")["content"])
            assert err["kind"] == "invalid_arguments" and needle in err["error"]


def test_cancel_stops_a_running_task_at_the_next_step_boundary(db, make_runner):
    task_id = submit(db, {"cycles": 500, "tool": "slow_echo"})
    runner = make_runner()
    worker = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 60})
    worker.start()
    try:
        while True:
            with db.connect() as conn:
                if get_task(conn, task_id).step_count >= 4:
                    break
            time.sleep(0.02)
        with db.begin() as conn:
            request_cancel(conn, task_id)
    finally:
        worker.join(timeout=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        steps = list_steps(conn, task_id)
    assert task.status == "CANCELLED"
    assert task.step_count < 20
    assert all(s.status in ("SUCCEEDED", "FAILED") for s in steps)
    assert not any(s.status == "RUNNING" for s in steps)


def test_cancel_of_an_idle_task_is_immediate_and_too_late_once_it_ended(db):
    task_id = submit(db, {"cycles": 1})
    with db.begin() as conn:
        assert request_cancel(conn, task_id) == "CANCELLED"
    with db.begin() as conn, pytest.raises(TaskFinished, match="CANCELLED"):
        request_cancel(conn, task_id)


def test_max_steps_budget_fails_the_task(db, make_runner):
    task_id = submit(db, {"cycles": 10, "tool": "echo"}, max_steps=5)
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert task.status == "FAILED" and task.error["budget"] == "max_steps"
    assert task.step_count == 5


def test_deadline_times_the_task_out(db, make_runner):
    task_id = submit(db, {"cycles": 1000, "tool": "slow_echo"}, deadline_s=0.5)
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert task.status == "TIMED_OUT" and task.error["kind"] == "deadline"


def test_delete_removes_a_finished_task_and_all_it_owns(db, make_runner):
    from orchestrator.statemachine import IllegalTransition
    from orchestrator.store import TaskNotFound, delete_task

    task_id = submit(db, {"cycles": 2, "tool": "echo"})
    with db.begin() as conn, pytest.raises(IllegalTransition):
        delete_task(conn, task_id)  # still READY
    make_runner().run_until_idle(timeout_s=30)
    with db.begin() as conn:
        delete_task(conn, task_id)
    with db.connect() as conn:
        with pytest.raises(TaskNotFound):
            get_task(conn, task_id)
        assert not list_steps(conn, task_id) and not list_attempts(conn, task_id)
        assert not list_messages(conn, task_id) and not list_events(conn, task_id)
