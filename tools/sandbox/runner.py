"""Run untrusted Python in a jailed child process and collect bounded output.

The jail itself is set up by `_launcher.py` (namespaces, private tmpfs, rlimits, unprivileged uid,
Landlock); this module starts it in its own session, enforces the wall clock by killing the whole
process group (the launcher's PID namespace takes every descendant with it), and caps what it
keeps of stdout and stderr.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import selectors
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.base import PermanentToolError
from tools.config import SandboxConfig, SandboxLimits
from tools.sandbox.membound import (
    POLL_S,
    CallBound,
    CgroupSetupError,
    MemoryBound,
    TreeRssBound,
    choose_memory_bound,
)

LAUNCHER = Path(__file__).with_name("_launcher.py")
SETUP_FAILED = 120
SETUP_MARK = "dayzero-sandbox-setup:"
_FALLBACK_PYTHON = "/usr/bin/python3"
# Read-only paths the interpreter needs besides its own prefix (missing ones are skipped).
_SYSTEM_READ_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
)


class SandboxUnavailableError(PermanentToolError):
    """The host cannot provide the isolation the sandbox requires; the tool is not enabled."""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    memory_exceeded: bool = False  # killed: its processes together passed `call_memory_bytes`


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    python: str
    landlock_abi: int  # 0: not available on this kernel
    memory_bound: str  # how a call's memory is bounded as a whole: cgroup_v2 | process_tree_rss


class Sandbox:
    """A configured sandbox; `probe()` checks once that the host supports it."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.python = self.config.python_executable or _pick_python(self.config.uid, self.config.gid)
        self.memory_bound = choose_memory_bound(self.config.cgroup_parent)

    @functools.cached_property
    def info(self) -> SandboxInfo:
        """Probe the host by running a trivial program; raises `SandboxUnavailableError`."""
        probe = "import os, socket\nprint(os.environ.get('DAYZERO_SANDBOX_LANDLOCK_ABI', '0'))\n"
        res = self.run(probe, limits=SandboxLimits(timeout_s=20.0))
        if res.exit_code != 0:
            raise SandboxUnavailableError(
                "the python sandbox cannot run on this host "
                f"(exit {res.exit_code}, signal {res.signal}): {res.stderr.strip()[:500]}"
            )
        return SandboxInfo(
            python=self.python,
            landlock_abi=int(res.stdout.strip() or 0),
            memory_bound=self.memory_bound.name,
        )

    def probe(self) -> SandboxInfo:
        return self.info

    def run(self, code: str, *, limits: SandboxLimits | None = None) -> SandboxResult:
        lim = limits or self.config.limits
        return _execute(self.job(code, lim), lim, bound=self.memory_bound)

    def job(self, code: str, lim: SandboxLimits) -> dict:
        """The JSON job the launcher reads on stdin."""
        if len(code.encode()) > lim.max_code_bytes:
            raise ValueError(f"code is larger than {lim.max_code_bytes} bytes")
        job = {
            "python": self.python,
            "uid": self.config.uid,
            "gid": self.config.gid,
            "require_landlock": self.config.require_landlock,
            "use_landlock": self.config.use_landlock,
            "limits": {k: (int(v) if k != "timeout_s" else v) for k, v in asdict(lim).items()},
            "files": {"main.py": code},
            "nonce": secrets.token_hex(16),
            "read_paths": _read_paths(self.python),
            "write_paths": ["/tmp/work", "/dev/null"],
        }
        job["limits"]["cpu_s"] = max(1, min(lim.cpu_s, int(lim.timeout_s) + 1))
        return job


