"""Sandbox launcher: runs as `python -I -S _launcher.py`, reads a JSON job on stdin, sets up the jail.

Standard library only and self-contained (it is run by path, not imported), so the package's import
path never reaches the sandbox. Order of operations:

1. unshare network, mount, PID, IPC and UTS namespaces (plus a user namespace when not root).
   A fresh network namespace has only a downed loopback: no route anywhere.
2. make every mount private, mount a size-capped tmpfs on /tmp (and /dev/shm, /var/tmp) so the
   code can only fill a bounded private disk; the working directory lives inside it.
3. fork: the child is PID 1 of the new PID namespace, so when it dies the kernel kills every
   process it left behind (fork bombs, daemonised children) and nothing outlives the run.
4. in the child: rlimits, drop to the unprivileged uid/gid (when root), parent-death signal,
   no_new_privs, Landlock (filesystem: read-only system paths, read-write working dir only;
   TCP bind/connect denied; abstract unix sockets and signals scoped), a seccomp filter (no
   AF_UNIX sockets, no io_uring, native syscall ABI only), then exec the interpreter.

Setup failures exit with SETUP_FAILED and a `dayzero-sandbox-setup:<nonce>:` line on stderr, so
the caller can tell a broken host from a failing user program (which cannot know the nonce).
"""

import ctypes
import ctypes.util
import json
import os
import resource
import signal
import sys

SETUP_FAILED = 120
MARK = "dayzero-sandbox-setup:"
# Set from the job: the caller's secret nonce, so user code cannot forge a setup failure.
_nonce = ""

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on x86-64 and arm64.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1
FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def fail(msg: str) -> None:
    os.write(2, f"{MARK}{_nonce}: {msg}\n".encode())
    os._exit(SETUP_FAILED)


