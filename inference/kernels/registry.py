"""The one rule for which path of an op runs: its fast path or its fp32 PyTorch reference.

Every op family of `inference/kernels/` is registered here with what its fast path needs (a CUDA
tensor; for some a 16-bit dtype or an optional package). `select(family, device, dtype)` applies
the rule; the families' dispatchers and the model ask it (through `use_fast`, `use_fla`,
`use_grouped_moe`), never decide on their own.

`DAYZERO_KERNELS` overrides the rule for every family alike:

- `fast` (default): the fast path wherever its needs are met;
- `reference`: the references everywhere (A/B measurements, bisecting a wrong token);
- `interpret` (with `TRITON_INTERPRET=1`): our Triton paths on CPU tensors too, in Triton's
  interpreter (the whole engine with the kernels' logic on, without a GPU; slow). Paths that are
  not our Triton code (fla, `torch._grouped_mm`) still need CUDA.

Shape conditions of one family stay in its dispatcher (e.g. `moe_gemm` runs at decode sizes only):
they choose between two correct paths of the same family and are not a backend choice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

__all__ = [
    "FAMILIES",
    "MODES",
    "Family",
    "KernelModeError",
    "fla_installed",
    "grouped_mm_available",
    "kernel_mode",
    "select",
    "selection",
    "use_fast",
    "use_fla",
    "use_grouped_moe",
]

MODES = ("fast", "reference", "interpret")


class KernelModeError(ValueError):
    """`DAYZERO_KERNELS` holds an unknown value; the message lists the valid ones."""


@dataclass(frozen=True, slots=True)
class Family:
    """An op family and what its fast path needs.

    `triton`: the fast path is our Triton code (so `interpret` mode runs it on CPU tensors).
    `dtypes`: the dtypes the fast path takes (empty: any).
    `package`: an optional package the fast path needs (`fla`, or `torch._grouped_mm`).
    `fast`: False for a family that has only its reference so far.
    """

    name: str
    summary: str
    triton: bool = True
    dtypes: tuple[torch.dtype, ...] = ()
    package: str | None = None
    fast: bool = True


_16BIT = (torch.bfloat16, torch.float16)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("mla_decode", "paged MLA decode attention over the latent cache"),
        Family("mla_prefill", "varlen MLA prefill attention over the paged latent cache"),
        Family("dsa", "DSA lightning-indexer scores and top-k selection over the paged index keys"),
        Family("topk", "radix top-k of score rows"),
        Family("rmsnorm", "RMSNorm, RMSNorm with the residual add, KDA's gated output norm"),
        Family("short_conv", "the KDA short causal conv: decode step and varlen prefill"),
        Family("moe_router", "sigmoid top-k MoE routing"),
        Family("moe_dispatch", "sort of (token, expert) pairs, SwiGLU and combine of the grouped MoE"),
        Family("moe_gemm", "grouped expert GEMMs at decode sizes"),
        Family("moe_gemv", "the MoE block (routed + shared experts) at a few tokens as two GEMVs"),
        # fla's chunked kernels take their dot products in TF32: fp32 stays on the reference
        Family("kda", "KDA / GDN gated delta rule over a varlen batch", False, _16BIT, "fla"),
        Family("kda_decode", "KDA decode step, state updated in place in the pool", False, (), "fla"),
        Family(
            "moe_experts",
            "routed experts as grouped GEMMs over stacked weights (sync-free, graph-capturable)",
            False,
            (torch.bfloat16,),
            "torch._grouped_mm",
        ),
        Family("gqa", "paged grouped-query attention (Qwen3-Next full attention)", fast=False),
    )
}


def kernel_mode() -> str:
    """The `DAYZERO_KERNELS` mode (read per call: tests and A/B runs set it at run time)."""
    mode = os.environ.get("DAYZERO_KERNELS", "fast")
    if mode not in MODES:
        raise KernelModeError(f"DAYZERO_KERNELS={mode!r}: use one of {', '.join(MODES)}")
    return mode


@cache
def fla_installed() -> bool:
    """Whether flash-linear-attention's KDA kernels import (the `gpu` extra)."""
    try:
        import fla.ops.kda  # noqa: F401
    except ImportError:
        return False
    return True


def grouped_mm_available() -> bool:
    """Whether this torch has the grouped GEMM (`torch._grouped_mm`, torch >= 2.8)."""
    return hasattr(torch, "_grouped_mm")


_PACKAGES = {"fla": fla_installed, "torch._grouped_mm": grouped_mm_available}


def _decide(f: Family, mode: str, on_cuda: bool, dtype: torch.dtype) -> tuple[str, str]:
    """The rule itself: `("fast" | "reference", why)` (every entry point below goes through here)."""
    if not f.fast:
        return "reference", "no fast path yet"
    if mode == "reference":
        return "reference", "DAYZERO_KERNELS=reference"
    if not (on_cuda or (mode == "interpret" and f.triton)):
        return "reference", "not a CUDA tensor"
    if f.dtypes and dtype not in f.dtypes:
        return "reference", "the fast path does not take this dtype"
    if f.package is not None and not _PACKAGES[f.package]():
        return "reference", f"{f.package} is not available"
    return "fast", "its needs are met"


def selection(family: str, device: torch.device | str, dtype: torch.dtype) -> tuple[str, str]:
    """`("fast" | "reference", why)` for an op of `family` on a tensor of this device and dtype."""
    return _decide(FAMILIES[family], kernel_mode(), torch.device(device).type == "cuda", dtype)


def select(family: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """`"fast"` or `"reference"`: which path of `family` runs on such a tensor."""
    return selection(family, device, dtype)[0]


def use_fast(t: Tensor, family: str = "mla_decode") -> bool:
    """Whether a Triton family's op on `t` runs its fast path (the families' own dispatchers ask this;
    every Triton family has the same needs, so the default family stands for all of them)."""
    return _decide(FAMILIES[family], kernel_mode(), t.is_cuda, t.dtype)[0] == "fast"


def use_fla(t: Tensor, family: str = "kda") -> bool:
    """Whether the KDA / GDN delta rule on `t` runs fla's kernels (`kda`: the varlen rule;
    `kda_decode`: the in-place decode step)."""
    return _decide(FAMILIES[family], kernel_mode(), t.is_cuda, t.dtype)[0] == "fast"


def use_grouped_moe(t: Tensor) -> bool:
    """Whether the routed experts on `t` run as grouped GEMMs (else the per-expert reference loop)."""
    return _decide(FAMILIES["moe_experts"], kernel_mode(), t.is_cuda, t.dtype)[0] == "fast"
