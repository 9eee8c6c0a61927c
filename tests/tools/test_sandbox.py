"""The python sandbox: every escape attempt is contained (each its own test).

These run the real jail (namespaces, rlimits, unprivileged uid, Landlock where the kernel has it).
CI runs as root, so reading root-only files is the real test of the privilege drop.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tools.builtin import PythonTool, builtin_tools
from tools.config import MiB, SandboxConfig, SandboxLimits, ToolsConfig
from tools.registry import ToolRegistry
from tools.sandbox import Sandbox, SandboxResult, SandboxUnavailableError, runner

LIMITS = SandboxLimits(
    timeout_s=5.0,
    cpu_s=5,
    memory_bytes=256 * MiB,
    file_size_bytes=1 * MiB,
    disk_bytes=4 * MiB,
    max_files=256,
    nproc=16,
    max_output_bytes=4096,
)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    sb = Sandbox(SandboxConfig(limits=LIMITS))
    sb.probe()  # raises SandboxUnavailableError: a host without isolation fails these tests
    return sb


def run(sb: Sandbox, code: str, **limits: object) -> SandboxResult:
    lim = (
        LIMITS
        if not limits
        else SandboxLimits(**{**{n: getattr(LIMITS, n) for n in LIMITS.__slots__}, **limits})
    )
    return sb.run(code, limits=lim)


def sandbox_uid_processes(uid: int) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith(("Z", "X")):
                pids.add(int(entry))
    return pids


def assert_no_survivors(uid: int, before: set[int]) -> None:
    """No new live process of the sandbox uid remains (the kernel reaps a dead namespace quickly)."""
    deadline = time.monotonic() + 3.0
    while (left := sandbox_uid_processes(uid) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes survived the sandbox: {sorted(left)}"


def test_runs_code_as_unprivileged_user(sandbox: Sandbox) -> None:
    res = run(sandbox, "import os\nprint(os.getuid(), os.getgid(), os.getcwd(), os.getpid())\n")
    assert res.exit_code == 0, res.stderr
    uid, gid, cwd, pid = res.stdout.split()
    if os.geteuid() == 0:
        assert (int(uid), int(gid)) == (65534, 65534)
    assert cwd == "/tmp/work"
    assert pid == "1"  # PID 1 of its own PID namespace


def test_reading_etc_shadow_is_denied(sandbox: Sandbox) -> None:
    assert os.path.exists("/etc/shadow")
    res = run(sandbox, "print(open('/etc/shadow').read())")
    assert res.exit_code == 1
    assert "PermissionError" in res.stderr
    assert "root:" not in res.stdout


def test_files_outside_the_workspace_are_denied(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)
    code = (
        "import os\n"
        f"print('visible', os.path.exists({str(secret)!r}))\n"
        "for p in ['/etc/passwd', '/proc/1/environ', " + repr(str(Path(__file__).resolve())) + "]:\n"
        "    try:\n"
        "        print(p, 'READ', open(p).read()[:20])\n"
        "    except OSError as e:\n"
        "        print(p, 'DENIED', type(e).__name__)\n"
    )
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert "TOP-SECRET" not in res.stdout
    assert "visible False" in res.stdout  # the host's /tmp is replaced by a private tmpfs
    if sandbox.info.landlock_abi > 0:  # world-readable files too, where the kernel has Landlock
        assert res.stdout.count("DENIED") == 3, res.stdout
        assert "READ" not in res.stdout


def test_without_landlock_the_fallback_still_contains(tmp_path: Path) -> None:
    """Kernels without Landlock: private mounts, read-only remounts, uid drop and rlimits remain."""
    sb = Sandbox(SandboxConfig(limits=LIMITS, use_landlock=False))
    assert sb.probe().landlock_abi == 0
    code = (
        "import os\n"
        "for p in ['/etc/shadow', '/root/.bashrc']:\n"
        "    try:\n"
        "        open(p).read(); print(p, 'READ')\n"
        "    except OSError as e:\n"
        "        print(p, 'DENIED', e.strerror)\n"
        "for p in ['/etc/dz-pwn', '/var/lib/dz-pwn', '/dev/shm/dz-pwn', '/var/tmp/dz-pwn', '/tmp/dz-pwn']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print(p, 'WROTE')\n"
        "    except OSError as e:\n"
        "        print(p, 'DENIED', e.strerror)\n"
    )
    res = run(sb, code)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    if os.geteuid() == 0:
        assert all("DENIED" in line for line in lines[:2]), lines
    for line in lines[2:]:
        path = line.split()[0]
        # scratch dirs are private tmpfs copies: a write there never reaches the host
        assert "DENIED" in line or path in ("/dev/shm/dz-pwn", "/var/tmp/dz-pwn", "/tmp/dz-pwn"), line
        assert not Path(path).exists(), path


def test_unprivileged_caller_gets_a_user_namespace(tmp_path: Path) -> None:
    """The same launcher started by a non-root user: user namespace instead of a uid drop."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root (to become a non-root user), setpriv and /usr/bin/python3")
    shared = Path(tempfile.mkdtemp(prefix="dz-launcher-"))
    try:
        shared.chmod(0o755)
        launcher = shared / "_launcher.py"
        shutil.copy(runner.LAUNCHER, launcher)
        launcher.chmod(0o644)
        sb = Sandbox(SandboxConfig(limits=LIMITS, python_executable="/usr/bin/python3"))
        code = (
            "import os, socket\n"
            "print(os.getuid(), os.getpid())\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', 9), timeout=1); print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('net', type(e).__name__)\n"
            "try:\n"
            "    open('/etc/passwd').read(); print('READ')\n"
            "except OSError as e:\n"
            "    print('passwd', type(e).__name__)\n"
        )
        cmd = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "/usr/bin/python3", "-I", "-S"]
        res = runner._execute(sb.job(code, LIMITS), LIMITS, launcher=[*cmd, str(launcher)])
    finally:
        shutil.rmtree(shared)
    assert res.exit_code == 0, res.stderr
    uid, pid = res.stdout.split()[:2]
    assert (uid, pid) == ("4242", "1")
    assert "CONNECTED" not in res.stdout
    if sb.info.landlock_abi > 0:
        assert "READ" not in res.stdout


