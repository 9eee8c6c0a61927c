"""Cancellation (issue 39, item 7): a cancel interrupts the step in flight (the model request is
closed, a tool job is revoked or abandoned and its late result ignored), a parked task's open
step is abandoned with it, the task ends CANCELLED with `task.cancelled`, and a cancel that
comes after the end is refused.

No timing assertion can fail on a busy machine here: the step in flight would take far longer
(a model answer or a tool that never comes by itself) than the cancel is given to land; the
cancel-to-CANCELLED latency is printed as a figure."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from orchestrator.store import get_task, list_events, list_messages, list_steps, request_cancel
from tests.orchestrator.conftest import submit, wait_until

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


def _status(db, task_id: str) -> str:
    with db.connect() as conn:
        return get_task(conn, task_id).status


def _cancel_and_time(db, task_id: str, limit_s: float) -> float:
    t0 = time.monotonic()
    with db.begin() as conn:
        request_cancel(conn, task_id)
    wait_until(lambda: _status(db, task_id) in TERMINAL, limit_s, "the task to end")
    return time.monotonic() - t0


def _run_in_background(runner) -> threading.Thread:
    t = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 120}, daemon=True)
    t.start()
    return t


def test_cancel_aborts_the_final_model_answer_in_flight(db, make_runner, model_server):
    # Before: the answer landed, the task ended SUCCEEDED, and no task.cancelled was written.
    tag = uuid.uuid4().hex
    task_id = submit(db, {"cycles": 0, "sleep_s": 30, "tag": tag})
    runner = make_runner()
    worker = _run_in_background(runner)
    wait_until(lambda: any(tag in str(r["messages"]) for r in model_server.requests), 60, "the model call")
    took = _cancel_and_time(db, task_id, 25)  # well before the 30 s answer
    worker.join(60)
    print(f"cancel -> CANCELLED with a model call in flight: {took:.2f} s")
    with db.connect() as conn:
        task = get_task(conn, task_id)
        events = [e.type for e in list_events(conn, task_id)]
        messages = list_messages(conn, task_id)
        steps = list_steps(conn, task_id)
    assert task.status == "CANCELLED" and "task.cancelled" in events
    assert not any(m["role"] == "assistant" for m in messages)
    assert all(s.status not in ("RUNNING", "PENDING", "RETRY_WAIT") for s in steps)


def test_cancel_stops_waiting_for_a_tool_and_ignores_its_late_result(db, make_runner, state_dir):
    # Before: the tool ran to its end and the task went on to its next step.
    task_id = submit(db, {"cycles": 1, "tool": "gate"})
    runner = make_runner()
    worker = _run_in_background(runner)
    wait_until(
        lambda: any(s.kind == "tool" and s.status == "RUNNING" for s in _steps(db, task_id)), 60, "the tool"
    )
    took = _cancel_and_time(db, task_id, 60)  # the gate never opens by itself
    print(f"cancel -> CANCELLED with a tool in flight: {took:.2f} s")
    (state_dir / "gate-open").touch()  # the tool finishes now: its result must change nothing
    worker.join(60)
    time.sleep(0.5)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        events = [e.type for e in list_events(conn, task_id)]
        messages = list_messages(conn, task_id)
    assert task.status == "CANCELLED" and "task.cancelled" in events
    assert not any(m["role"] == "tool" for m in messages)


def _steps(db, task_id: str) -> list:
    with db.connect() as conn:
        return list_steps(conn, task_id)


def test_cancel_of_a_parked_task_abandons_its_retry(db, make_runner, state_dir):
    # Before: the task ended CANCELLED with its step still RETRY_WAIT.
    task_id = submit(db, {"cycles": 1, "tool": "flaky", "args": {"fail_times": 50}})
    make_runner(local_wait_max_s=0.0).run_until_idle(
        timeout_s=60, until=lambda: _status(db, task_id) == "WAITING"
    )
    with db.begin() as conn:
        assert request_cancel(conn, task_id) == "CANCELLED"
    steps = _steps(db, task_id)
    assert [s.status for s in steps if s.kind == "tool"] == ["FAILED"], steps


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_rest_cancel_of_a_finished_task_is_409(db, make_runner):
    from fastapi.testclient import TestClient

    from orchestrator.api import create_app
    from orchestrator.config import Settings
    from tests.orchestrator.api.conftest import make_keys

    key = make_keys(db, "t1")["t1"]
    task_id = submit(db, {"cycles": 0})
    make_runner().run_until_idle(timeout_s=60)
    with TestClient(create_app(Settings(DATABASE_URL=str(db.url)), engine=db)) as client:
        r = client.post(f"/v1/tasks/{task_id}/cancel", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 409, r.text
    assert r.json()["type"].endswith("task-finished") and "SUCCEEDED" in r.json()["detail"]
