"""`python`: run a Python program in the sandbox and return its exit status and bounded output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.base import InvalidArgumentsError, RetryPolicy, ToolContext, ToolResult, ToolSpec
from tools.config import SandboxConfig, SandboxLimits
from tools.sandbox import Sandbox


class PythonTool:
    """Each call is a fresh jail: nothing persists between calls, so a retry is harmless."""

    def __init__(self, config: SandboxConfig | None = None, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox or Sandbox(config)
        lim = self.sandbox.config.limits
        self.spec = ToolSpec(
            name="python",
            description=(
                "Run a Python 3 program (standard library only) in an isolated sandbox and return its "
                "exit code, stdout and stderr. No network, no access to files outside a private "
                f"temporary directory (deleted afterwards), at most {lim.timeout_s:g} s wall clock, "
                f"{lim.call_memory_bytes // 2**20} MiB of memory in all, files up to {lim.file_size_bytes // 2**20} MiB; "
                f"output beyond {lim.max_output_bytes // 1024} KiB per stream is cut. Print what you need."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "code": {"type": "string", "minLength": 1, "maxLength": lim.max_code_bytes},
                    "timeout_s": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "maximum": lim.timeout_s,
                        "description": f"wall-clock limit, at most {lim.timeout_s:g} s",
                    },
                },
                "required": ["code"],
                "additionalProperties": False,
            },
            result_schema={
                "type": "object",
                "properties": {
                    "exit_code": {"type": ["integer", "null"]},
                    "signal": {"type": ["string", "null"]},
                    "timed_out": {"type": "boolean"},
                    "stdout": {"type": "string"},
                    "stderr": {"type": "string"},
                    "stdout_truncated": {"type": "boolean"},
                    "stderr_truncated": {"type": "boolean"},
                    "duration_s": {"type": "number"},
                    "memory_exceeded": {"type": "boolean"},
                },
                "required": ["exit_code", "timed_out", "stdout", "stderr"],
            },
            # The program runs in a throw-away jail with no network: re-running it has no outside
            # effect, so it is idempotent. A timeout is the program's own doing: do not retry it.
            retry=RetryPolicy(max_attempts=2, timeout_s=lim.timeout_s + 15.0, retry_on_timeout=False),
            idempotent=True,
            resources=("cpu", "memory", "sandbox"),
            max_argument_bytes=2 * lim.max_code_bytes + 1024,  # JSON escaping can double the code
        )

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        code = arguments["code"]
        lim = self.sandbox.config.limits
        if len(code.encode()) > lim.max_code_bytes:
            raise InvalidArgumentsError(f"code is larger than {lim.max_code_bytes} bytes")
        timeout = min(float(arguments.get("timeout_s", lim.timeout_s)), lim.timeout_s)
        if context.deadline_s is not None:  # leave the runner a moment to record the result
            timeout = max(0.5, min(timeout, context.deadline_s - 1.0))
        limits = SandboxLimits(**{**_as_dict(lim), "timeout_s": timeout})
        res = self.sandbox.run(code, limits=limits)
        return ToolResult(
            content={
                "exit_code": res.exit_code,
                "signal": res.signal,
                "timed_out": res.timed_out,
                "stdout": res.stdout,
                "stderr": res.stderr,
                "stdout_truncated": res.stdout_truncated,
                "stderr_truncated": res.stderr_truncated,
                "duration_s": res.duration_s,
                "memory_exceeded": res.memory_exceeded,
            }
        )


def _as_dict(lim: SandboxLimits) -> dict[str, Any]:
    return {name: getattr(lim, name) for name in lim.__slots__}