def check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        fail(f"{what} failed: {os.strerror(err)} (errno {err})")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> int:
    return _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def remount_read_only(skip: set[str]) -> None:
    """Make every other mount read-only in this mount namespace (defence in depth under Landlock,
    and the main write barrier where the kernel has no Landlock). Best effort per mount; nosuid,
    nodev and noexec are kept, since a remount that dropped them would widen access."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            points = [line.split()[4].replace("\\040", " ") for line in f]
    except OSError:
        return
    keep = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC}
    for point in points:
        if point in skip:
            continue
        try:
            st = os.statvfs(point)
        except OSError:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for st_flag, ms_flag in keep.items():
            if st.f_flag & st_flag:
                flags |= ms_flag
        mount("none", point, None, flags, None)


def landlock(job: dict) -> int:
    """Apply the Landlock ruleset; returns the ABI used (0 when Landlock is unavailable)."""
    if not job["use_landlock"]:
        return 0
    abi = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION
    )
    if abi < 1:
        if job["require_landlock"]:
            fail("Landlock is required by the configuration but the kernel does not offer it")
        return 0
    fs = (1 << 13) - 1
    if abi >= 2:
        fs |= FS_REFER
    if abi >= 3:
        fs |= FS_TRUNCATE
    if abi >= 5:
        fs |= FS_IOCTL_DEV
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0, 0)
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rs = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    check(rs, "landlock_create_ruleset")
    read_x = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    write = fs & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK)
    rules = [(p, read_x) for p in job["read_paths"]] + [(p, write) for p in job["write_paths"]]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a listed system path this host lacks
        if not os.path.isdir(path):
            access &= FILE_ONLY_RIGHTS
        rule = _PathBeneath(access & fs, fd)
        ret = _libc.syscall(SYS_LANDLOCK_ADD_RULE, rs, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0)
        os.close(fd)
        check(ret, f"landlock_add_rule({path})")
    check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, rs, 0), "landlock_restrict_self")
    os.close(rs)
    return abi


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# (audit arch, socket(2) number) for the architectures we build a filter for.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
SYS_IO_URING_SETUP = 425
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_EPERM = 0x00050000 | 1
AF_UNIX = 1


def seccomp_filter() -> None:
    """Deny socket(AF_UNIX, ...) and io_uring; kill on a foreign syscall ABI (i386, x32).

    A network namespace does not cover filesystem unix sockets and Landlock (up to ABI 7) does not
    mediate connecting to one, so a world-writable socket of a host daemon would otherwise be
    reachable. socketpair(2) stays allowed (multiprocessing uses it); io_uring could open sockets
    behind the filter's back. Must run after no_new_privs.
    """
    arch = _SECCOMP_ARCH.get(os.uname().machine)
    if arch is None:
        fail(f"no seccomp filter for {os.uname().machine}; the sandbox supports x86_64 and aarch64")
    audit_arch, nr_socket = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    prog = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, RET_KILL_PROCESS),
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, 0x40000000),  # x32 syscalls share the x86-64 arch value
        (ret, 0, 0, RET_KILL_PROCESS),
        (jeq, 0, 1, SYS_IO_URING_SETUP),
        (ret, 0, 0, RET_EPERM),
        (jeq, 0, 3, nr_socket),
        (ld, 0, 0, 16),  # low half of args[0]: the address family
        (jeq, 0, 1, AF_UNIX),
        (ret, 0, 0, RET_EPERM),
        (ret, 0, 0, RET_ALLOW),
    ]
    filters = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    fprog = _SockFprog(len(prog), filters)
    check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def child(job: dict, workdir: str, alive_fd: int) -> None:
    """PID 1 of the new namespace: limits, privileges, Landlock, then exec the user program."""
    # A /proc of this PID namespace only (best effort: without it the code simply sees no /proc).
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    lim = job["limits"]
    for res, value in (
        (resource.RLIMIT_AS, lim["memory_bytes"]),
        (resource.RLIMIT_CPU, lim["cpu_s"]),
        (resource.RLIMIT_FSIZE, lim["file_size_bytes"]),
        (resource.RLIMIT_NPROC, lim["nproc"]),
        (resource.RLIMIT_NOFILE, lim["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError) as exc:
            fail(f"setrlimit({res}) failed: {exc}")
    if os.geteuid() == 0 and job["uid"] != 0:
        try:
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
        except OSError as exc:
            fail(f"dropping privileges failed: {exc}")
        if os.geteuid() == 0 or os.getegid() == 0:
            fail("still privileged after setuid")
    # Set after setuid, which clears it. The launcher holds the write end of `alive_fd` open for
    # as long as it lives: EOF here means it died before the signal was armed.
    check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    os.set_blocking(alive_fd, False)
    try:
        if os.read(alive_fd, 1) == b"":
            os._exit(SETUP_FAILED)
    except BlockingIOError:
        pass
    os.close(alive_fd)
    check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    abi = landlock(job)
    seccomp_filter()
    os.chdir(workdir)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "DAYZERO_SANDBOX_LANDLOCK_ABI": str(abi),
    }
    argv = [job["python"], "-I", "-B", os.path.join(workdir, "main.py")]
    try:
        os.execve(job["python"], argv, env)
    except OSError as exc:
        fail(f"exec {job['python']} failed: {exc}")


def main() -> None:
    global _nonce
    job = json.loads(sys.stdin.buffer.read())
    _nonce = job["nonce"]
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    euid, egid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if euid != 0:
        flags |= CLONE_NEWUSER
    check(_libc.unshare(flags), "unshare(net, mount, pid, ipc, uts)")
    if euid != 0:
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", f"{euid} {euid} 1")
        write_file("/proc/self/gid_map", f"{egid} {egid} 1")
    check(mount("none", "/", None, MS_REC | MS_PRIVATE, None), "making mounts private")

    lim = job["limits"]
    uid, gid = (job["uid"], job["gid"]) if euid == 0 else (euid, egid)
    opts = f"size={lim['disk_bytes']},nr_inodes={lim['max_files']},mode=1777"
    check(mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts), "mounting the private /tmp")
    for extra in ("/dev/shm", "/var/tmp", "/run/lock"):
        if os.path.isdir(extra):
            mount("tmpfs", extra, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,nr_inodes=64,mode=1777")
    remount_read_only(skip={"/tmp", "/dev/shm", "/var/tmp", "/run/lock"})
    workdir = "/tmp/work"
    os.mkdir(workdir, 0o700)
    for name, content in job["files"].items():
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        os.chown(path, uid, gid)
    os.chown(workdir, uid, gid)

    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            child(job, workdir, alive_r)
        except BaseException as exc:  # never fall back into the launcher's code as the child
            fail(f"sandbox child setup: {type(exc).__name__}: {exc}")
    os.close(alive_r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
