"""Moved to `core.jsonlimits` (every ingress shares it); this name stays for existing imports."""

from core.jsonlimits import DEFAULT_MAX_DEPTH, JSONTooDeep, check_depth, loads

__all__ = ["DEFAULT_MAX_DEPTH", "JSONTooDeep", "check_depth", "loads"]
