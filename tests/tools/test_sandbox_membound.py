"""The sandbox's memory bound for a whole call: cgroup v2 where the memory controller is delegated,
else the process-tree RSS bound (issue 39 item 10); one chooser, reported by the sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tools.test_sandbox import LIMITS, assert_no_survivors, run, sandbox_uid_processes
from tools.config import MiB, SandboxConfig
from tools.sandbox import Sandbox
from tools.sandbox.membound import CgroupV2Bound, TreeRssBound, choose_memory_bound

FORK_AND_ALLOCATE = (
    "import os, time\n"
    "for _ in range(6):\n"
    "    if os.fork() == 0:\n"
    "        b = bytearray(150 * 1024 * 1024)\n"
    "        b[::4096] = b'\\x01' * len(range(0, len(b), 4096))\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "time.sleep(60)\n"
)


def _host(tmp_path: Path, own: str, controllers: str | None) -> tuple[Path, Path]:
    """A fake /proc/self/cgroup and /proc/self/mounts naming a cgroup2 mount under tmp_path."""
    mount = tmp_path / "cg"
    cg = mount / own.lstrip("/")
    cg.mkdir(parents=True)
    if controllers is not None:
        (cg / "cgroup.subtree_control").write_text(controllers + "\n")
    (tmp_path / "cgroup").write_text(f"4:memory:/x\n0::{own}\n")
    (tmp_path / "mounts").write_text(f"proc /proc proc rw 0 0\ncgroup2 {mount} cgroup2 rw,relatime 0 0\n")
    return tmp_path / "cgroup", tmp_path / "mounts"


@pytest.mark.parametrize(
    ("controllers", "expected"),
    [("cpu memory pids", "cgroup_v2"), ("cpu pids", "process_tree_rss"), (None, "process_tree_rss")],
    ids=["memory-delegated", "no-memory-controller", "no-cgroup-files"],
)
def test_the_bound_follows_memory_delegation(tmp_path: Path, controllers: str | None, expected: str) -> None:
    proc_cgroup, mounts = _host(tmp_path, "/svc/api", controllers)
    bound = choose_memory_bound(proc_self_cgroup=proc_cgroup, mounts=mounts)
    assert bound.name == expected
    if isinstance(bound, CgroupV2Bound):
        assert bound.parent == tmp_path / "cg" / "svc" / "api"


def test_no_cgroup2_mount_means_the_process_tree_bound(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/\n")
    (tmp_path / "mounts").write_text("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")
    bound = choose_memory_bound(proc_self_cgroup=tmp_path / "cgroup", mounts=tmp_path / "mounts")
    assert isinstance(bound, TreeRssBound)


def test_a_cgroup_call_gets_its_limit_and_reports_the_oom_kill(tmp_path: Path) -> None:
    call = CgroupV2Bound(tmp_path).attach(os.getpid(), 123 * MiB)
    (cg,) = tmp_path.iterdir()
    assert (cg / "memory.max").read_text() == str(123 * MiB)
    assert (cg / "cgroup.procs").read_text() == str(os.getpid())
    assert not call.exceeded()  # no memory.events yet
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert call.exceeded()
    for f in cg.iterdir():  # cgroupfs removes its interface files itself
        f.unlink()
    call.close()
    assert not cg.exists()


def test_the_sandbox_reports_its_bound_and_bounds_a_forking_call() -> None:
    sb = Sandbox(SandboxConfig(limits=LIMITS))
    assert sb.info.memory_bound == choose_memory_bound().name
    before = sandbox_uid_processes(sb.config.uid)
    res = run(sb, FORK_AND_ALLOCATE, timeout_s=30.0, call_memory_bytes=384 * MiB)
    assert res.memory_exceeded and not res.timed_out, res
    assert_no_survivors(sb.config.uid, before)


@pytest.mark.skipif(
    not isinstance(choose_memory_bound(), CgroupV2Bound),
    reason="needs a cgroup v2 hierarchy with the memory controller delegated to this process",
)
def test_cgroup_v2_bound_kills_the_whole_call() -> None:
    sb = Sandbox(SandboxConfig(limits=LIMITS))
    assert sb.info.memory_bound == "cgroup_v2"
    before = sandbox_uid_processes(sb.config.uid)
    res = run(sb, FORK_AND_ALLOCATE, timeout_s=30.0, call_memory_bytes=384 * MiB)
    assert res.memory_exceeded and not res.timed_out, res
    assert_no_survivors(sb.config.uid, before)
    assert not [p for p in sb.memory_bound.parent.iterdir() if p.name.startswith("dayzero-sandbox-")]