def test_dot_dot_paths_do_not_leave_the_working_dir(sandbox: Sandbox) -> None:
    code = (
        "import os\n"
        "for p in ['../../etc/shadow', '../../../../../etc/passwd', '../../root']:\n"
        "    try:\n"
        "        print(p, 'OPENED', len(open(p).read()) if not p.endswith('root') else os.listdir(p))\n"
        "    except OSError as e:\n"
        "        print(p, 'DENIED', type(e).__name__)\n"
        "try:\n"
        "    open('../escaped.txt', 'w').write('x'); print('WROTE /tmp/escaped.txt')\n"
        "except OSError as e:\n"
        "    print('write DENIED', type(e).__name__)\n"
    )
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert "OPENED" not in res.stdout
    assert res.stdout.count("DENIED") >= 3
    assert not Path("/tmp/escaped.txt").exists()  # whatever happened there, it was not the host's /tmp


def test_opening_a_socket_is_contained(sandbox: Sandbox) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        f"s.connect(('127.0.0.1', {port}))\n"
        "print('CONNECTED')\n"
    )
    try:
        res = run(sandbox, code)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    assert res.exit_code == 1
    assert "CONNECTED" not in res.stdout
    assert "Error" in res.stderr


def test_host_unix_sockets_are_unreachable(sandbox: Sandbox) -> None:
    """A world-writable daemon socket (think docker.sock at 0666) outside the jail stays out of reach:
    the network namespace does not cover filesystem sockets, the seccomp filter does."""
    base = "/run" if os.access("/run", os.W_OK) else "/"
    d = Path(tempfile.mkdtemp(prefix="dz-sock-", dir=base))
    d.chmod(0o755)
    path = d / "daemon.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        path.chmod(0o777)
        srv.listen(1)
        srv.settimeout(0.2)
        code = (
            "import socket\n"
            "a, b = socket.socketpair(); a.send(b'x'); print('socketpair', b.recv(1) == b'x')\n"
            "try:\n"
            f"    s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r}); print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('denied', e.errno)\n"
        )
        res = run(sandbox, code)
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()
        shutil.rmtree(d)
    assert res.exit_code == 0, res.stderr
    assert "socketpair True" in res.stdout  # multiprocessing still works
    assert "CONNECTED" not in res.stdout and "denied 1" in res.stdout


