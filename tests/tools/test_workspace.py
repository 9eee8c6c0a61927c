"""workspace_read / workspace_write: traversal and symlink escapes refused, size caps, idempotency."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tools.base import InvalidArgumentsError, PermanentToolError, ToolContext
from tools.builtin.workspace import PathRefusedError, WorkspaceReadTool, WorkspaceWriteTool
from tools.config import WorkspaceConfig
from tools.registry import ToolRegistry


@pytest.fixture
def reg() -> ToolRegistry:
    cfg = WorkspaceConfig(max_file_bytes=1000, max_total_bytes=3000, max_files=5)
    return ToolRegistry([WorkspaceReadTool(cfg), WorkspaceWriteTool(cfg)])


def write(reg: ToolRegistry, ctx: ToolContext, **args: object) -> dict:
    return reg.execute("workspace_write", args, ctx).content


def read(reg: ToolRegistry, ctx: ToolContext, **args: object) -> dict:
    return reg.execute("workspace_read", args, ctx).content


def test_round_trip_and_listing(reg: ToolRegistry, ctx: ToolContext) -> None:
    out = write(reg, ctx, path="notes/a.txt", content="héllo")
    assert out["path"] == "notes/a.txt" and out["size"] == len("héllo".encode())
    assert read(reg, ctx, path="notes/a.txt")["content"] == "héllo"
    assert read(reg, ctx, path="notes/a.txt", offset=1, max_bytes=2, encoding="base64")["eof"] is False
    assert [e["name"] for e in read(reg, ctx, path="")["entries"]] == ["notes"]  # .dayzero is hidden
    assert read(reg, ctx, path="notes")["entries"][0]["name"] == "a.txt"


@pytest.mark.parametrize(
    "path",
    [
        "../outside.txt",
        "a/../../outside.txt",
        "/etc/passwd",
        "\\etc\\passwd",
        "C:/Windows/win.ini",
        "a/../../../etc/shadow",
        ".dayzero/idempotency/x",
        "x\x00y",
    ],
)
def test_traversal_refused(reg: ToolRegistry, ctx: ToolContext, tmp_path: Path, path: str) -> None:
    with pytest.raises(InvalidArgumentsError) as ei:
        write(reg, ctx, path=path, content="pwned")
    assert ei.value.to_dict()["kind"] == "invalid_arguments"
    with pytest.raises(InvalidArgumentsError):
        read(reg, ctx, path=path)
    assert not (tmp_path / "outside.txt").exists()


def test_symlink_escapes_refused(reg: ToolRegistry, ctx: ToolContext, tmp_path: Path) -> None:
    assert ctx.workspace is not None
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    os.symlink(outside, ctx.workspace / "dirlink")
    os.symlink(outside / "secret.txt", ctx.workspace / "filelink")
    for path in ("dirlink/secret.txt", "filelink"):
        with pytest.raises(PathRefusedError):
            read(reg, ctx, path=path)
    with pytest.raises(PathRefusedError):
        write(reg, ctx, path="dirlink/new.txt", content="x")
    with pytest.raises(PathRefusedError):
        write(reg, ctx, path="filelink", content="x", mode="append")
    assert (outside / "secret.txt").read_text() == "SECRET"
    assert not (outside / "new.txt").exists()


def test_hard_link_and_special_files_refused(reg: ToolRegistry, ctx: ToolContext, tmp_path: Path) -> None:
    assert ctx.workspace is not None
    target = tmp_path / "hard.txt"
    target.write_text("SECRET")
    os.link(target, ctx.workspace / "hard")
    os.mkfifo(ctx.workspace / "fifo")
    for path in ("hard", "fifo"):
        with pytest.raises(PathRefusedError):
            read(reg, ctx, path=path)  # the FIFO must not block either
    with pytest.raises(PathRefusedError):
        write(reg, ctx, path="hard", content="overwritten")
    assert target.read_text() == "SECRET"


def test_size_caps(reg: ToolRegistry, ctx: ToolContext) -> None:
    with pytest.raises(PermanentToolError, match="limit is 1000"):
        write(reg, ctx, path="big", content="x" * 1001)
    for i in range(3):
        write(reg, dataclasses.replace(ctx, idempotency_key=f"k{i}"), path=f"f{i}", content="x" * 1000)
    with pytest.raises(PermanentToolError, match="would exceed 3000"):
        write(reg, dataclasses.replace(ctx, idempotency_key="k4"), path="f4", content="x")
    assert read(reg, ctx, path="f0", max_bytes=10)["content"] == "x" * 10


def test_modes(reg: ToolRegistry, ctx: ToolContext) -> None:
    write(reg, dataclasses.replace(ctx, idempotency_key="1"), path="log", content="a")
    write(reg, dataclasses.replace(ctx, idempotency_key="2"), path="log", content="b", mode="append")
    assert read(reg, ctx, path="log")["content"] == "ab"
    with pytest.raises(PermanentToolError, match="already exists"):
        write(reg, dataclasses.replace(ctx, idempotency_key="3"), path="log", content="c", mode="create")
    write(reg, dataclasses.replace(ctx, idempotency_key="4"), path="bin", content="AAEC", encoding="base64")
    assert read(reg, ctx, path="bin", encoding="base64")["content"] == "AAEC"


def test_append_replayed_for_the_same_idempotency_key(reg: ToolRegistry, ctx: ToolContext) -> None:
    first = reg.execute("workspace_write", {"path": "log", "content": "a", "mode": "append"}, ctx)
    again = reg.execute("workspace_write", {"path": "log", "content": "a", "mode": "append"}, ctx)
    assert again.metadata.get("replayed") is True and again.content == first.content
    assert read(reg, ctx, path="log")["content"] == "a"  # the side effect happened once


def test_no_workspace_is_a_clear_error(reg: ToolRegistry, ctx: ToolContext) -> None:
    with pytest.raises(PermanentToolError, match="no workspace"):
        read(reg, dataclasses.replace(ctx, workspace=None), path="a")


def test_a_tenants_workspaces_share_one_quota(tmp_path: Path) -> None:
    # Before: each workspace was bounded alone, so a tenant with many tasks had no bound at all.
    from tools.workspaces import task_workspace, tenant_usage

    cfg = WorkspaceConfig(max_file_bytes=1000, max_total_bytes=3000, max_files=5, max_tenant_bytes=1500)
    reg = ToolRegistry([WorkspaceReadTool(cfg), WorkspaceWriteTool(cfg)])

    def context(tenant: str, task: str) -> ToolContext:
        ws = task_workspace(tmp_path, tenant, task)
        ws.mkdir(parents=True)
        return ToolContext(task_id=task, step_id="1", attempt=1, idempotency_key=f"{task}:1", workspace=ws)

    a1, a2, b1 = context("acme", "a1"), context("acme", "a2"), context("globex", "b1")
    write(reg, a1, path="x", content="1" * 900)
    with pytest.raises(PermanentToolError, match="quota of 1500"):
        write(reg, a2, path="y", content="2" * 700)  # 900 + 700 over the tenant's 1500
    assert tenant_usage(a2.workspace) == 900
    write(reg, dataclasses.replace(a2, idempotency_key="a2:2"), path="y", content="2" * 500)  # 1400: fits
    write(reg, b1, path="z", content="3" * 900)  # another tenant counts apart
    # shrinking a file is allowed even at the quota
    write(reg, dataclasses.replace(a1, idempotency_key="a1:2"), path="x", content="1" * 100)
