"""The `dayzero` command line.

Each command group lives in its own module exposing `register(subparsers)`; this file only
collects them, so commands are added without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

# Modules that contribute sub-commands. A module that fails to import (e.g. a GPU-only extra that
# is not installed) still fails loudly when its command is used, not at start-up of others.
COMMAND_MODULES: tuple[str, ...] = (
    "orchestrator.commands.db",
    "orchestrator.commands.runner",
    "orchestrator.commands.run",
    "orchestrator.commands.serve",
    "orchestrator.commands.ingest",
    "orchestrator.commands.relay",
    "orchestrator.commands.submit",
    "orchestrator.commands.apikey",
    "inference.commands",
    "workers.commands",
)


def version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it)."""
    try:
        return importlib.metadata.version("dayzero")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dayzero", description="Durable agent tasks on hybrid-attention LLMs."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
