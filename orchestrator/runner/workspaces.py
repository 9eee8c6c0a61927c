"""Task workspaces' lifetime on the runner's side: deleted when the task ends, or `retention_s`
after (`RunnerConfig.workspace_retention_s`, `DAYZERO_WORKSPACE_RETENTION_S`).

A runner that ends a task deletes its workspace at once when there is no retention. `sweep`
(run by every runner every `workspace_sweep_s`) deletes the rest: workspaces of tasks that ended
more than `retention_s` ago, ended elsewhere (cancelled, or a runner stopped before it deleted
them), or whose task row is gone. The layout is `tools.workspaces`'.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

from sqlalchemy import Connection, select

from orchestrator.clock import utcnow
from orchestrator.db.tables import tasks_t
from orchestrator.statemachine import TERMINAL_TASK_STATUSES
from tools.workspaces import remove_task_workspace, task_workspace, task_workspaces

log = logging.getLogger(__name__)

TERMINAL = frozenset(s.value for s in TERMINAL_TASK_STATUSES)  # as the task rows store them
_BATCH = 500


def workspace_path(workspace_dir: str | None, tenant: str, task_id: str) -> Path | None:
    """The task's workspace (None: workspaces are off)."""
    return task_workspace(workspace_dir, tenant, task_id) if workspace_dir else None


def task_ended(workspace_dir: str | None, retention_s: float, tenant: str, task_id: str) -> None:
    """The runner ended the task: without retention its workspace goes now (else `sweep` does)."""
    if workspace_dir and retention_s <= 0:
        remove_task_workspace(workspace_dir, tenant, task_id)


def sweep(
    conn: Connection, workspace_dir: str | None, retention_s: float, now: dt.datetime | None = None
) -> int:
    """Delete the workspaces whose time is up; returns how many."""
    if not workspace_dir:
        return 0
    now = now or utcnow()
    found = list(task_workspaces(workspace_dir))
    removed = 0
    for i in range(0, len(found), _BATCH):
        chunk = dict(found[i : i + _BATCH])
        rows = {
            r.id: r
            for r in conn.execute(
                select(tasks_t.c.id, tasks_t.c.status, tasks_t.c.finished_at, tasks_t.c.updated_at).where(
                    tasks_t.c.id.in_(list(chunk))
                )
            )
        }
        for task_id, path in chunk.items():
            row = rows.get(task_id)
            if row is not None:
                if row.status not in TERMINAL:
                    continue
                ended = row.finished_at or row.updated_at
                if (now - ended).total_seconds() < retention_s:
                    continue
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    if removed:
        log.info("deleted %d task workspace(s)", removed)
    return removed
