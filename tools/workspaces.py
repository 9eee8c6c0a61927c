"""Where task workspaces live and what they hold: `<root>/<tenant dir>/<task id>`.

The tenant's directory name is a digest of the tenant (any string a task may name is a safe,
fixed-length name), so all of a tenant's workspaces sit under one directory: `tenant_usage` adds
them up for the tenant's workspace quota (`WorkspaceConfig.max_tenant_bytes`, checked by
`workspace_write`). A workspace is deleted when its task ends, or `retention_s` after that
(`orchestrator.runner.workspaces` sweeps); it never outlives its task's row.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# Idempotency records of the workspace tools live here; the model cannot read or write below it.
RESERVED_DIR = ".dayzero"


def tenant_dir_name(tenant: str) -> str:
    return "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


def task_workspace(root: str | Path, tenant: str, task_id: str) -> Path:
    """The task's private directory for the workspace tools."""
    return Path(root) / tenant_dir_name(tenant) / task_id


def remove_task_workspace(root: str | Path, tenant: str, task_id: str) -> None:
    shutil.rmtree(task_workspace(root, tenant, task_id), ignore_errors=True)


def usage(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path`, counting without following links; idempotency records are
    left out (small, and not the model's files)."""
    total = files = 0
    for dirpath, dirs, names in os.walk(path, followlinks=False):
        if RESERVED_DIR in dirs:
            dirs.remove(RESERVED_DIR)
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
    return total, files


def tenant_usage(workspace: Path) -> int:
    """Bytes held by all workspaces of the tenant whose task owns `workspace`."""
    return usage(workspace.parent)[0]


def task_workspaces(root: str | Path) -> Iterator[tuple[str, Path]]:
    """(task id, path) of every workspace under `root`."""
    base = Path(root)
    if not base.is_dir():
        return
    for tenant in base.iterdir():
        if tenant.is_dir() and not tenant.is_symlink() and tenant.name.startswith("t-"):
            for task in tenant.iterdir():
                if task.is_dir() and not task.is_symlink():
                    yield task.name, task
