"""Paged-cache builders and the named relative-error check of the kernel tests."""

from __future__ import annotations

import torch
from torch import Tensor

from inference.model.cache_tensors import quantize_rows_fp8
from tests.inference.kernels.conftest import ERRORS, write_error_table


def max_abs_err(ours: Tensor, ref: Tensor) -> float:
    """max |ours - ref|."""
    return (ours.float() - ref.float()).abs().max().item() if ref.numel() else 0.0


def rel_err(ours: Tensor, ref: Tensor) -> float:
    """max |ours - ref| / max |ref| (0 when both are all zero)."""
    scale = ref.float().abs().max().item() if ref.numel() else 0.0
    diff = max_abs_err(ours, ref)
    return diff / scale if scale > 0 else diff


def assert_rel(ours: Tensor, ref: Tensor, tol: float, what: str) -> None:
    """The named comparison of these tests; tolerances are fixed per dtype, never relaxed. Each
    comparison is recorded (max abs and relative error) for the error table (`KERNEL_ERR_TABLE`)."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(ours).all(), f"{what}: non-finite output"
    err = rel_err(ours, ref)
    ERRORS.append({"case": what, "max_abs_err": max_abs_err(ours, ref), "rel_err": err, "tol": tol,
                   "passed": err <= tol})  # fmt: skip
    write_error_table()
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"


# kernel vs fp32 reference: fp32 pools use exact fp32 dots; bf16/fp8 pools round q and p to bf16
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float8_e4m3fn: 2e-2}


def paged_pool(
    lens: list[int], page: int, width: int, dim: int, dtype: torch.dtype, device, seed: int
) -> tuple[Tensor, Tensor | None, Tensor]:
    """A pool holding `len(lens)` sequences in shuffled blocks, NaN-free padding rows.

    Returns `(pool [blocks, page, dim], scales [blocks, page] or None (fp8 only), tables [N, width])`;
    table entries past a sequence's blocks point at a block filled with huge values, so a kernel
    that reads past `seq_lens` fails the comparison.
    """
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page) for n in lens]
    total = sum(need) + 1  # + the poison block
    perm = torch.randperm(total, generator=g)
    poison = int(perm[-1])
    tables = torch.full((len(lens), width), poison, dtype=torch.int32)
    at = 0
    for i, nb in enumerate(need):
        tables[i, :nb] = perm[at : at + nb]
        at += nb
    rows = torch.randn(total * page, dim, generator=torch.Generator(device).manual_seed(seed), device=device)
    rows.view(total, page, dim)[poison] = 3e4
    scales = None
    if dtype == torch.float8_e4m3fn:
        q, s = quantize_rows_fp8(rows)
        pool, scales = q.view(total, page, dim), s.view(total, page)
    else:
        pool = rows.to(dtype).view(total, page, dim)
    return pool, scales, tables.to(device)
