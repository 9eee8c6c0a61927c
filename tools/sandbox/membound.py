"""The memory bound of one sandbox call, all its processes together: which one, decided here.

- `cgroup_v2`: each call runs in its own child cgroup with `memory.max` (swap off,
  `memory.oom.group` so the kernel kills the whole call at once). Exact and immediate, but it
  needs a cgroup v2 hierarchy whose `memory` controller is delegated to this process: the parent
  (`SandboxConfig.cgroup_parent`, else this process's own cgroup) must list `memory` in its
  `cgroup.subtree_control` and be writable.
- `process_tree_rss`: otherwise, the runner sums the resident memory of the call's process tree
  every `POLL_S` and kills the process group past the limit (a burst between two polls can
  overshoot; RLIMIT_AS still bounds each process).

`choose_memory_bound` is the one place that picks; `Sandbox.info.memory_bound` reports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the process-tree bound samples resident memory
_PAGE = os.sysconf("SC_PAGE_SIZE")


class CallBound(Protocol):
    def exceeded(self) -> bool:
        """True once the call's processes together passed the limit (they are then killed)."""
        ...

    def close(self) -> None: ...


class MemoryBound(Protocol):
    name: str

    def attach(self, pid: int, limit_bytes: int) -> CallBound:
        """Bound `pid` and every process it starts; called before the call's code runs."""
        ...


# -- process-tree RSS ------------------------------------------------------------------------------
def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants (their host PIDs, PID namespace or not)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass(slots=True)
class _TreeCall:
    pid: int
    limit_bytes: int

    def exceeded(self) -> bool:
        return tree_rss_bytes(self.pid) > self.limit_bytes

    def close(self) -> None:
        pass


class TreeRssBound:
    name = "process_tree_rss"

    def attach(self, pid: int, limit_bytes: int) -> CallBound:
        return _TreeCall(pid, limit_bytes)


# -- cgroup v2 -------------------------------------------------------------------------------------
class CgroupSetupError(OSError):
    """The call's cgroup could not be made; the call is not run unbounded."""


@dataclass(slots=True)
class _CgroupCall:
    path: Path

    def exceeded(self) -> bool:
        try:
            events = (self.path / "memory.events").read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in events.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", 0)) > 0 or int(counts.get("oom_group_kill", 0)) > 0

    def close(self) -> None:
        # The cgroup can be removed once its processes are gone (the runner has reaped the call).
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
        log.warning("sandbox cgroup %s could not be removed", self.path)


class CgroupV2Bound:
    name = "cgroup_v2"

    def __init__(self, parent: Path):
        self.parent = parent

    def attach(self, pid: int, limit_bytes: int) -> CallBound:
        path = self.parent / f"dayzero-sandbox-{secrets.token_hex(6)}"
        try:
            path.mkdir()
            (path / "memory.max").write_text(str(limit_bytes))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / name).exists():
                    (path / name).write_text(value)
            (path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise CgroupSetupError(f"could not put the sandbox call in cgroup {path}: {exc}") from exc
        return _CgroupCall(path)


def _own_cgroup(proc_self_cgroup: Path, mounts: Path) -> Path | None:
    """This process's cgroup v2 directory (None: no cgroup v2 hierarchy mounted)."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
        mount_lines = mounts.read_text().splitlines()
    except OSError:
        return None
    rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    mount = next(
        (ln.split()[1] for ln in mount_lines if len(ln.split()) > 2 and ln.split()[2] == "cgroup2"), None
    )
    if rel is None or mount is None:
        return None
    return Path(mount) / rel.lstrip("/")


def choose_memory_bound(
    cgroup_parent: str | None = None,
    *,
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    mounts: Path = Path("/proc/self/mounts"),
) -> MemoryBound:
    """`cgroup_v2` where the memory controller is delegated to `cgroup_parent` (default: this
    process's cgroup), else `process_tree_rss`."""
    parent = Path(cgroup_parent) if cgroup_parent else _own_cgroup(proc_self_cgroup, mounts)
    if parent is None:
        return TreeRssBound()
    try:
        delegated = "memory" in (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        delegated = False
    if delegated and os.access(parent, os.W_OK):
        return CgroupV2Bound(parent)
    if cgroup_parent:
        log.warning("cgroup %s has no delegated memory controller: bounding by process-tree RSS", parent)
    return TreeRssBound()
