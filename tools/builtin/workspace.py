"""`workspace_read` / `workspace_write`: per-task scratch files under `ToolContext.workspace`.

Paths are resolved one component at a time with `openat(..., O_NOFOLLOW)` from a descriptor of the
workspace root, so neither `../` nor a symlink planted anywhere on the path (by the python sandbox,
a previous write, or a race) can lead outside: the kernel refuses to follow it. Only regular files
with a single link are read or replaced, so a hard link to an outside file is refused too.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    RetryPolicy,
    ToolContext,
    ToolResult,
    ToolSpec,
)
from tools.config import WorkspaceConfig
from tools.workspaces import RESERVED_DIR, tenant_usage, usage

MAX_PATH_CHARS = 512
MAX_DEPTH = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefusedError(InvalidArgumentsError):
    """The path is outside the workspace, names a link, or is otherwise not allowed."""


def split_path(raw: str, *, allow_root: bool = False) -> list[str]:
    """Validate a workspace-relative path and return its components."""
    if "\x00" in raw or len(raw) > MAX_PATH_CHARS:
        raise PathRefusedError("path contains NUL or is too long")
    if raw.startswith(("/", "\\")) or (len(raw) > 1 and raw[1] == ":"):
        raise PathRefusedError(f"path {raw!r} must be relative to the workspace")
    parts = [p for p in PurePosixPath(raw.replace("\\", "/")).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathRefusedError(f"path {raw!r} may not contain '..'")
    if parts and parts[0] == RESERVED_DIR:
        raise PathRefusedError(f"{RESERVED_DIR}/ is reserved")
    if len(parts) > MAX_DEPTH:
        raise PathRefusedError(f"path is deeper than {MAX_DEPTH} levels")
    if not parts and not allow_root:
        raise PathRefusedError("path names the workspace itself, not a file")
    return parts


def _workspace(context: ToolContext) -> Path:
    if context.workspace is None:
        raise PermanentToolError("this task has no workspace")
    return context.workspace


@contextlib.contextmanager
def _open_dir(root: Path, parts: list[str], *, create: bool) -> Iterator[int]:
    """A descriptor of the directory `root/parts...`, never following a symlink."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathRefusedError("a component of the path is a symbolic link or not a directory") from None
        raise
    finally:
        os.close(fd)


class WorkspaceReadTool:
    def __init__(self, config: WorkspaceConfig | None = None) -> None:
        self.config = config or WorkspaceConfig()
        cap = self.config.max_file_bytes
        self.spec = ToolSpec(
            name="workspace_read",
            description=(
                "Read a file from this task's scratch workspace (paths relative to it), or list a "
                f"directory when the path names one ('' or '.' lists the root). At most {cap} bytes per call; "
                "use offset to page through larger files."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "maxLength": MAX_PATH_CHARS},
                    "offset": {"type": "integer", "minimum": 0, "default": 0},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": cap},
                    "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "oneOf": [
                    {"required": ["content", "size", "offset", "eof", "encoding"]},
                    {"required": ["entries"]},
                ],
            },
            retry=RetryPolicy(max_attempts=3, timeout_s=10.0),
            idempotent=True,
            resources=("workspace",),
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        root = _workspace(context)
        parts = split_path(arguments["path"], allow_root=True)
        try:
            with _open_dir(root, parts[:-1], create=False) as dfd:
                if not parts:
                    return ToolResult(content={"entries": _list(dfd)})
                try:
                    fd = os.open(
                        parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                    )
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise PathRefusedError(f"{arguments['path']!r} is a symbolic link") from None
                    raise
                try:
                    return ToolResult(content=self._read(fd, arguments))
                finally:
                    os.close(fd)
        except FileNotFoundError:
            raise PermanentToolError(f"{arguments['path']!r} does not exist in the workspace") from None

    def _read(self, fd: int, arguments: Mapping[str, Any]) -> dict[str, Any]:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return {"entries": _list(fd)}
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise PathRefusedError(f"{arguments['path']!r} is not a regular file with a single link")
        offset = arguments.get("offset", 0)
        limit = min(arguments.get("max_bytes", self.config.max_file_bytes), self.config.max_file_bytes)
        data = os.pread(fd, limit, offset)
        encoding = arguments.get("encoding", "utf-8")
        if encoding == "base64":
            text = base64.b64encode(data).decode()
        else:
            text = data.decode("utf-8", errors="replace")
        return {
            "content": text,
            "size": st.st_size,
            "offset": offset,
            "eof": offset + len(data) >= st.st_size,
            "encoding": encoding,
        }


