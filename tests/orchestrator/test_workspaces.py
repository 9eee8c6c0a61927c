"""A task's workspace lives as long as the task (issue 39): deleted when the task ends."""

from __future__ import annotations

from orchestrator.store import get_task
from tests.orchestrator.conftest import submit


def test_a_finished_tasks_workspace_is_deleted(db, make_runner, tmp_path):
    # Before: workspaces were never deleted.
    task_id = submit(
        db, {"cycles": 1, "tool": "workspace_write", "args": {"path": "notes.txt", "content": "kept?"}}
    )
    runner = make_runner()
    seen: list[bool] = []
    original = runner._execute_tool

    def watch(task, step, *, in_doubt):  # records whether the file was written, while running
        original(task, step, in_doubt=in_doubt)
        seen.append((tmp_path / "ws" / task_id / "notes.txt").exists())

    runner._execute_tool = watch
    runner.run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
    assert seen == [True]  # the tool wrote into the workspace
    assert not (tmp_path / "ws" / task_id).exists()
