"""Kernel tests: the fast paths (under Triton's interpreter where no CUDA device is) vs references.

Without CUDA, `TRITON_INTERPRET=1` is set while a kernel test module runs (Triton reads it when a
kernel is decorated and again when it is called) and restored after it, so the rest of the suite
keeps the references.
Set `KERNEL_ERR_TABLE=path.json` to get the relative error of every comparison written there.
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
    """The fast-path modules: real GPU kernels on CUDA, the Triton interpreter elsewhere."""
    saved = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield SimpleNamespace(**{
            name: importlib.import_module(f"inference.kernels.{name}.fast")
            for name in ("mla_decode", "mla_prefill", "dsa")
        })  # fmt: skip
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("KERNEL_ERR_TABLE")
    if path and ERRORS:
        with open(path, "w") as f:
            json.dump(ERRORS, f, indent=1)