def test_network_namespace_has_no_usable_interface(sandbox: Sandbox) -> None:
    code = (
        "import socket\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "try:\n"
        "    s.bind(('127.0.0.1', 0)); s.listen(); print('LISTENING')\n"
        "except OSError as e:\n"
        "    print('bind', type(e).__name__)\n"
    )
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0] == "['lo']"  # a fresh namespace: loopback only (and down)
    assert "LISTENING" not in res.stdout


def test_fork_bomb_is_capped(sandbox: Sandbox) -> None:
    before = sandbox_uid_processes(sandbox.config.uid)
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('blocked after', n, e.errno)\n"
    )
    t0 = time.monotonic()
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert "blocked after" in res.stdout
    assert int(res.stdout.split()[2]) < LIMITS.nproc
    # PID 1 exited, so the kernel killed its sleeping children: nothing survives the run
    assert time.monotonic() - t0 < 10
    if os.geteuid() == 0:
        assert_no_survivors(sandbox.config.uid, before)


def test_runaway_fork_bomb_and_daemons_are_killed(sandbox: Sandbox) -> None:
    before = sandbox_uid_processes(sandbox.config.uid)
    code = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()  # leaves the process group: only the PID namespace can catch it\n"
        "    while True:\n"
        "        pass\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    res = run(sandbox, code, timeout_s=1.5)
    assert res.timed_out and res.signal == "SIGKILL"
    assert res.duration_s < 6
    if os.geteuid() == 0:
        assert_no_survivors(sandbox.config.uid, before)


def test_memory_bomb_is_refused(sandbox: Sandbox) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    res = run(sandbox, code)
    assert res.exit_code == 1
    assert "MemoryError" in res.stderr
    res = run(sandbox, "x = bytearray(8 * 1024 ** 3)")
    assert "MemoryError" in res.stderr


def test_infinite_loop_is_killed_at_the_deadline(sandbox: Sandbox) -> None:
    res = run(sandbox, "while True:\n    pass\n", timeout_s=1.0)
    assert res.timed_out
    assert res.exit_code is None and res.signal == "SIGKILL"
    assert 1.0 <= res.duration_s < 5


def test_closing_its_output_does_not_escape_the_deadline(sandbox: Sandbox) -> None:
    res = run(sandbox, "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n", timeout_s=1.0)
    assert res.timed_out and res.signal == "SIGKILL"
    assert res.duration_s < 4


def test_cpu_limit_applies_even_with_a_long_wall_clock(sandbox: Sandbox) -> None:
    # 1 CPU-second can take several wall seconds on a loaded machine: a generous wall clock
    res = run(sandbox, "while True:\n    pass\n", timeout_s=30.0, cpu_s=1)
    assert not res.timed_out
    assert res.signal in ("SIGXCPU", "SIGKILL")


def test_huge_file_is_capped(sandbox: Sandbox) -> None:
    code = (
        "import os\n"
        "f = open('big.bin', 'wb')\n"
        "try:\n"
        "    for _ in range(64):\n"
        "        f.write(b'x' * (1024 * 1024)); f.flush()\n"
        "except OSError as e:\n"
        "    print('stopped', e.errno, os.path.getsize('big.bin'))\n"
    )
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    _, errno_, size = res.stdout.split()
    assert int(errno_) == 27  # EFBIG
    assert int(size) <= LIMITS.file_size_bytes