def _list(dfd: int) -> list[dict[str, Any]]:
    entries = []
    for name in sorted(os.listdir(dfd))[:1000]:
        if name == RESERVED_DIR:
            continue
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        entries.append({"name": name, "type": kind, "size": st.st_size})
    return entries


class WorkspaceWriteTool:
    """Writes replace the file atomically (temp file + rename), so a half-written file is never seen.

    `overwrite` and `create` are naturally safe to repeat; `append` is not, so the tool records the
    result under the call's idempotency key and replays it when the same key comes again.
    """

    def __init__(self, config: WorkspaceConfig | None = None) -> None:
        self.config = config or WorkspaceConfig()
        self.spec = ToolSpec(
            name="workspace_write",
            description=(
                "Write a file in this task's scratch workspace (path relative to it; parent directories "
                f"are created). mode: overwrite (default), create (fail if it exists) or append. At most "
                f"{self.config.max_file_bytes} bytes per file."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS},
                    "content": {"type": "string"},
                    "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
                    "mode": {"enum": ["overwrite", "create", "append"], "default": "overwrite"},
                },
                "required": ["path", "content"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "size": {"type": "integer"},
                    "sha256": {"type": "string"},
                },
                "required": ["path", "size", "sha256"],
            },
            retry=RetryPolicy(max_attempts=3, timeout_s=10.0),
            idempotent=False,
            accepts_idempotency_key=True,
            resources=("workspace",),
            max_argument_bytes=self.config.max_file_bytes * 4 // 3 + 4096,  # base64 of a full file
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        root = _workspace(context)
        parts = split_path(arguments["path"])
        if arguments.get("encoding", "utf-8") == "base64":
            try:
                data = base64.b64decode(arguments["content"], validate=True)
            except ValueError:
                raise InvalidArgumentsError("content is not valid base64") from None
        else:
            data = arguments["content"].encode()
        key = hashlib.sha256(context.idempotency_key.encode()).hexdigest()
        replay = self._replay(root, key)
        if replay is not None:
            return ToolResult(content=replay, metadata={"replayed": True})
        mode = arguments.get("mode", "overwrite")
        with _open_dir(root, parts[:-1], create=True) as dfd:
            old = self._existing(dfd, parts[-1], arguments["path"])
            if mode == "create" and old is not None:
                raise PermanentToolError(f"{arguments['path']!r} already exists")
            if mode == "append" and old is not None:
                data = os.pread(old[0], old[1], 0) + data
            if old is not None:
                os.close(old[0])
            if len(data) > self.config.max_file_bytes:
                raise PermanentToolError(
                    f"file would be {len(data)} bytes; the limit is {self.config.max_file_bytes}"
                )
            used, files = usage(root)
            growth = len(data) - (old[1] if old else 0)
            if used + growth > self.config.max_total_bytes:
                raise PermanentToolError(f"the workspace would exceed {self.config.max_total_bytes} bytes")
            if growth > 0 and tenant_usage(root) + growth > self.config.max_tenant_bytes:
                raise PermanentToolError(
                    f"the tenant's workspaces would exceed their quota of {self.config.max_tenant_bytes} "
                    "bytes (other tasks' workspaces count too; they are deleted when their tasks end)"
                )
            if old is None and files + 1 > self.config.max_files:
                raise PermanentToolError(f"the workspace holds {self.config.max_files} files already")
            _atomic_write(dfd, parts[-1], data)
        result = {"path": "/".join(parts), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        self._record(root, key, result)
        return ToolResult(content=result)

    @staticmethod
    def _existing(dfd: int, name: str, shown: str) -> tuple[int, int] | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathRefusedError(f"{shown!r} is a symbolic link") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise PathRefusedError(f"{shown!r} is not a regular file with a single link")
        return fd, st.st_size

    @staticmethod
    def _replay(root: Path, key: str) -> dict[str, Any] | None:
        try:
            with _open_dir(root, [RESERVED_DIR, "idempotency"], create=False) as dfd:
                fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    return json.loads(os.pread(fd, 65536, 0))
                finally:
                    os.close(fd)
        except (FileNotFoundError, PathRefusedError, ValueError):
            return None

    @staticmethod
    def _record(root: Path, key: str, result: dict[str, Any]) -> None:
        with _open_dir(root, [RESERVED_DIR, "idempotency"], create=True) as dfd:
            _atomic_write(dfd, key, json.dumps(result).encode())


def _atomic_write(dfd: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dfd)
        raise
    os.close(fd)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