def _execute(
    job: dict, lim: SandboxLimits, launcher: list[str] | None = None, bound: MemoryBound | None = None
) -> SandboxResult:
    """Run the launcher (`launcher` overrides its command line, for tests) and collect the result.

    The launcher waits for its job on stdin, so the memory bound is attached before any of the
    call's code runs."""
    start = time.monotonic()
    proc = subprocess.Popen(
        launcher or [sys.executable, "-I", "-S", "-B", str(LAUNCHER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, killed as one on timeout
        close_fds=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    try:
        call = (bound or TreeRssBound()).attach(proc.pid, lim.call_memory_bytes)
    except CgroupSetupError:
        _kill_group(proc)
        proc.wait()
        raise
    try:
        return _collect(proc, job, lim, call, start)
    finally:
        call.close()


def _collect(
    proc: subprocess.Popen, job: dict, lim: SandboxLimits, call: CallBound, start: float
) -> SandboxResult:
    try:
        assert proc.stdin is not None  # Popen with PIPE always sets it
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = memory_exceeded = False
    streams = _BoundedStreams(proc, lim.max_output_bytes)
    deadline = start + lim.timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            _kill_group(proc)
            break
        if call.exceeded():
            memory_exceeded = True
            _kill_group(proc)
            break
        if streams.done():  # both pipes closed; the program may still run (it can close them)
            try:
                proc.wait(timeout=remaining)
                break
            except subprocess.TimeoutExpired:
                continue
        streams.pump(min(remaining, POLL_S))
    # After a kill the namespace dies with its PID 1; drain what is left, but never wait forever.
    streams.drain(grace_s=2.0)
    try:
        rc = proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        rc = proc.wait()
    exit_code, sig = _decode_status(rc)
    mark = f"{SETUP_MARK}{job['nonce']}:"
    if exit_code == SETUP_FAILED and mark in streams.text("stderr"):
        raise SandboxUnavailableError(streams.text("stderr").split(mark, 1)[1].strip()[:500])
    return SandboxResult(
        exit_code=None if timed_out else exit_code,
        signal="SIGKILL" if timed_out else sig,
        timed_out=timed_out,
        stdout=streams.text("stdout"),
        stderr=streams.text("stderr"),
        stdout_truncated=streams.truncated("stdout"),
        stderr_truncated=streams.truncated("stderr"),
        duration_s=round(time.monotonic() - start, 3),
        memory_exceeded=memory_exceeded,
    )


class _BoundedStreams:
    """Reads stdout and stderr without blocking, keeping at most `cap` bytes of each."""

    def __init__(self, proc: subprocess.Popen, cap: int) -> None:
        self.cap = cap
        self.sel = selectors.DefaultSelector()
        self.kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.total = {"stdout": 0, "stderr": 0}
        for name in ("stdout", "stderr"):
            pipe = getattr(proc, name)
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe, selectors.EVENT_READ, name)

    def done(self) -> bool:
        return not self.sel.get_map()

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            try:  # os.read, not read1: a buffered read1 reports "would block" as b"" (EOF)
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                continue
            buf = self.kept[key.data]
            self.total[key.data] += len(chunk)
            if len(buf) < self.cap:
                buf += chunk[: self.cap - len(buf)]

    def drain(self, grace_s: float) -> None:
        end = time.monotonic() + grace_s
        while not self.done() and time.monotonic() < end:
            self.pump(0.1)
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]

    def text(self, name: str) -> str:
        return bytes(self.kept[name]).decode("utf-8", errors="replace")

    def truncated(self, name: str) -> bool:
        return self.total[name] > len(self.kept[name])


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _decode_status(rc: int) -> tuple[int | None, str | None]:
    if rc < 0:
        return None, signal.Signals(-rc).name
    if rc > 128 and rc - 128 in signal.valid_signals():
        return None, signal.Signals(rc - 128).name  # the launcher relays a signalled child
    return rc, None


def _read_paths(python: str) -> list[str]:
    """System paths plus the interpreter's installation prefix, read-only inside the jail."""
    exe = Path(python).resolve()
    prefix = exe.parent.parent  # <prefix>/bin/python3
    return [*_SYSTEM_READ_PATHS, str(prefix), str(exe)]


def _pick_python(uid: int, gid: int) -> str:
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or uid == 0 or _reachable_by_other(own):
        return own
    if os.path.exists(_FALLBACK_PYTHON):
        return _FALLBACK_PYTHON
    raise SandboxUnavailableError(
        f"no interpreter the sandbox uid {uid} can execute: {own} is not world-reachable and "
        f"{_FALLBACK_PYTHON} does not exist; set SandboxConfig.python_executable"
    )


def _reachable_by_other(path: str) -> bool:
    """True when 'others' may traverse every ancestor directory and read+execute the file."""
    p = Path(path)
    try:
        if (p.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)
    except OSError:
        return False