def test_many_files_fill_only_the_private_disk(sandbox: Sandbox) -> None:
    code = (
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        with open(f'f{n}', 'wb') as f:\n"
        "            f.write(b'x' * (512 * 1024))\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('stopped', n, e.errno)\n"
    )
    res = run(sandbox, code)
    assert res.exit_code == 0, res.stderr
    assert int(res.stdout.split()[1]) * 512 * 1024 <= LIMITS.disk_bytes
    assert int(res.stdout.split()[2]) == 28  # ENOSPC on the capped tmpfs


def test_output_is_capped(sandbox: Sandbox) -> None:
    res = run(sandbox, "import sys\nprint('a' * 1_000_000)\nsys.stderr.write('e' * 100_000)\n")
    assert res.exit_code == 0
    assert len(res.stdout) == LIMITS.max_output_bytes and res.stdout_truncated
    assert len(res.stderr) == LIMITS.max_output_bytes and res.stderr_truncated


def test_working_dir_is_private_and_discarded(sandbox: Sandbox) -> None:
    first = run(sandbox, "open('note.txt', 'w').write('hi'); import os; print(os.listdir('.'))")
    assert "note.txt" in first.stdout
    second = run(sandbox, "import os; print(sorted(os.listdir('.')))")
    assert "note.txt" not in second.stdout


def test_python_tool_through_the_registry(sandbox: Sandbox, ctx) -> None:  # type: ignore[no-untyped-def]
    reg = ToolRegistry([PythonTool(sandbox=sandbox)])
    out = reg.execute("python", {"code": "print(6 * 7)"}, ctx).content
    assert out["exit_code"] == 0 and out["stdout"] == "42\n" and out["timed_out"] is False
    out = reg.execute("python", {"code": "while True: pass", "timeout_s": 0.5}, ctx).content
    assert out["timed_out"] is True


def test_tool_refuses_to_enable_without_isolation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Stand-in for a host where unshare() fails: the launcher reports a setup failure.
    fake = tmp_path / "launcher.py"
    fake.write_text(
        "import json, os, sys\nnonce = json.loads(sys.stdin.read())['nonce']\n"
        "msg = f'dayzero-sandbox-setup:{nonce}: unshare(net, mount, pid, ipc, uts) failed: Operation not permitted'\n"
        "os.write(2, msg.encode())\n"
        "os._exit(120)\n"
    )
    monkeypatch.setattr("tools.sandbox.runner.LAUNCHER", fake)
    with pytest.raises(SandboxUnavailableError, match=r"python tool cannot be enabled.*unshare"):
        builtin_tools(ToolsConfig(enabled=("python",)))
    assert builtin_tools(ToolsConfig(enabled=("python", "calculator"), skip_unavailable=True))[
        0
    ].spec.name == ("calculator")


def test_user_code_cannot_forge_a_setup_failure(sandbox: Sandbox) -> None:
    code = "import os\nos.write(2, b'dayzero-sandbox-setup:x: fake'); os._exit(120)"
    res = run(sandbox, code)  # an ordinary failing program, not SandboxUnavailableError
    assert res.exit_code == 120 and "fake" in res.stderr


def test_result_shape(sandbox: Sandbox) -> None:
    res = run(sandbox, "import sys; sys.exit(3)")
    fields: Mapping[str, object] = {n: getattr(res, n) for n in res.__slots__}
    assert fields["exit_code"] == 3 and fields["timed_out"] is False and fields["signal"] is None


def test_a_call_is_bounded_in_memory_as_a_whole(sandbox: Sandbox) -> None:
    # Before: RLIMIT_AS bounded each process only, so `nproc` processes could each hold nearly
    # that much: 6 x 150 MiB here, under a 256 MiB per-process limit, ran to the end.
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        b = bytearray(150 * 1024 * 1024)\n"
        "        b[::4096] = b'\\x01' * len(range(0, len(b), 4096))  # every page resident\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "time.sleep(60)\n"
    )
    before = sandbox_uid_processes(sandbox.config.uid)
    res = run(sandbox, code, timeout_s=30.0, call_memory_bytes=384 * MiB)
    assert res.memory_exceeded and not res.timed_out, res
    assert res.signal == "SIGKILL"
    assert_no_survivors(sandbox.config.uid, before)
