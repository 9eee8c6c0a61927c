"""`dayzero --help` as a user reads it: `--version`, and every flag of every command explained,
with its default where it has one."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys

from orchestrator.cli import build_parser

# every command is checked, `dayzero infer serve` (whose flags live in `inference/server/cli.py`) too
OTHER_MODULES: set[tuple[str, ...]] = set()
NO_DEFAULT = (None, False, [], argparse.SUPPRESS)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_flag_has_help_and_shows_its_default():
    missing, no_default = [], []
    for path, parser in _commands(build_parser()):
        if path in OTHER_MODULES:
            continue
        text = " ".join(parser.format_help().split())
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction):
                continue
            name = "/".join(a.option_strings) or a.dest
            if not a.help:
                missing.append(f"dayzero {' '.join(path)} {name}")
            elif a.default not in NO_DEFAULT and f"default: {a.default}" not in text:
                no_default.append(f"dayzero {' '.join(path)} {name} (default {a.default!r})")
    assert missing == [], "flags without help text"
    assert no_default == [], "defaults not shown in --help"


def test_version():
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"dayzero {importlib.metadata.version('dayzero')}"
