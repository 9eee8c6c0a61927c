"""Kernel tests: the fast paths (under Triton's interpreter where no CUDA device is) vs references.

Without CUDA the kernels run in Triton's interpreter (`tests/conftest.py` turns it on).
Set `KERNEL_ERR_TABLE=path.json` to get the max abs and relative error of every comparison written
there (and a markdown table of them beside it, `path.md`).
"""

from __future__ import annotations

import importlib
import json
import os
from types import SimpleNamespace

import pytest
import torch

ERRORS: list[dict] = []


@pytest.fixture(scope="module")
def fast():
    """The fast-path modules: real GPU kernels on CUDA, Triton's interpreter elsewhere (switched on
    by `tests/conftest.py` before triton is first imported)."""
    mods = SimpleNamespace(**{
        name: importlib.import_module(f"inference.kernels.{name}.fast") for name in ("mla_decode", "mla_prefill", "dsa")
    })  # fmt: skip
    if not torch.cuda.is_available():
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(mods.mla_decode._split_kernel, InterpretedFunction):
            pytest.fail("no CUDA and triton was imported before TRITON_INTERPRET=1 was set")
    return mods


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def write_error_table() -> None:
    """Write `ERRORS` to `$KERNEL_ERR_TABLE` (JSON) and a markdown table beside it; called after
    every comparison, so a run stopped by a time limit still leaves what it measured."""
    path = os.environ.get("KERNEL_ERR_TABLE")
    if not path or not ERRORS:
        return
    with open(path, "w") as f:
        json.dump(ERRORS, f, indent=1)
    lines = ["| case | max abs err | max rel err | tol | ok |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {e['case']} | {e['max_abs_err']:.3e} | {e['rel_err']:.3e} | {e['tol']:.0e} | "
        f"{'yes' if e['passed'] else 'NO'} |"
        for e in ERRORS
    ]
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def pytest_sessionfinish(session, exitstatus) -> None:
    write_error_table()
