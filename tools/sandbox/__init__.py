"""Sandboxed execution of untrusted Python (see `_launcher.py` for the jail)."""

from tools.sandbox.runner import Sandbox, SandboxInfo, SandboxResult, SandboxUnavailableError

__all__ = ["Sandbox", "SandboxInfo", "SandboxResult", "SandboxUnavailableError"]
