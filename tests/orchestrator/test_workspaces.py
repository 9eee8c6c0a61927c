"""A task's workspace lives as long as the task (issue 39): deleted when the task ends."""

from __future__ import annotations

import datetime as dt

from orchestrator.runner import workspaces
from orchestrator.store import get_task
from tests.orchestrator.conftest import submit
from tools.workspaces import task_workspace


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
        seen.append((task_workspace(tmp_path / "ws", "t1", task_id) / "notes.txt").exists())

    runner._execute_tool = watch
    runner.run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
    assert seen == [True]  # the tool wrote into the workspace
    assert not task_workspace(tmp_path / "ws", "t1", task_id).exists()


def test_with_retention_a_workspace_is_kept_then_swept(db, make_runner, tmp_path):
    # Before: no retention rule; nothing deleted a workspace its runner did not.
    write = {"cycles": 1, "tool": "workspace_write", "args": {"path": "a.txt", "content": "x" * 100}}
    task_id = submit(db, write, tenant="acme")
    runner = make_runner(workspace_retention_s=3600)
    runner.run_until_idle(timeout_s=60)
    ws = task_workspace(tmp_path / "ws", "acme", task_id)
    assert (ws / "a.txt").read_text() == "x" * 100  # kept after the task ended
    with db.connect() as conn:
        ended = get_task(conn, task_id).finished_at
        assert ended is not None
        assert workspaces.sweep(conn, str(tmp_path / "ws"), 3600, now=ended + dt.timedelta(seconds=60)) == 0
        assert ws.exists()
        assert workspaces.sweep(conn, str(tmp_path / "ws"), 3600, now=ended + dt.timedelta(seconds=3601)) == 1
    assert not ws.exists()


def test_the_sweep_takes_workspaces_of_tasks_ended_elsewhere_and_of_no_task(db, make_runner, tmp_path):
    # A task cancelled before any runner held it, and a directory whose task row is gone.
    running = submit(db, {"cycles": 1, "tool": "echo"})
    cancelled = submit(db, {"cycles": 1, "tool": "echo"})
    with db.begin() as conn:
        from sqlalchemy import update

        from orchestrator.db.tables import tasks_t

        conn.execute(
            update(tasks_t)
            .where(tasks_t.c.id == cancelled)
            .values(status="CANCELLED", finished_at=dt.datetime.now(dt.UTC))
        )
    root = tmp_path / "ws"
    for tid in (running, cancelled, "no-such-task"):
        task_workspace(root, "t1", tid).mkdir(parents=True)
        (task_workspace(root, "t1", tid) / "f").write_text("data")
    with db.connect() as conn:
        assert workspaces.sweep(conn, str(root), 0) == 2
    assert task_workspace(root, "t1", running).exists()  # not ended: kept
    assert not task_workspace(root, "t1", cancelled).exists()
    assert not task_workspace(root, "t1", "no-such-task").exists()
