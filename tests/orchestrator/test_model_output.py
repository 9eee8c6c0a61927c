"""A model turn whose output cannot be used (issue 38): tool calls the server could not parse,
tool-call markup left in the content, or an empty final answer. Each is a typed step failure
handled by the retry rule: retried with the problem shown to the model, then the task fails
`model_output_unparseable`; it never ends SUCCEEDED. A usable turn succeeds as before."""

from __future__ import annotations

import uuid

import pytest

from orchestrator.store import get_task, list_attempts, list_messages
from tests.orchestrator.conftest import submit


def _requests(model_server, tag: str) -> list[list[dict]]:
    """The messages of each request made for the task whose script carries `tag`."""
    return [r["messages"] for r in model_server.requests if tag in str(r["messages"][0:2])]


@pytest.mark.parametrize("bad", ["markup", "errors", "empty"])
def test_an_unusable_turn_is_retried_with_the_problem_shown_then_fails_typed(
    db, make_runner, model_server, bad
):
    # Before: the markup was the task's SUCCEEDED result; an empty answer succeeded with "".
    tag = f"unusable-{uuid.uuid4().hex}"
    task_id = submit(db, {"cycles": 1, "bad_output": bad, "tag": tag})
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 0]
        transcript = list_messages(conn, task_id)
    assert task.status == "FAILED" and task.error["kind"] == "model_output_unparseable", task.error
    assert [a.status for a in attempts] == ["FAILED"] * 3
    assert all(a.error["kind"] == "model_output_unparseable" for a in attempts)
    assert not any(m["role"] == "assistant" for m in transcript)  # nothing unusable was kept
    mine = _requests(model_server, tag)
    assert len(mine) == 3
    assert "could not be used" not in str(mine[0][-1])
    assert all("could not be used" in m[-1]["content"] for m in mine[1:])


def test_a_turn_that_is_usable_on_the_retry_succeeds(db, make_runner, model_server):
    task_id = submit(db, {"cycles": 1, "tool": "echo", "bad_output": "markup", "fix_on_feedback": True})
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert (task.status, task.result) == ("SUCCEEDED", "done after 1 tool calls")


def test_tools_are_offered_as_strict(db, make_runner, model_server):
    tag = f"strict-{uuid.uuid4().hex}"
    task_id = submit(db, {"cycles": 0, "tag": tag})
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
    body = next(r for r in model_server.requests if tag in str(r["messages"][0:2]))
    assert body["tools"] and all(t["function"]["strict"] is True for t in body["tools"])
