"""Frozen configuration of the built-in tools: which are on, sandbox limits, the http allow-list."""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024

BUILTIN_TOOLS: tuple[str, ...] = (
    "calculator",
    "python",
    "search_documents",
    "image_info",
    "image_crop_zoom",
    "http_get",
    "workspace_read",
    "workspace_write",
)


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-run limits of the `python` sandbox (rlimits, wall clock, private disk, output caps)."""

    timeout_s: float = 10.0  # wall clock; the process group and PID namespace are killed after it
    cpu_s: int = 10  # RLIMIT_CPU
    memory_bytes: int = 512 * MiB  # RLIMIT_AS, per process
    # The whole call: resident memory of all its processes together (RLIMIT_AS bounds one process
    # only, and `nproc` of them would be allowed `nproc` times as much); past it, all are killed.
    call_memory_bytes: int = 512 * MiB
    file_size_bytes: int = 8 * MiB  # RLIMIT_FSIZE: the largest single file
    disk_bytes: int = 32 * MiB  # size of the private tmpfs holding the working directory
    max_files: int = 1024  # inodes of that tmpfs
    nproc: int = 32  # RLIMIT_NPROC for the sandbox uid
    nofile: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 64 * 1024  # per stream (stdout, stderr); the rest is counted, not kept
    max_code_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive")


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    # Interpreter run inside the jail; None picks this interpreter if the sandbox uid can execute
    # it, else /usr/bin/python3. It must be reachable by the unprivileged uid (not under /root).
    python_executable: str | None = None
    # The unprivileged identity the code runs as when the tool process is root (nobody:nogroup).
    uid: int = 65534
    gid: int = 65534
    # Refuse to run when the kernel lacks Landlock (otherwise: namespaces + uid + rlimits only).
    require_landlock: bool = False
    # Off only to exercise the fallback (namespaces, read-only mounts, uid, rlimits) in tests.
    use_landlock: bool = True
    # A cgroup v2 directory with the memory controller delegated, under which each call gets its
    # own cgroup (`memory.max`); None: this process's own cgroup. Where neither is delegated, a
    # call is bounded by its process tree's RSS (`tools.sandbox.membound` decides).
    cgroup_parent: str | None = None

    def __post_init__(self) -> None:
        if self.require_landlock and not self.use_landlock:
            raise ValueError("require_landlock needs use_landlock")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """`http_get` is registered only when `allow_hosts` is non-empty.

    `allow_hosts` entries: "example.com" (ports 80/443), "*.example.com" (any subdomain, ports
    80/443), "host:port" (that port only). IP literals are matched the same way.
    `allow_networks` lists CIDRs that may be reached although they are private or loopback
    (e.g. "127.0.0.1/32" for a sidecar). Link-local (cloud metadata), multicast, unspecified and
    reserved addresses are refused whatever the configuration says.
    """

    allow_hosts: tuple[str, ...] = ()
    allow_networks: tuple[str, ...] = ()
    timeout_s: float = 10.0  # for the whole call, redirects included
    max_bytes: int = 1 * MiB
    max_redirects: int = 5
    user_agent: str = "dayzero-http-get/0.1"
    ca_file: str | None = None  # extra CA bundle (PEM) instead of the system store


@dataclass(frozen=True, slots=True)
class WorkspaceConfig:
    max_file_bytes: int = 1 * MiB  # one write, one read
    max_total_bytes: int = 64 * MiB  # whole workspace after a write
    max_files: int = 1000
    # All of one tenant's task workspaces together (`tools.workspaces`): the tenant's quota.
    max_tenant_bytes: int = 1024 * MiB


@dataclass(frozen=True, slots=True)
class ImageConfig:
    max_pixels: int = 50_000_000  # decode refuses larger images (decompression bombs)
    max_output_side: int = 2048  # crop/zoom output is scaled down to fit
    max_zoom: float = 8.0


@dataclass(frozen=True, slots=True)
class SearchConfig:
    max_results: int = 20
    snippet_chars: int = 240
    k1: float = 1.5
    b: float = 0.75


@dataclass(frozen=True, slots=True)
class ToolsConfig:
    enabled: tuple[str, ...] = BUILTIN_TOOLS
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    images: ImageConfig = field(default_factory=ImageConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    # Leave out a tool the host cannot support (the python sandbox) instead of raising.
    skip_unavailable: bool = False
    load_entry_points: bool = True
    modules: tuple[str, ...] = ()  # extra modules exposing `dayzero_tools()`

    def __post_init__(self) -> None:
        unknown = sorted(set(self.enabled) - set(BUILTIN_TOOLS))
        if unknown:
            raise ValueError(f"unknown built-in tools {unknown}; known: {', '.join(BUILTIN_TOOLS)}")


def tools_config_from_csv(
    enabled: str | None,
    http_allow_hosts: str = "",
    modules: str = "",
    workspace_tenant_max_bytes: str | int | None = None,
) -> ToolsConfig:
    """The config that `DAYZERO_TOOLS`, `DAYZERO_HTTP_ALLOW_HOSTS`, `DAYZERO_TOOL_MODULES` and
    `DAYZERO_WORKSPACE_TENANT_MAX_BYTES` describe (comma-separated; `enabled` None = every
    built-in). The one parser of those variables: the orchestrator's `Settings` and the worker's
    environment both come here."""

    def csv(value: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in value.split(",") if v.strip())

    return ToolsConfig(
        enabled=csv(enabled) if enabled is not None else BUILTIN_TOOLS,
        http=HttpConfig(allow_hosts=csv(http_allow_hosts)),
        workspace=WorkspaceConfig(max_tenant_bytes=int(workspace_tenant_max_bytes))
        if workspace_tenant_max_bytes not in (None, "")
        else WorkspaceConfig(),
        skip_unavailable=True,
        modules=csv(modules),
    )
