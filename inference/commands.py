"""CLI commands of this package (filled in by its issue). Must not import torch at import time."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `dayzero` parser."""
