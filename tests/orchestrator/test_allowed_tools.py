"""`allowed_tools` is enforced at execution, not only in what the model is offered (issue 15)."""

from __future__ import annotations

import json

from orchestrator.store import get_task, list_attempts, list_messages
from tests.orchestrator.conftest import submit


def test_a_tool_the_task_did_not_allow_is_refused_and_the_model_reads_why(db, make_runner, state_dir):
    # Before: the runner executed whatever tool the model named (the ledger would hold 2 lines).
    tid = submit(db, {"cycles": 2, "tool": "ledger"}, allowed_tools=["echo"])
    make_runner().run_until_idle(timeout_s=30)
    assert not (state_dir / "ledger.log").exists()  # never executed
    with db.connect() as conn:
        task = get_task(conn, tid)
        attempts = [a for a in list_attempts(conn, tid) if a.error]
        tool_msgs = [json.loads(m["content"]) for m in list_messages(conn, tid) if m["role"] == "tool"]
    assert task.status == "SUCCEEDED"  # the model got the refusals as tool results and answered
    assert len(attempts) == 2 and {a.error["code"] for a in attempts} == {"tool_not_allowed"}
    assert [m["code"] for m in tool_msgs] == ["tool_not_allowed", "tool_not_allowed"]
    assert "not allowed" in tool_msgs[0]["error"] and "echo" in tool_msgs[0]["error"]


def test_allowed_tools_still_run(db, make_runner, state_dir):
    tid = submit(db, {"cycles": 2, "tool": "ledger"}, allowed_tools=["ledger"])
    make_runner().run_until_idle(timeout_s=30)
    assert len((state_dir / "ledger.log").read_text().splitlines()) == 2
    with db.connect() as conn:
        assert get_task(conn, tid).status == "SUCCEEDED"
